"""Draft-tree construction (vectorised best-first) against a heap reference, and tree acceptance
against brute force."""

from __future__ import annotations

import heapq

import pytest
import torch

from specc.runtime.trees import accept_tree, build_tree


def heap_tree(logprobs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    """DDTree's best-first heap: the `budget` best prefixes, each as a tuple of tokens."""
    depth, vocab = logprobs.shape
    lp, tok = logprobs.sort(dim=-1, descending=True)
    heap = [(-float(lp[0, 0]), (0,))]
    out = set()
    while heap and len(out) < budget:
        neg, ranks = heapq.heappop(heap)
        out.add(tuple(int(tok[i, r]) for i, r in enumerate(ranks)))
        d = len(ranks)
        if ranks[-1] + 1 < vocab:  # next sibling
            sib = ranks[:-1] + (ranks[-1] + 1,)
            heapq.heappush(heap, (neg + float(lp[d - 1, ranks[-1]]) - float(lp[d - 1, ranks[-1] + 1]), sib))
        if d < depth:  # first child
            heapq.heappush(heap, (neg - float(lp[d, 0]), ranks + (0,)))
    return out


def tree_prefixes(tree, b: int) -> set[tuple[int, ...]]:
    out = set()
    for i in range(1, tree.num_nodes):
        path, node = [], i
        while node > 0:
            path.append(int(tree.tokens[b, node]))
            node = int(tree.parents[b, node])
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("budget,depth,vocab", [(1, 4, 7), (8, 4, 7), (16, 6, 11), (32, 3, 5), (64, 15, 50)])
def test_build_tree_equals_heap(budget, depth, vocab):
    gen = torch.Generator().manual_seed(budget * 100 + depth)
    logprobs = torch.randn(3, depth, vocab, generator=gen).mul(2).log_softmax(-1)
    tree = build_tree(logprobs, torch.tensor([1, 2, 3]), budget)
    n = min(budget, sum(vocab ** d for d in range(1, depth + 1)))
    assert tree.num_nodes == n + 1
    for b in range(3):
        assert int(tree.tokens[b, 0]) == b + 1 and int(tree.parents[b, 0]) == -1
        for i in range(1, tree.num_nodes):
            p = int(tree.parents[b, i])
            assert 0 <= p < i, "parents precede children"
            assert int(tree.depths[b, i]) == int(tree.depths[b, p]) + 1
        assert tree_prefixes(tree, b) == heap_tree(logprobs[b], n)


def test_budget_larger_than_all_prefixes():
    logprobs = torch.randn(1, 2, 3).log_softmax(-1)
    tree = build_tree(logprobs, torch.tensor([0]), 100)
    assert tree.num_nodes == 1 + 3 + 9


def test_ancestor_mask_and_positions():
    logprobs = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(1)).log_softmax(-1)
    tree = build_tree(logprobs, torch.tensor([5, 5]), 10)
    mask = tree.ancestor_mask()
    for b in range(2):
        for i in range(tree.num_nodes):
            anc, node = {i}, i
            while int(tree.parents[b, node]) >= 0:
                node = int(tree.parents[b, node])
                anc.add(node)
            assert {j for j in range(tree.num_nodes) if mask[b, i, j]} == anc
    pos = tree.positions(torch.tensor([10, 20]))
    assert torch.equal(pos, torch.tensor([[10], [20]]) + tree.depths)
    # the packed words: bit j % 32 of word j // 32 of row i is mask[b, i, j] (ancestors precede)
    words = tree.ancestor_words()
    assert words.dtype == torch.int32 and words.shape == (2, tree.num_nodes, 1)
    for b in range(2):
        for i in range(tree.num_nodes):
            assert [(int(words[b, i, 0]) >> j) & 1 for j in range(tree.num_nodes)] == mask[b, i].int().tolist()


def brute_accept(tree, argmax, b):
    best = (0, [0])
    for i in range(tree.num_nodes):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = int(tree.parents[b, node])
        path.reverse()
        ok = all(int(tree.tokens[b, path[j]]) == int(argmax[b, path[j - 1]]) for j in range(1, len(path)))
        if ok and len(path) - 1 > best[0]:
            best = (len(path) - 1, path)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_accept_tree_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    logprobs = torch.randn(4, 5, 4, generator=gen).mul(3).log_softmax(-1)
    tree = build_tree(logprobs, torch.zeros(4, dtype=torch.long), 12)
    # a target whose argmax after a node is that node's best child half the time: partial acceptance
    argmax = torch.randint(0, 4, (4, tree.num_nodes), generator=gen)
    for b in range(4):
        for i in range(tree.num_nodes):
            kids = [j for j in range(tree.num_nodes) if int(tree.parents[b, j]) == i]
            if kids and torch.rand(1, generator=gen) < 0.6:
                argmax[b, i] = tree.tokens[b, kids[0]]
    accepted, path = accept_tree(tree, argmax)
    for b in range(4):
        n, want = brute_accept(tree, argmax, b)
        assert int(accepted[b]) == n
        assert path[b, : n + 1].tolist() == want
        assert (path[b, n + 1:] == -1).all()


def test_accept_tree_zero_and_full():
    logprobs = torch.tensor([[[0.0, -9.0], [0.0, -9.0], [0.0, -9.0]]])  # chain-like: token 0 best everywhere
    tree = build_tree(logprobs, torch.tensor([1]), 3)
    assert tree.tokens.tolist() == [[1, 0, 0, 0]]
    full = torch.zeros(1, 4, dtype=torch.long)
    accepted, path = accept_tree(tree, full)
    assert int(accepted[0]) == 3 and path[0].tolist() == [0, 1, 2, 3]
    none = torch.ones(1, 4, dtype=torch.long)
    accepted, path = accept_tree(tree, none)
    assert int(accepted[0]) == 0 and path[0].tolist() == [0, -1, -1, -1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_top_logprobs_equal_log_softmax_top_k(dtype):
    """``top_logprobs`` (top-k of the raw logits less the row's log-sum-exp) gives the tokens and,
    up to fp32 rounding, the values of a top-k of the fp32 log-softmax."""
    from specc.runtime.trees import top_logprobs

    logits = (torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    want_lp, want_tok = logits.float().log_softmax(-1).topk(9, dim=-1)
    got_lp, got_tok = top_logprobs(logits, 9)
    assert got_lp.dtype == torch.float32
    assert torch.equal(got_tok, want_tok)
    torch.testing.assert_close(got_lp, want_lp, rtol=0, atol=1e-5)


@pytest.mark.parametrize("budget,topk", [(7, None), (15, None), (15, 4)])
def test_plan_tree_is_build_tree_over_log_softmax(budget, topk):
    """The planner's tree (from raw logits) is ``build_tree``'s over the fp32 log-softmax."""
    from specc.runtime.trees import plan_tree

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, 64, generator=g) * 3
    root = torch.tensor([1, 2, 3])
    want = build_tree(logits.log_softmax(-1), root, budget, topk)
    tokens, parents, depths, positions, mask = plan_tree(logits, root, torch.tensor([4, 9, 0]), budget, topk)
    assert torch.equal(tokens, want.tokens) and torch.equal(parents, want.parents)
    assert torch.equal(depths, want.depths)
    assert torch.equal(positions, torch.tensor([4, 9, 0])[:, None] + want.depths)
    assert torch.equal(mask, want.ancestor_mask(6))


@pytest.mark.gpu
def test_top_logprobs_bf16_gpu_matches_fp32_log_softmax():
    """On the GPU, bf16 logits at a DFlash block's shape (15 x 151936): the top-k's values equal
    the fp32 log-softmax's top-k values; tokens agree wherever the value is not tied."""
    from specc.runtime.trees import top_logprobs

    logits = (torch.randn(1, 15, 151936, device="cuda") * 3).bfloat16()
    want_lp, want_tok = logits.float().log_softmax(-1).topk(16, dim=-1)
    got_lp, got_tok = top_logprobs(logits, 16)
    torch.testing.assert_close(got_lp, want_lp, rtol=0, atol=1e-4)
    untied = torch.ones_like(want_lp, dtype=torch.bool)
    untied[..., 1:] &= want_lp[..., 1:] != want_lp[..., :-1]
    untied[..., :-1] &= want_lp[..., :-1] != want_lp[..., 1:]
    assert torch.equal(got_tok[untied], want_tok[untied])
