"""Counter-based random numbers for sampling: a pure function of (seed, position, draw).

Why not ``torch.Generator``: a generator is state that advances with every call, so a request's
numbers would depend on how many rows share its batch, on how many drafts earlier steps made and
on the order of kernel launches; and its state must be threaded through CUDA-graph capture. Here
every uniform is computed with integer tensor ops from

- ``seed``: the request's seed (one per batch row),
- ``position``: the absolute index in the row's sequence of the token being decided,
- ``draw``: which use at that position (:data:`DRAFT`, :data:`ACCEPT`, :data:`TARGET`),

so a request's random numbers depend only on its seed and its inputs: the same alone or in any
batch, and replayable in a CUDA graph (no state, no host sync). (Its tokens also depend on the
probabilities the numbers are compared with; on a GPU those can differ in the last bits between a
batch and a request alone: docs/sampling.md, "Not done".) Each absolute position's token is
decided in exactly one verification step, so every draw that influences the output is used once.

The mixer is the 32-bit "lowbias32" integer hash (Chris Wellons' hash-prospector) applied over
the three words; every product stays below 2**63, so int64 arithmetic never overflows. The
uniform takes the top 24 bits: exact in float32, in [0, 1).
"""

from __future__ import annotations

import torch

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
    drawn."""
    cdf = probs.double().cumsum(-1)  # float64: a 150k-token cumsum keeps its last bits
    x = u.double()[..., None] * cdf[..., -1:]
    index = (cdf <= x).sum(-1)
    nonzero = probs > 0
    last = probs.shape[-1] - 1 - nonzero.flip(-1).to(torch.int8).argmax(-1)  # the last token with mass
    return torch.minimum(index, last)
