"""Counter-based random numbers for sampling: a pure function of (seed, position, draw).

Why not ``torch.Generator``: a generator is state that advances with every call, so a request's
numbers would depend on how many rows share its batch, on how many drafts earlier steps made and
on the order of kernel launches; and its state must be threaded through CUDA-graph capture. Here
every uniform is computed with integer tensor ops from

- ``seed``: the request's seed (one per batch row),
- ``position``: the absolute index in the row's sequence of the token being decided,
- ``draw``: which use at that position (:data:`DRAFT`, :data:`ACCEPT`, :data:`TARGET`),

so a request's tokens depend only on its seed and its inputs: the same alone or in any batch,
and replayable in a CUDA graph (no state, no host sync). Each absolute position's token is
decided in exactly one verification step, so every draw that influences the output is used once.

The mixer is the 32-bit "lowbias32" integer hash (Chris Wellons' hash-prospector) applied over
the three words; every product stays below 2**63, so int64 arithmetic never overflows. The
uniform takes the top 24 bits: exact in float32, in [0, 1).
"""

from __future__ import annotations

import torch

from specc.sampling import scan

__all__ = ["DRAFT", "ACCEPT", "TARGET", "uniform", "sample"]

DRAFT, ACCEPT, TARGET = 0, 1, 2  # draws: a drafter's sample, an acceptance test, a sample from the target

_MASK = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x046CA68B  # odd multipliers below 2**31: products of 32-bit words fit in int64


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK
    x = x ^ (x >> 16)
    return x


def uniform(seed: torch.Tensor, position: torch.Tensor, draw: int) -> torch.Tensor:
    """Uniforms in [0, 1) (float32), one per element of ``position`` (int64, any shape whose
    first dim is the batch); ``seed`` [B] int64. A function of its arguments only."""
    seed = seed.reshape(seed.shape[0], *([1] * (position.dim() - 1)))
    lo, hi = seed & _MASK, (seed >> 32) & _MASK
    x = _mix(lo ^ 0x9E3779B9)
    x = _mix(x ^ hi)
    x = _mix(x ^ (position & _MASK))
    x = _mix(x + (draw * 0x632BE5AB + 0x5BD1E995))
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from ``probs`` [..., V] (need not be normalised) with uniforms ``u``
    [...]: the first token whose cumulative mass exceeds u * total. Tokens of mass 0 are never
    drawn.

    In exact arithmetic, with no scan over a whole row. Each row's masses are rounded to whole
    numbers of 2**-52 of a power of two above the row's total (:func:`_grid`): float64 holds
    them and all their partial sums exactly (integers below 2**53), so every sum is the same in
    any order and the token depends on nothing but ``probs`` and ``u`` (not on the device, the
    kernels or the batch). The row is searched in two levels (``specc.sampling.scan``): the
    chunk where the cumulative mass passes u * total, then the token inside it. A mass below
    2**-53 of the row's total rounds to 0: such a token is never drawn (a float64 running sum
    would absorb it too)."""
    vocab = probs.shape[-1]
    blocks = scan.chunks(_grid(probs))  # [..., C, L] whole numbers
    totals = blocks.sum(-1)  # exact
    ends = totals.cumsum(-1)  # the cumulative mass at each chunk's end (exact, increasing)
    x = u.double()[..., None] * ends[..., -1:]  # [..., 1]; x < total when total > 0
    chunk = (ends <= x).sum(-1, keepdim=True).clamp(max=blocks.shape[-2] - 1)  # [..., 1]
    inside = blocks.gather(-2, chunk[..., None].expand(*chunk.shape, blocks.shape[-1]))[..., 0, :]
    before = (ends.gather(-1, chunk) - totals.gather(-1, chunk))  # mass before the chunk (exact)
    index = chunk[..., 0] * blocks.shape[-1] + (inside.cumsum(-1) + before <= x).sum(-1)
    # a row of total 0 counts every token (and the padding): its last token, as a full scan gives
    return index.clamp(max=vocab - 1)


def _grid(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` [..., V] >= 0 as float64 whole numbers: each mass times 2**(52 - e), rounded,
    where 2**e is the power of two above the row's total. The row then sums below 2**52 plus
    V / 2 (the roundings), under 2**53 for any vocabulary below 2**52. The scale is built from
    its exponent bits, so it is exactly a power of two on every device."""
    p = probs.double()
    total = p.sum(-1, keepdim=True)
    biased = (total.view(torch.int64) >> 52) & 0x7FF  # total in [2**(biased - 1023), 2**(biased - 1022))
    shift = (52 - (biased - 1022)).clamp(max=1000)  # a zero total (all masses 0): any scale
    scale = ((shift + 1023) << 52).view(torch.float64)
    return torch.round(p * scale)
