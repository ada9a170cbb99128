"""Prefix sums along a vocabulary row, split into chunks so no scan walks a whole row.

Why: sampling needs cumulative sums over the vocabulary (top-p's cumulative probability, the
inverse-CDF draw of ``specc.sampling.rng``). torch's CUDA cumsum along the last dimension of a
tensor with more than one row walks each row in sequential 32-element steps, so its time grows
with the row's length whatever the number of rows: at a 151936-token vocabulary every such
cumsum of a step cost about as much as the whole verify forward (``examples/
bench_sampling_ops.py``). Viewing a row as ``C`` chunks of ``L`` turns one long scan into
``C`` short ones plus one scan over the ``C`` chunk totals: every scan is short, and the work
spreads over ``C`` times more thread blocks.

:func:`chunk_layout` picks ``L`` (a power of two dividing the row, so the view needs no copy
where it can); :func:`cumsum` is the two-level inclusive scan, in float64 (the callers keep
their sums in float64; see each caller for why the association order does not matter there).
"""

from __future__ import annotations

import torch

__all__ = ["chunk_layout", "chunks", "cumsum"]

_MAX_CHUNK = 1024  # longest chunk scanned in one row
_PADDED_CHUNK = 256  # chunk length when the row has no power-of-two divisor of at least _MIN_CHUNK
_MIN_CHUNK = 64


def chunk_layout(length: int) -> tuple[int, int]:
    """(chunk length L, padded row length C * L) for a row of ``length``: one chunk up to 1024,
    else the largest power of two <= 1024 dividing ``length`` (no padding), or 256 with zero
    padding when that is < 64."""
    if length <= _MAX_CHUNK:
        return max(length, 1), max(length, 1)  # a short row: one chunk
    size = min(length & -length, _MAX_CHUNK)  # the largest power of two dividing length
    if size < _MIN_CHUNK:
        size = _PADDED_CHUNK
    return size, -(-length // size) * size


def chunks(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., V] viewed (zero-padded when V needs it) as [..., C, L]."""
    length = x.shape[-1]
    size, padded = chunk_layout(length)
    if padded != length:
        x = torch.nn.functional.pad(x, (0, padded - length))
    return x.reshape(*x.shape[:-1], padded // size, size)


def cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sums of ``x`` [..., V] along the last dim, as float64: each chunk's own
    prefix sums plus the sum of the chunks before it (the chunk totals' exclusive prefix)."""
    length = x.shape[-1]
    local = chunks(x.double()).cumsum(-1)  # [..., C, L]
    totals = local[..., -1]
    before = torch.nn.functional.pad(totals[..., :-1].cumsum(-1), (1, 0))  # exclusive: 0 first
    out = (local + before[..., None]).flatten(-2)
    return out[..., :length] if out.shape[-1] != length else out
