"""DecodingState: declared by the models, allocated / committed / forked / released / bound by
the runtime; StateSpec round-trips through artifact manifests (old entries still load)."""

import pytest
import torch

from specc.models.config import model_config_from_hf
from specc.models.decoder import CausalLM
from specc.runtime.state import DecodingState, StateSpec


def _specs(extra=0):
    return [StateSpec("a.cache_k", "kv", (2, 4), None, extra), StateSpec("a.cache_v", "kv", (2, 4), "float16", extra)]


def test_allocate_shapes_dtypes_and_lengths():
    state = DecodingState(_specs(extra=3), "cpu", torch.float32).allocate(batch=2, max_len=10)
    assert state.buffers["a.cache_k"].shape == (2, 2, 13, 4) and state.buffers["a.cache_k"].dtype == torch.float32
    assert state.buffers["a.cache_v"].dtype == torch.float16
    assert state.lengths.tolist() == [0, 0] and state.lengths.dtype == torch.long
    state.allocate(3, 5)
    assert state.buffers["a.cache_k"].shape == (3, 2, 8, 4) and state.lengths.tolist() == [0, 0, 0]


def test_chain_commit_is_a_length_update():
    state = DecodingState(_specs(), "cpu").allocate(2, 8)
    state.buffers["a.cache_k"].normal_()
    before = state.buffers["a.cache_k"].clone()
    state.commit(torch.tensor([3, 1]))
    state.commit(torch.tensor([2, 0]))
    assert state.lengths.tolist() == [5, 1]
    assert torch.equal(state.buffers["a.cache_k"], before)


def test_tree_commit_compacts_the_accepted_path():
    state = DecodingState(_specs(), "cpu").allocate(2, 8)
    k = state.buffers["a.cache_k"]
    for slot in range(8):
        k[:, :, slot] = slot
    state.lengths[:] = torch.tensor([1, 2])
    # row 0 accepted block slots 0, 2, 3 (written at 1 + slot); row 1 accepted slots 0 and 1 (already in place)
    state.commit(torch.tensor([3, 2]), path=torch.tensor([[0, 2, 3], [0, 1, -1]]))
    assert state.lengths.tolist() == [4, 4]
    assert k[0, 0, :4, 0].tolist() == [0, 1, 3, 4]
    assert k[1, 0, :4, 0].tolist() == [0, 1, 2, 3]


def test_fork_and_release():
    state = DecodingState(_specs(), "cpu").allocate(3, 6)
    state.buffers["a.cache_v"][0].fill_(7)
    state.lengths[0] = 4
    state.fork(0, 2)
    assert state.lengths.tolist() == [4, 0, 4]
    assert torch.all(state.buffers["a.cache_v"][2, :, :4] == 7)
    state.release(0)
    assert state.lengths.tolist() == [0, 0, 4]


def test_narrowed_state_is_a_view_of_the_first_slots():
    """A batch bucket's state: its buffers and lengths share the allocation's storage, so what a
    step commits through it is the allocation's; slots past it are untouched."""
    state = DecodingState(_specs(), "cpu").allocate(4, 6)
    state.lengths[:] = torch.tensor([1, 2, 0, 5])
    view = state.narrowed(2)
    assert view.batch == 2 and view.buffers["a.cache_k"].shape == (2, 2, 6, 4) and state.batch == 4
    assert view.buffers["a.cache_k"].data_ptr() == state.buffers["a.cache_k"].data_ptr()
    view.commit(torch.tensor([2, 1]))
    view.buffers["a.cache_v"][1].fill_(3)
    assert state.lengths.tolist() == [3, 3, 0, 5]
    assert torch.all(state.buffers["a.cache_v"][1] == 3) and not state.buffers["a.cache_v"][2:].any()
    with pytest.raises(ValueError, match="no first 5"):
        state.narrowed(5)


def test_move_copies_rows_up_to_the_longest_and_frees_the_sources():
    state = DecodingState(_specs(), "cpu").allocate(4, 6)
    k = state.buffers["a.cache_k"]
    k[2].fill_(2)
    k[3].fill_(3)
    state.lengths[:] = torch.tensor([1, 0, 4, 2])
    state.move([2, 3], [1, 0], length=4)
    assert state.lengths.tolist() == [2, 4, 0, 0]
    assert torch.all(k[1, :, :4] == 2) and torch.all(k[0, :, :4] == 3) and not k[1, :, 4:].any()
    with pytest.raises(ValueError, match="distinct slots"):
        state.move([0], [0], length=1)


def test_bind_rows_binds_views_that_stay(checkpoints):
    """``bind_rows`` binds the first rows of a module's allocated state until changed again;
    ``state_buffers`` reads what the module holds now."""
    import json
    from pathlib import Path

    from specc.runtime.state import bind_rows, state_buffers

    model = CausalLM(model_config_from_hf(json.loads((Path(checkpoints["target"]) / "config.json").read_text())))
    model.setup_caches(4, 8)
    full = state_buffers(model)
    bind_rows(model, full, 2)
    now = state_buffers(model)
    assert set(now) == set(full) and all(now[n].shape[0] == 2 and now[n].data_ptr() == full[n].data_ptr() for n in full)
    bind_rows(model, full, 4)
    assert all(state_buffers(model)[n] is full[n] for n in full)  # every row: the allocation itself


def test_bind_sets_buffers_on_a_module_and_models_declare_their_state(checkpoints):
    import json

    from pathlib import Path

    raw = json.loads((Path(checkpoints["target"]) / "config.json").read_text())
    model = CausalLM(model_config_from_hf(raw))
    specs = model.state_specs()
    assert len(specs) == 2 * model.config.num_layers
    assert specs[0] == StateSpec("layers.0.self_attn.cache_k", "kv", (model.config.num_kv_heads, model.config.head_dim))
    state = DecodingState(specs, "cpu", torch.float32).allocate(2, 12)
    state.bind(model)
    assert model.layers[1].self_attn.cache_v is state.buffers["layers.1.self_attn.cache_v"]
    model.setup_caches(1, 9)  # a model allocates its own declared buffers; the runtime adopts them
    adopted = DecodingState.adopt(model, 1, 9)
    assert model.layers[0].self_attn.cache_k.shape[2] == 9
    assert adopted.buffers["layers.0.self_attn.cache_k"] is model.layers[0].self_attn.cache_k


def test_manifest_round_trip_and_old_entries():
    spec = StateSpec("layers_0_self_attn_cache_k", "kv", (2, 16), "bfloat16", 5)
    entry = spec.to_manifest()
    assert entry["kind"] == "kv" and entry["shape"] == [2, 16] and entry["heads"] == 2 and entry["head_dim"] == 16
    assert StateSpec.from_manifest(spec.name, entry) == spec
    old = {"heads": 2, "head_dim": 16, "dtype": "bfloat16", "extra_len": 5}  # manifests before StateSpec
    assert StateSpec.from_manifest(spec.name, old) == spec


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown state kind"):
        DecodingState([StateSpec("x", "paged_kv", (2, 4))])
