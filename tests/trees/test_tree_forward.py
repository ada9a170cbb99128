"""Tree verification forward: the target over a draft tree with its ancestor mask equals, node by
node, the target over each root path as a plain causal sequence (fp32), eager and emitted (the
generated tree-verify step, Triton kernels under the interpreter)."""

from __future__ import annotations

import os

import pytest
import torch

from specc.codegen.build import build_step
from specc.models.registry import load_model
from specc.runtime.compiled import instantiate
from specc.runtime.trees import build_tree

PROMPT = [5, 17, 33, 2, 8, 9, 41]


def _tree(vocab: int, seed: int = 0, budget: int = 9, depth: int = 4, batch: int = 2):
    gen = torch.Generator().manual_seed(seed)
    logprobs = torch.randn(batch, depth, vocab, generator=gen).mul(2).log_softmax(-1)
    return build_tree(logprobs, torch.tensor([PROMPT[-1]] * batch), budget)


def _root_paths(tree, b):
    for i in range(tree.num_nodes):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = int(tree.parents[b, node])
        yield i, list(reversed(path))


def _tree_logits(model, tree, batch, prefill_mask: bool = False):
    """Prefill the prompt (but its last token), then the tree. ``prefill_mask``: prefill through
    the tree step too, with a chain-shaped (causal) tree mask (a tree step has no other mode)."""
    plen = len(PROMPT) - 1
    model.setup_caches(batch, 64)
    prompt = torch.tensor([PROMPT[:-1]] * batch)
    lengths = torch.zeros(batch, dtype=torch.long)
    extra = (torch.ones(batch, plen, plen, dtype=torch.bool).tril(),) if prefill_mask else ()
    model(prompt, torch.arange(plen)[None].expand(batch, -1), lengths, *extra)
    lengths = lengths + plen
    return model(tree.tokens, tree.positions(lengths), lengths, tree.ancestor_mask())


@pytest.fixture(scope="module")
def target(checkpoints):
    return load_model(checkpoints["target"], dtype=torch.float32).model


@torch.no_grad()
def test_eager_tree_forward_equals_each_root_path(target):
    vocab = target.config.vocab_size
    tree = _tree(vocab)
    logits = _tree_logits(target, tree, 2)
    for b in range(2):
        for node, path in _root_paths(tree, b):
            target.setup_caches(1, 64)
            seq = PROMPT[:-1] + tree.tokens[b, path].tolist()
            ref = target(torch.tensor([seq]), torch.arange(len(seq))[None], torch.zeros(1, dtype=torch.long))
            torch.testing.assert_close(logits[b, node], ref[0, -1], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_chain_trace_has_no_tree_mask_and_tree_trace_does(target):
    from specc.ir.trace import trace

    target.setup_caches(1, 64)
    chain = trace(target, "verify")
    tree = trace(target, "tree_verify")
    assert [s.name for s in chain.inputs] == ["input_ids", "positions", "cache_len"]
    assert "tree_mask" not in [n.target for n in chain.gm.graph.nodes if n.op == "placeholder"]
    assert [n.target for n in tree.gm.graph.nodes if n.op == "placeholder"][-1] == "tree_mask"
    kinds = {chain.meta(n).attrs.get("mask_kind") for n in chain.calls("attention")}
    assert kinds == {"causal"}
    assert {tree.meta(n).attrs.get("mask_kind") for n in tree.calls("attention")} == {"tree"}
    tree.lint()


@pytest.mark.parametrize("pipeline", ["", "default"])
@torch.no_grad()
def test_emitted_tree_step_matches_eager_under_triton(target, pipeline, monkeypatch):
    from specc.passes.pipelines import DEFAULT_PIPELINE

    vocab = target.config.vocab_size
    tree = _tree(vocab, seed=1, budget=7, depth=3)
    ref = _tree_logits(target, tree, 2)
    target.setup_caches(2, 64)
    built = build_step(target, "target_tree", DEFAULT_PIPELINE if pipeline else "")
    assert built.emitted.inputs == ["input_ids", "positions", "cache_len", "tree_mask"]
    if pipeline:
        assert "rope_attention" in built.lowering["lowered"]
    step = instantiate(built.emitted)
    monkeypatch.setenv("SPECC_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    got = _tree_logits(step, tree, 2, prefill_mask=True)
    torch.testing.assert_close(got, ref, rtol=2e-4, atol=2e-4)
