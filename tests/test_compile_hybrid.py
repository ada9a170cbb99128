"""Compiled hybrid (Qwen3.5-style) targets: `specc compile` of a tiny random checkpoint with a
PARD drafter writes an artifact whose token forcing passes on CPU (chain and tree); `specc.load`
runs it, and its device loop over the compiled steps gives the eager loop's, stock's and HF's
greedy tokens, with the GDN state recorded in the manifest as snapshot kinds."""

from __future__ import annotations

import pytest
from helpers import hf_greedy, hf_model
from hybrid_factory import bigram_drafter, make_hybrid
from model_factory import save

import specc
from specc.compiler import compile_artifact
from specc.pairing import resolve_pair
from specc.runtime.eager import build_eager
from specc.stock import generate_pard
from specc.stock.runner import load_hf_causal_lm

PROMPT = [5, 17, 33, 2, 61, 40, 8]
NEW = 14
K = 4


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    target = make_hybrid("qwen3_5", 0)
    return {"target": save(target, tmp_path_factory, "chy"),
            "pard": save(bigram_drafter(target), tmp_path_factory, "chy-pard", {"pard_token": 3})}


@pytest.fixture(scope="module")
def reference(paths):
    """(HF greedy, stock PARD, specc eager loop) tokens."""
    hf = hf_model(paths["target"])
    greedy = hf_greedy(hf, PROMPT, NEW, hf.config.eos_token_id)
    stock = generate_pard(load_hf_causal_lm(paths["target"]), load_hf_causal_lm(paths["pard"]), 3, PROMPT, NEW, K,
                          (hf.config.eos_token_id,)).tokens
    eager = build_eager(resolve_pair(paths["target"], paths["pard"], "pard"), K, max_len=64).generate(
        PROMPT, NEW, (hf.config.eos_token_id,)).tokens
    return greedy, stock, eager


@pytest.mark.parametrize("tree", ["off", 6])
def test_compiled_hybrid_forces_and_generates(paths, reference, tmp_path, tree):
    out = tmp_path / "hy.specc"
    result = compile_artifact(paths["target"], paths["pard"], out=out, deployment="cpu", passes=None,
                              num_draft=K, max_new_tokens=12, tree=tree, memory=False)
    manifest = result.manifest
    assert manifest["verification"]["passed"]
    caches = manifest["steps"]["target"]["caches"]
    kinds = sorted({entry["kind"] for entry in caches.values()})
    assert kinds == ["conv", "kv", "recurrent"]
    block = max(K, 0 if tree == "off" else tree) + 1
    assert all(e["extra_len"] == block + 1 for e in caches.values() if e["kind"] != "kv")
    lowered = manifest["lowering"]["target"]
    assert {"conv_step", "delta_rule_step"} <= set(lowered["lowered"]) and not lowered["eager"]
    assert ("target_tree" in manifest["steps"]) == (tree != "off")
    engine = specc.load(out, warmup=False)
    got = engine.generate(PROMPT, NEW).tokens
    greedy, stock, eager = reference
    assert got == greedy == stock == eager
    # two rows at once (one batch, each row its own GDN state and commits): each row's own tokens
    other = PROMPT[::-1]
    alone = engine.generate(other, NEW).tokens
    rows = engine.loop.generate_batch([PROMPT, other], NEW, (engine.manifest["model"]["eos_token_ids"][0],))
    assert [r.tokens for r in rows] == [got, alone]
