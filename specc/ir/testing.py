"""Helpers for testing passes (specc's own tests, docs, and users' pass tests).

    model = random_model(tiny_config("qwen3"))           # a tiny CausalLM with random weights
    ir = trace(model, "verify")
    inputs = ir.example_inputs({"Q": 5})
    expected = run_step(model, inputs)                    # caches zeroed first
    ...rewrite ir...
    assert_same_outputs(expected, run_step(ir, inputs))   # bit-exact, else argmax + tight tolerance
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from specc.models import CausalLM, model_config_from_hf


def tiny_config(family: str = "qwen3", **overrides) -> dict[str, Any]:
    """A config.json dict of a tiny Llama or Qwen3 (2 layers, hidden 64, GQA 4/2)."""
    raw: dict[str, Any] = dict(model_type=family, vocab_size=128, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=family == "llama")
    raw.update(overrides)
    return raw


def random_model(config: dict[str, Any] | str = "qwen3", *, seed: int = 0, scale: float = 0.1,
                 max_len: int = 64) -> CausalLM:
    """A CausalLM with N(0, scale) weights (unit-variance embeddings) and caches for 1 x max_len."""
    raw = tiny_config(config) if isinstance(config, str) else config
    cfg = model_config_from_hf(raw)
    torch.manual_seed(seed)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 1.0 if "embed" in name else scale)
    model.setup_caches(1, max_len)
    return model


def _caches_of(fn) -> list[torch.Tensor]:
    if hasattr(fn, "cache_tensors"):  # an IR
        return fn.cache_tensors()
    return [b for name, b in fn.named_buffers() if name.endswith(("cache_k", "cache_v"))]


def run_step(fn, inputs: tuple, *, reset: bool = True):
    """Run a model or IR on ``inputs`` without grad, zeroing its KV caches first (``reset``)."""
    if reset:
        with torch.no_grad():
            for t in _caches_of(fn):
                t.zero_()
    with torch.no_grad():
        return fn(*inputs)


def assert_same_outputs(expected, got, *, tol: float = 1e-5, context: str = "") -> None:
    """Outputs must be bit-identical; if a BLAS computes a fused GEMM in another order, accept a
    tight relative tolerance *and* identical greedy tokens (argmax over the last dim), with a warning."""
    exp = expected if isinstance(expected, (tuple, list)) else (expected,)
    out = got if isinstance(got, (tuple, list)) else (got,)
    assert len(exp) == len(out), f"{context}: {len(out)} outputs, expected {len(exp)}"
    for i, (e, g) in enumerate(zip(exp, out)):
        assert e.shape == g.shape, f"{context}: output {i} shape {tuple(g.shape)} != {tuple(e.shape)}"
        if torch.equal(e, g):
            continue
        scale = e.abs().max().item() or 1.0
        diff = (e.float() - g.float()).abs().max().item()
        assert diff <= tol * scale, f"{context}: output {i} differs by {diff:.3g} (scale {scale:.3g})"
        if i == 0:
            assert torch.equal(e.argmax(-1), g.argmax(-1)), f"{context}: greedy tokens changed"
        warnings.warn(f"{context}: output {i} equal only within {diff:.3g} (BLAS order); greedy tokens identical")
