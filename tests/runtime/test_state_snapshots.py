"""Decoding-state kinds with per-node snapshots (GDN ``recurrent`` and ``conv``): layout, chain
commit, tree commit, a row committing nothing, fork."""

import torch

from specc.models.state import StateSpec
from specc.runtime.state import DecodingState

SPECS = [StateSpec("rec", "recurrent", (2, 3, 4), "float32", 5), StateSpec("conv", "conv", (6, 3), None, 5)]


def _state(batch=3):
    state = DecodingState(SPECS, dtype=torch.float64).allocate(batch, 32)
    for name, buf in state.buffers.items():  # entry e of row b holds 100 * b + e everywhere
        entries = torch.arange(buf.shape[1], dtype=buf.dtype)[None] + 100 * torch.arange(buf.shape[0], dtype=buf.dtype)[:, None]
        buf.copy_(entries.reshape(*entries.shape, *([1] * (buf.dim() - 2))).expand_as(buf))
    return state


def _live(state, name="rec"):
    return state.buffers[name][:, 0].flatten(1)[:, 0].tolist()


def test_layout_and_dtypes():
    state = DecodingState(SPECS, dtype=torch.bfloat16).allocate(2, 100)
    assert state.buffers["rec"].shape == (2, 6, 2, 3, 4) and state.buffers["rec"].dtype == torch.float32
    assert state.buffers["conv"].shape == (2, 6, 6, 3) and state.buffers["conv"].dtype == torch.bfloat16


def test_chain_commit_selects_the_state_after_the_accepted_tokens():
    state = _state()
    state.commit(torch.tensor([1, 3, 0]))  # entry 1 + a: a = 0 keeps the state before the step
    assert _live(state) == [2.0, 104.0, 201.0]
    assert _live(state, "conv") == [2.0, 104.0, 201.0]
    assert state.lengths.tolist() == [1, 3, 0]


def test_tree_commit_selects_the_paths_last_node():
    state = _state()
    path = torch.tensor([[0, 2, 3, -1], [0, -1, -1, -1], [0, 1, -1, -1]])
    state.commit(torch.tensor([3, 1, 0]), path)  # entry 2 + path[a - 1]; a = 0: entry 1
    assert _live(state) == [5.0, 102.0, 201.0]


def test_fork_copies_the_live_state():
    state = _state()
    state.fork(2, 0)
    assert _live(state) == [200.0, 100.0, 200.0]


def test_reserve_block_refuses_blocks_past_a_compiled_capacity():
    """A step whose snapshot capacity is fixed (a compiled step: no ``max_block``) refuses a
    larger verify block in one line; blocks that fit, and steps without snapshots, pass."""
    import pytest

    from specc.runtime.state import StateSpec, reserve_block

    class Fixed:
        def __init__(self, specs):
            self._specs = specs

        def state_specs(self):
            return self._specs

    step = Fixed([StateSpec("rec", "recurrent", (2, 4, 4), "float32", 9), StateSpec("k", "kv", (2, 8))])
    reserve_block(step, 8)
    with pytest.raises(ValueError, match="blocks of 9 tokens exceed the 8 per-node state entries"):
        reserve_block(step, 9)
    reserve_block(Fixed([StateSpec("k", "kv", (2, 8))]), 100)


def test_reserve_block_sizes_the_model_a_graph_wrapper_holds():
    """A model definition wrapped for CUDA graphs (``build_loop(graphs=True)``) gets its
    ``max_block`` set, not the wrapper (whose attribute would hide the model's default)."""
    from specc.runtime.graphs import GraphedStep
    from specc.runtime.state import reserve_block

    class Model:
        max_block = 16

    model = Model()
    wrapped = GraphedStep(model)
    reserve_block(wrapped, 33)
    assert model.max_block == 33 and "max_block" not in vars(wrapped)
