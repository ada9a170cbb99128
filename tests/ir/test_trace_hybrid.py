"""Hybrid (gated DeltaNet + gated attention) targets in the IR: the GDN layers trace into their
leaf ops with the state buffers carrying their StateSpec (kinds recurrent / conv), every step
lints, the traced GraphModule equals the model's forward exactly (outputs and every state
buffer), the default pass pipeline leaves the GDN ops alone, and real shapes trace on meta."""

from __future__ import annotations

import pytest
import torch
from hybrid_factory import random_hybrid_lm

from specc.codegen.build import run_passes
from specc.ir import evaluate, meta_model, trace
from specc.passes.pipelines import DEFAULT_PIPELINE

GDN_KINDS = ("gdn_conv", "gdn_gates", "gated_delta_rule", "gated_rms_norm", "offset_rms_norm")


def _model(max_block=8, batch=2):
    model = random_hybrid_lm()
    model.setup_caches(batch, 64, max_block=max_block)
    return model


def _kinds(ir):
    return [ir.meta(n).kind for n in ir.graph.nodes]


@pytest.mark.parametrize("step", ["verify", "ar", "tree_verify"])
def test_steps_trace_and_lint(step):
    model = _model()
    ir = trace(model, step)
    ir.lint()
    kinds = _kinds(ir)
    gdn_layers = len(model.config.linear_layers)
    for kind in ("gdn_conv", "gated_delta_rule", "gdn_gates", "gated_rms_norm"):
        assert kinds.count(kind) == gdn_layers, kind
    assert ("tree_parents" in kinds) == (step == "tree_verify")
    specs = {n.target: n.meta["state"] for n in ir.graph.nodes if "state" in n.meta}
    by_kind = sorted(s.kind for s in specs.values())
    assert by_kind.count("recurrent") == by_kind.count("conv") == gdn_layers
    assert all(ir.meta(n).kind == "kv_cache" for n in ir.graph.nodes if "state" in n.meta)
    rec = next(s for s in specs.values() if s.kind == "recurrent")
    assert rec.dtype == "float32" and rec.extra_len == 9  # max_block + 1


def test_state_traffic_is_cache_bytes():
    """A GDN layer's rule charges reading the live state and writing Q + 2 entries (chain)."""
    model = _model()
    ir = trace(model, "verify")
    node = next(n for n in ir.graph.nodes if ir.meta(n).kind == "gated_delta_rule")
    m = ir.meta(node)
    cfg = model.config
    entry = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    assert evaluate(m.cache_read, {"B": 1, "Q": 8, "C": 5}) == entry
    assert evaluate(m.cache_written, {"B": 1, "Q": 8, "C": 5}) == entry * 10
    tree = trace(model, "tree_verify")
    tnode = next(n for n in tree.graph.nodes if tree.meta(n).kind == "gated_delta_rule")
    assert evaluate(tree.meta(tnode).cache_written, {"B": 1, "Q": 8, "C": 5}) == entry * 9


STATE_SUFFIXES = ("_state", "cache_k", "cache_v")


def _snapshot(model):
    return {k: v.clone() for k, v in model.named_buffers() if k.endswith(STATE_SUFFIXES)}


def _zero(model):
    for name, buf in model.named_buffers():
        if name.endswith(STATE_SUFFIXES):
            buf.zero_()


@pytest.mark.parametrize("pipeline", ["", DEFAULT_PIPELINE])
def test_traced_steps_equal_the_model(pipeline):
    """prefill (longer than max_block: the chunked path), a chain verify, then a tree verify:
    the GraphModule (with or without the default passes) gives the model's logits and state."""
    model = _model(max_block=4)
    irs = {step: trace(model, step) for step in ("verify", "tree_verify")}
    for ir in irs.values():
        if pipeline:
            run_passes(ir, pipeline, check=True, lint=True)
    g = torch.Generator().manual_seed(3)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (2, 7), generator=g)
    block = torch.randint(0, vocab, (2, 4), generator=g)
    tree_ids = torch.randint(0, vocab, (2, 4), generator=g)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    depth = torch.tensor([0, 1, 1, 2])
    steps = [("verify", (prompt, torch.arange(7)[None].expand(2, -1), torch.tensor([0, 0]))),
             ("verify", (block, 7 + torch.arange(4)[None].expand(2, -1), torch.tensor([7, 7]))),
             ("tree_verify", (tree_ids, (11 + depth)[None].expand(2, -1), torch.tensor([11, 11]),
                              mask[None].expand(2, -1, -1)))]
    results = []
    for runner in ("model", "ir"):
        _zero(model)
        outs = []
        with torch.no_grad():
            for step, inputs in steps:
                fn = model if runner == "model" else irs[step]
                outs.append(fn(*inputs))
        results.append((outs, _snapshot(model)))
    (m_outs, m_state), (i_outs, i_state) = results
    tol = dict(rtol=1e-5, atol=1e-5) if pipeline else dict(rtol=0, atol=0)  # fused weights sum in another order
    for a, b in zip(m_outs, i_outs):
        torch.testing.assert_close(b, a, **tol)
    for name in m_state:
        torch.testing.assert_close(i_state[name], m_state[name], rtol=1e-5, atol=1e-5)


def test_real_shapes_trace_on_meta():
    """A Qwen3.5-shaped config (transformers' defaults) traces without weights."""
    from transformers import Qwen3_5TextConfig

    loaded = meta_model(Qwen3_5TextConfig().to_dict(), dtype="bfloat16")
    ir = trace(loaded.model, "verify")
    ir.lint()
    totals = ir.totals().evaluate({"B": 1, "Q": 16, "C": 1024})
    assert totals["weight_bytes"] > 1e9 and totals["cache_written"] > 0
    assert set(GDN_KINDS) <= set(_kinds(ir))
