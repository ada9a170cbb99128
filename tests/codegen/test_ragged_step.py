"""The compiled ragged verify step (role ``target_ragged``): the same logits and the same cache
contents as the model definition's ragged forward (fp32, CPU), for qwen3 and llama targets; the
emitted class says ``ragged_rows``; an artifact keeps the role through save and load."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.build import ROLE_CLASS, build_step
from specc.models.registry import load_model
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.runtime.compiled import instantiate

SLOTS, CAP = 4, 48


def _target(path):
    model = load_model(path, torch.float32, with_tokenizer=False).model
    model.setup_caches(SLOTS, CAP)
    return model


def _fill(step_caches, seed=0):
    g = torch.Generator().manual_seed(seed)
    for t in step_caches:
        t.copy_(torch.randn(t.shape, generator=g))


def _cache_names(module):
    return [spec.name for spec in module.state_specs()]


def _model_caches(model):
    return [t for layer in model.layers for t in (layer.self_attn.cache_k, layer.self_attn.cache_v)]


def _block(counts, slots, lens, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    total = sum(counts)
    ids = torch.randint(0, vocab, (1, total), generator=g)
    positions = torch.cat([base + torch.arange(n) for n, base in zip(counts, lens)])[None]
    starts = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist())
    return ids, positions, torch.tensor(lens), torch.tensor(slots), starts


# (tokens per row, slots, cache lengths): a mix with an empty row and a one-token row; all slots
MIXES = [([3, 0, 1, 5], [2, 0, 3, 1], [4, 7, 0, 9]), ([2, 2, 2, 2], [0, 1, 2, 3], [10, 3, 25, 0])]


@pytest.mark.parametrize("mix", range(len(MIXES)))
def test_compiled_ragged_step_equals_definition(checkpoints, mix):
    model = _target(checkpoints["target"])
    built = build_step(model, "target_ragged", DEFAULT_PIPELINE)
    assert built.ir.step == "ragged_verify" and built.lowering["lowered"]["ragged_attention"] == model.config.num_layers
    assert "class RaggedTargetStep(CompiledStep):\n    ragged_rows = True" in built.emitted.source
    assert "row_slots" in built.emitted.inputs and "row_starts" in built.emitted.inputs
    applied = {r.name for r in built.report.records if r.changed}
    assert {"fuse_qkv", "fuse_gate_up", "fuse_norm_linear"} <= applied  # the linears fuse as in verify
    step = instantiate(built.emitted)
    assert step.ragged_rows is True
    step.setup_caches(SLOTS, CAP)
    _fill(_model_caches(model))
    for name, t in zip(_cache_names(step), _model_caches(model)):  # same committed caches
        getattr(step, name).copy_(t)
    counts, slots, lens = MIXES[mix]
    args = _block(counts, slots, lens, model.config.vocab_size, seed=mix)
    before = [t.clone() for t in _model_caches(model)]
    with torch.no_grad():
        want = model(*args[:3], row_slots=args[3], row_starts=args[4])
        got = step(*args)
    assert got.shape == want.shape == (1, sum(counts), model.config.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for name, ref, old in zip(_cache_names(step), _model_caches(model), before):
        torch.testing.assert_close(getattr(step, name), ref, rtol=1e-6, atol=1e-6)
        for r, n in enumerate(counts):  # rows without tokens: their slot is untouched
            if n == 0:
                assert torch.equal(getattr(step, name)[slots[r]], old[slots[r]])


def test_ragged_verify_is_a_causal_lm_step(checkpoints):
    from specc.ir import IRError
    from specc.ir.trace import trace

    model = _target(checkpoints["target"])
    ir = trace(model, "ragged_verify")
    assert [s.name for s in ir.inputs] == ["input_ids", "positions", "cache_len", "row_slots", "row_starts"]
    assert [str(s) for s in ir.symbols] == ["C", "T", "R"]
    assert ir.count("ragged_attention") == model.config.num_layers and not ir.count("attention")
    # dense steps keep no trace of the descriptor
    assert not trace(model, "verify").count("ragged_attention")
    with pytest.raises(IRError, match="only a CausalLM target has the ragged_verify step"):
        trace(object(), "ragged_verify")
    # the example inputs are a valid packed block: rows of T / R tokens, positions from C in each
    inputs = ir.example_inputs({"T": 6, "R": 3, "C": 5})
    assert inputs[4].tolist() == [0, 2, 4, 6] and inputs[1].tolist() == [[5, 6, 5, 6, 5, 6]]


def test_ragged_cost_grows_with_rows_and_context(checkpoints):
    """Costs from T, R and C: at the same T, more rows read more cache (R * C positions) and
    score fewer in-block keys; the dense verify of B rows of Q tokens equals R = B, T = B * Q."""
    from specc.ir import evaluate
    from specc.ir.trace import trace

    model = _target(checkpoints["target"])
    ragged, dense = trace(model, "ragged_verify").totals(), trace(model, "verify").totals()
    at = lambda e, **v: evaluate(e, v)  # noqa: E731
    assert at(ragged.cache_read, T=16, R=4, C=100) > at(ragged.cache_read, T=16, R=2, C=100)
    assert at(ragged.cache_read, T=16, R=4, C=200) > at(ragged.cache_read, T=16, R=4, C=100)
    assert at(ragged.cache_read, T=8, R=2, C=100) == at(dense.cache_read, B=2, Q=4, C=100)
    assert at(ragged.cache_written, T=8, R=2, C=100) == at(dense.cache_written, B=2, Q=4, C=100)
    assert at(ragged.weight_bytes, T=8, R=2, C=0) == at(dense.weight_bytes, B=2, Q=4, C=0)
