"""tree_mask: the ancestor mask packed into int32 bit words (the attention kernel's tree format)."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels.tree_mask import num_words, pack_tree_mask, unpack_tree_mask


@pytest.mark.parametrize("num_q", [1, 5, 31, 32, 33, 64, 65, 130])
def test_pack_roundtrip_and_bits(num_q):
    g = torch.Generator().manual_seed(num_q)
    mask = torch.rand(3, num_q, num_q, generator=g) < 0.5
    words = pack_tree_mask(mask)
    assert words.dtype == torch.int32 and words.shape == (3, num_q, num_words(num_q))
    vis = torch.tril(mask)  # keys after a query's own slot are never visible
    assert torch.equal(unpack_tree_mask(words, num_q), vis)
    # bit t % 32 of word t // 32, read one by one
    for i, t in [(num_q - 1, 0), (num_q - 1, num_q - 1), (num_q // 2, num_q // 3)]:
        bit = (int(words[1, i, t // 32]) >> (t % 32)) & 1
        assert bit == int(vis[1, i, t])
    assert torch.equal(unpack_tree_mask(pack_tree_mask(mask[0]), num_q), vis[0])  # [Q, Q]


def test_sign_bit_and_padding():
    mask = torch.ones(33, 33, dtype=torch.bool)
    words = pack_tree_mask(mask)
    assert int(words[31, 0]) == -1  # all 32 bits: the sign bit carries key 31
    assert int(words[32, 1]) == 1 and int(words[31, 1]) == 0  # bits past Q (and past i) are zero


def test_bad_shapes():
    with pytest.raises(ValueError, match="pack_tree_mask"):
        pack_tree_mask(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="unpack_tree_mask"):
        unpack_tree_mask(torch.zeros(4, 2, dtype=torch.int32), 4)
