"""attention with the tree mask as bit words (tree_words): equal to the reference attention for
trees of many shapes and sizes (Q = 1..130), every tile width, splits and batch rows with
different trees; the byte mask and the words give the same result; the format switch."""

from __future__ import annotations

import pytest
import torch
from helpers import ancestor_mask

from specc.codegen.kernels import attention as A
from specc.codegen.kernels.tree_mask import pack_tree_mask


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _tree(shape: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if shape == "chain":  # deepest tree: the causal mask
        parents = [i - 1 for i in range(n)]
    elif shape == "star":  # widest: every node a child of the root
        parents = [-1] + [0] * (n - 1)
    else:  # random: each node's parent any earlier node
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return ancestor_mask(parents)


def _setup(dev, bsz, num_q, hq, hkv, d, lens, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    s = max(lens) + num_q + 3
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(dev)  # noqa: E731
    return (mk(bsz, num_q, hq, d), mk(bsz + 1, hkv, s, d), mk(bsz + 1, hkv, s, d),
            torch.tensor(lens, device=dev))


CASES = [
    # Q, shapes per batch row, committed lengths, splits, block_n
    (1, ["chain"], [9], 1, None),
    (2, ["star", "chain"], [0, 40], 2, None),
    (7, ["random", "star"], [70, 3], 3, 16),
    (17, ["random"], [50], None, 32),
    (32, ["chain", "random"], [1, 64], 4, None),
    (33, ["random", "star"], [100, 31], 5, 16),
    (64, ["random"], [0], 1, None),
    (65, ["star", "random"], [129, 6], 6, None),
    (100, ["random", "chain"], [20, 77], 2, 128),
    (130, ["random", "star"], [5, 60], 2, 32),
]


@pytest.mark.parametrize("case", CASES, ids=[f"q{c[0]}-{'-'.join(c[1])}" for c in CASES])
def test_tree_words_vs_reference(dev, case):
    num_q, shapes, lens, splits, block_n = case
    bsz = len(shapes)
    q, ck, cv, cl = _setup(dev, bsz, num_q, 2, 1, 16, lens, torch.float32, seed=num_q)
    mask = torch.stack([_tree(sh, num_q, seed=i + num_q) for i, sh in enumerate(shapes)]).to(dev)
    words = pack_tree_mask(mask)
    ref = A.attention_reference(q, ck, cv, cl, num_q, "tree", 0.25, tree_mask=mask)
    out = A.attention(q, ck, cv, cl, num_q, "tree", 0.25, tree_words=words, num_splits=splits,
                      block_n=block_n)
    assert _rel(out, ref) < 2e-6
    # the reference reads the words as the mask; the byte mask path agrees (small Q: time)
    if num_q <= 33:
        out_b = A.attention(q, ck, cv, cl, num_q, "tree", 0.25, tree_mask=mask, num_splits=splits,
                            block_n=block_n)
        assert _rel(out_b, ref) < 2e-6
    assert torch.equal(A.attention_reference(q, ck, cv, cl, num_q, "tree", 0.25, tree_words=words), ref)


def test_tree_words_fp16_and_new_keys_before_the_block(dev):
    """fp16, Qk > Q new keys (the block's queries are its last Q), one [Q, W] tree for all rows."""
    num_q, num_new = 40, 43
    q, ck, cv, cl = _setup(dev, 2, num_q, 8, 2, 32, [10, 90], torch.float16, seed=3)
    mask = _tree("random", num_q, seed=5).to(dev)
    ref = A.attention_reference(q, ck, cv, cl, num_new, "tree", 0.2, tree_mask=mask)
    out = A.attention(q, ck, cv, cl, num_new, "tree", 0.2, tree_words=pack_tree_mask(mask), num_splits=3)
    assert out.dtype == torch.float16
    assert _rel(out, ref) < (1e-3 if dev == "cpu" else 1e-2)


def test_chain_tree_words_equal_causal(dev):
    num_q = 36
    q, ck, cv, cl = _setup(dev, 1, num_q, 4, 4, 16, [45], torch.float32, seed=7)
    words = pack_tree_mask(_tree("chain", num_q, 0).to(dev))
    out = A.attention(q, ck, cv, cl, num_q, "tree", 0.3, tree_words=words, num_splits=2)
    causal = A.attention(q, ck, cv, cl, num_q, "causal", 0.3, num_splits=2)
    assert _rel(out, causal) < 2e-6


def test_format_switch_and_bad_words(dev):
    num_q = 5
    q, ck, cv, cl = _setup(dev, 1, num_q, 2, 1, 16, [4], torch.float32, seed=9)
    mask = _tree("random", num_q, 1).to(dev)
    ref = A.attention_reference(q, ck, cv, cl, num_q, "tree", 0.25, tree_mask=mask)
    # with both given the switch picks the one read: a wrong byte mask shows which one that is
    wrong = torch.ones_like(mask)
    prev = A.set_tree_mask_format("bytes")
    try:
        bytes_out = A.attention(q, ck, cv, cl, num_q, "tree", 0.25, tree_mask=wrong,
                                tree_words=pack_tree_mask(mask))
    finally:
        A.set_tree_mask_format(prev)
    words_out = A.attention(q, ck, cv, cl, num_q, "tree", 0.25, tree_mask=wrong,
                            tree_words=pack_tree_mask(mask))
    assert _rel(words_out, ref) < 2e-6 and _rel(bytes_out, ref) > 1e-3
    with pytest.raises(ValueError, match="tree mask format"):
        A.set_tree_mask_format("bits")
    with pytest.raises(ValueError, match="tree_words"):
        A.attention(q, ck, cv, cl, num_q, "tree", 0.25, tree_words=torch.zeros(num_q, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="tree_words"):
        A.attention(q, ck, cv, cl, num_q, "causal", 0.25, tree_words=pack_tree_mask(mask))
