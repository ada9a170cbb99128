"""The tree attention mask packed into bit words, the format the attention kernel reads.

A draft tree's ancestor mask ``[B, Q, Q]`` bool (node i sees node t) costs the attention kernel a
``[BLOCK_M, BLOCK_N]`` byte tile load per block tile. Packed, query row i is ``W = ceil(Q / 32)``
int32 words whose bit ``t % 32`` of word ``t // 32`` is set when row i sees block key t, so a block
tile of BLOCK_N keys costs one or two word loads per query row and a shift and an and per score.

The packing also applies the kernel's ``t <= i`` rule (keys after a query's own slot are never
visible: ``ops.attention_mask``), so the kernel tests the bit alone. Bits past Q are zero. Packed
once per step (a handful of elementwise torch ops, no host sync, CUDA-graph safe) and shared by
every layer of the step.
"""

from __future__ import annotations

import torch

__all__ = ["WORD_BITS", "num_words", "pack_tree_mask", "unpack_tree_mask"]

WORD_BITS = 32


def num_words(num_q: int) -> int:
    """Words per query row for a block of ``num_q`` nodes."""
    return -(-num_q // WORD_BITS)


def pack_tree_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[(B,) Q, Q]`` bool/int visibility -> ``[(B,) Q, ceil(Q / 32)]`` int32 bit words (bit
    ``t % 32`` of word ``t // 32`` of row i: row i sees block key t and ``t <= i``)."""
    if mask.dim() not in (2, 3) or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(f"pack_tree_mask: mask must be [Q, Q] or [B, Q, Q], got {tuple(mask.shape)}")
    num_q = mask.shape[-1]
    width = num_words(num_q)
    visible = torch.tril(mask if mask.dtype == torch.bool else mask != 0)  # t <= i
    pad = width * WORD_BITS - num_q
    if pad:
        visible = torch.nn.functional.pad(visible, (0, pad))
    bits = visible.reshape(*visible.shape[:-1], width, WORD_BITS).to(torch.int32)
    weights = torch.ones((), dtype=torch.int32, device=mask.device) << torch.arange(
        WORD_BITS, dtype=torch.int32, device=mask.device)
    # distinct powers of two: the int32 sum is the bitwise or (bit 31 gives the sign, no overflow)
    return (bits * weights).sum(-1, dtype=torch.int32)


def unpack_tree_mask(words: torch.Tensor, num_q: int) -> torch.Tensor:
    """Inverse of :func:`pack_tree_mask`: ``[(B,) Q, W]`` int32 words -> ``[(B,) Q, Q]`` bool."""
    if words.dtype != torch.int32 or words.dim() not in (2, 3) or tuple(words.shape[-2:]) != (
            num_q, num_words(num_q)):
        raise ValueError(f"unpack_tree_mask: words must be int32 [(B,) {num_q}, {num_words(num_q)}], "
                         f"got {words.dtype} {tuple(words.shape)}")
    shifts = torch.arange(WORD_BITS, dtype=torch.int32, device=words.device)
    bits = (words[..., None] >> shifts) & 1
    return bits.flatten(-2)[..., :num_q] != 0
