"""The one-launch tree beam against the torch loop, and build_tree through it."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import tree_beam as T


def _ranks(bsz, depth, vocab, k, dev, seed):
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.randn(bsz, depth, vocab, generator=gen) * 3).log_softmax(-1)
    top_lp, top_tok = lp.topk(k, dim=-1)
    return top_lp.to(dev), top_tok.to(dev)


@pytest.mark.parametrize("bsz,depth,k,width", [(1, 15, 32, 32), (2, 5, 8, 8), (3, 4, 16, 7), (2, 3, 10, 3)])
def test_tree_beam_equals_torch_loop(dev, bsz, depth, k, width):
    top_lp, top_tok = _ranks(bsz, depth, 200, k, dev, seed=depth * 100 + width)
    got = T.tree_beam(top_lp, top_tok, width, opt_in=False)
    want = T.tree_beam_reference(top_lp, top_tok, width)
    for g, w, name in zip(got, want, ("score", "token", "parent")):
        assert torch.equal(g, w), name


def test_candidate_pairs_cover_every_possible_winner():
    """Only pairs with (i + 1)(j + 1) <= W are scored: exactly those, padded with -1."""
    ii, jj = T._pairs_cpu(12, 20)
    real = ii >= 0
    pairs = set(zip(ii[real].tolist(), jj[real].tolist()))
    assert pairs == {(i, j) for i in range(12) for j in range(20) if (i + 1) * (j + 1) <= 12}
    assert ii.numel() & (ii.numel() - 1) == 0 and (jj[~real] == -1).all()


def test_tree_beam_rejects_a_width_over_the_ranks():
    top_lp, top_tok = _ranks(1, 2, 50, 4, "cpu", 0)
    with pytest.raises(ValueError, match="width"):
        T.tree_beam(top_lp, top_tok, 5, opt_in=False)


def test_build_tree_through_the_kernel_equals_the_widening_loop(dev, monkeypatch):
    """build_tree takes the kernel when the vocabulary is at least the budget (on CPU: opted in
    with SPECC_KERNELS=triton); the result equals the general loop's (run here on the same ranks by
    forcing that path)."""
    from specc.runtime import trees

    monkeypatch.setenv("SPECC_KERNELS", "triton")

    gen = torch.Generator().manual_seed(7)
    lp = (torch.randn(2, 6, 300, generator=gen) * 3).log_softmax(-1).to(dev)
    root = torch.tensor([5, 9], device=dev)
    fast = trees.build_tree(lp, root, 16)
    original = trees.tree_beam
    try:
        trees.tree_beam = lambda top_lp, top_tok, w: T.tree_beam_reference(top_lp, top_tok, w)
        slow = trees.build_tree(lp, root, 16)
    finally:
        trees.tree_beam = original
    for name in ("tokens", "parents", "depths", "scores"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
