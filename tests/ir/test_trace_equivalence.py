"""The traced GraphModule of every step equals the model's own forward exactly (torch.equal),
for Llama and Qwen3 targets, PARD / AR drafters and DFlash drafters; and the shape rules agree
with the shapes that execution produces, node by node."""

from __future__ import annotations

import pytest
import torch
import torch.fx

from specc.ir import TensorMeta, bind_dflash, evaluate, trace
from specc.models import load_model

MAX_LEN = 48


def _load(path, max_len=MAX_LEN):
    loaded = load_model(path, with_tokenizer=False)
    loaded.model.setup_caches(1, max_len)
    return loaded


def _zero(module):
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if name.endswith(("cache_k", "cache_v")):
                buf.zero_()


def _step_inputs(ids, start):
    ids = torch.tensor([ids])
    return ids, torch.arange(start, start + ids.shape[1])[None], torch.tensor([start])


def _run_sequence(fns, steps):
    """Run (fn_index, inputs) steps in order without grad; returns the outputs."""
    outs = []
    with torch.no_grad():
        for i, inputs in steps:
            outs.append(fns[i](*inputs))
    return outs


def _equal(a, b):
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


@pytest.mark.parametrize("capture", [False, True])
def test_target_prefill_verify_ar_equal_eager(checkpoints, capture):
    target = _load(checkpoints["target"]).model
    if capture:  # a DFlash target returns (logits, hidden of the captured layers)
        target.capture_layers = (0, 2, target.config.num_layers - 1)
    irs = {step: trace(target, step) for step in ("prefill", "verify", "ar")}
    for ir in irs.values():
        ir.lint()
    steps = [("prefill", _step_inputs([5, 17, 33, 2, 8, 9, 41], 0)),
             ("verify", _step_inputs([7, 1, 60, 12], 7)),
             ("ar", _step_inputs([3], 11)),
             ("verify", _step_inputs([4, 4, 9], 12))]
    _zero(target)
    eager = _run_sequence({s: target for s in irs}, steps)
    _zero(target)
    traced = _run_sequence(irs, steps)
    for (step, _), e, t in zip(steps, eager, traced):
        assert _equal(e, t), f"{step} step: traced graph differs from eager forward"
    assert isinstance(traced[0], tuple) == capture


def test_pard_draft_equal_eager(checkpoints):
    loaded = _load(checkpoints["pard_same"])
    pard, mask = loaded.model, loaded.pard_token
    ir = trace(pard, "draft")
    ir.lint()
    steps = [(0, _step_inputs([5, 17, 33, 2, 8] + [mask] * 3, 0)),  # prompt + K-1 mask slots
             (0, _step_inputs([9, 41] + [mask] * 3, 5))]              # committed since + masks
    _zero(pard)
    eager = _run_sequence([pard], steps)
    _zero(pard)
    traced = _run_sequence([ir], steps)
    assert all(torch.equal(e, t) for e, t in zip(eager, traced))


def test_ar_drafter_draft_equal_eager(checkpoints):
    drafter = _load(checkpoints["ar_random"]).model  # a different, 2-layer model
    ir = trace(drafter, "draft")
    steps = [(0, _step_inputs([5, 17, 33], 0)), (0, _step_inputs([8], 3)), (0, _step_inputs([9, 2], 4))]
    _zero(drafter)
    eager = _run_sequence([drafter], steps)
    _zero(drafter)
    traced = _run_sequence([ir], steps)
    assert all(torch.equal(e, t) for e, t in zip(eager, traced))


def test_dflash_draft_equal_eager(checkpoints):
    target = _load(checkpoints["target"]).model
    draft = load_model(checkpoints["dflash"], with_tokenizer=False).model
    draft.setup_caches(1, MAX_LEN)
    drafter = bind_dflash(target, draft)
    ir = trace(drafter, "draft")
    ir.lint()
    assert ir.model_kind == "dflash"
    spec = draft.spec
    target.capture_layers = tuple(spec.target_layer_ids)
    with torch.no_grad():
        _zero(target)
        _, ctx = target(*_step_inputs([5, 17, 33, 2, 8, 9], 0))
    b = spec.block_size
    block = lambda last: torch.tensor([[last] + [spec.mask_token_id] * (b - 1)])  # noqa: E731
    # step 1: the whole prompt's hidden states as context (C = 0, N = 6); step 2: N = 2 at C = 5
    steps = [(0, (block(8), ctx, torch.arange(0, 6 + b)[None], torch.tensor([0]))),
             (0, (block(9), ctx[:, 4:6], torch.arange(5, 7 + b)[None], torch.tensor([5])))]
    _zero(drafter)
    eager = _run_sequence([drafter], steps)
    _zero(drafter)
    traced = _run_sequence([ir], steps)
    assert all(torch.equal(e, t) for e, t in zip(eager, traced))
    assert traced[0].shape == (1, b - 1, target.config.vocab_size)


class _ShapeRecorder(torch.fx.Interpreter):
    def run_node(self, n):
        out = super().run_node(n)
        self.seen[n] = out
        return out


def _assert_shapes_match(ir, inputs, values):
    rec = _ShapeRecorder(ir.gm)
    rec.seen = {}
    with torch.no_grad():
        rec.run(*inputs)
    checked = 0
    for node, value in rec.seen.items():
        meta = ir.meta(node)
        pairs = [(meta.out, value)]
        if isinstance(meta.out, tuple) and isinstance(value, tuple):
            pairs = list(zip(meta.out, value))
        for m, v in pairs:
            if isinstance(m, TensorMeta) and isinstance(v, torch.Tensor):
                if meta.kind == "kv_cache":
                    continue
                want = tuple(int(evaluate(d, values)) for d in m.shape)
                assert want == tuple(v.shape), f"%{node.name} ({meta.kind}): IR says {want}, execution gives {tuple(v.shape)}"
                assert m.dtype == v.dtype, f"%{node.name}: IR dtype {m.dtype}, execution {v.dtype}"
                checked += 1
            elif meta.kind == "size":
                assert int(evaluate(m, values)) == v, f"%{node.name}: size {m} != {v}"
    return checked


def test_shape_rules_agree_with_execution(checkpoints):
    target = _load(checkpoints["target"]).model
    for step, values in (("prefill", {"B": 1, "Q": 7, "C": 0}), ("verify", {"B": 1, "Q": 4, "C": 7}),
                         ("ar", {"B": 1, "C": 11})):
        ir = trace(target, step)
        ir.reset_caches()
        assert _assert_shapes_match(ir, ir.example_inputs(values), values) > 20
    draft = load_model(checkpoints["dflash"], with_tokenizer=False).model
    draft.setup_caches(1, MAX_LEN)
    ir = trace(bind_dflash(target, draft), "draft")
    values = {"B": 1, "Q": draft.spec.block_size, "C": 3, "N": 2}
    ir.reset_caches()
    assert _assert_shapes_match(ir, ir.example_inputs(values), values) > 20


def test_batched_shapes_agree_with_execution():
    from specc.ir.testing import random_model

    model = random_model("llama", max_len=32)
    model.setup_caches(3, 32)
    ir = trace(model, "verify")
    values = {"B": 3, "Q": 5, "C": 4}
    assert _assert_shapes_match(ir, ir.example_inputs(values), values) > 20


def test_shapes_and_costs_at_random_sizes():
    """Property: at any B, Q, C the rules' shapes match execution and every cost is >= 0."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from specc.ir.testing import random_model

    model = random_model("qwen3", max_len=24)
    model.setup_caches(3, 24)
    ir = trace(model, "verify")
    fields = ("flops", "bytes_read", "bytes_written", "weight_bytes", "cache_read", "cache_written")

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(b=st.integers(1, 3), q=st.integers(1, 6), c=st.integers(0, 12))
    def check(b, q, c):
        values = {"B": b, "Q": q, "C": c}
        ir.reset_caches()
        assert _assert_shapes_match(ir, ir.example_inputs(values), values) > 20
        for node in ir.nodes:
            m = ir.meta(node)
            assert all(evaluate(getattr(m, f), values) >= 0 for f in fields), node.name

    check()
