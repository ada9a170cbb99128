"""Packing rows of a padded verify block into one ragged (varlen) block, and unpacking its outputs.

Why: in a batched verify every row has its own number of tokens to check (its own draft length,
a cap at its budget, none at all for a free slot, or only the tail of its drafts at the second
level of two-level verification). A dense step computes ``[B, W]`` tokens whatever each row
needs; a packed step (``CausalLM.forward`` with ``row_slots`` / ``row_starts``,
``specc.models.ops.ragged_attention``) computes exactly the tokens asked for, one token axis
without padding. The verifiers, the sampling policy and the drafters keep their padded
``[B, W, ...]`` layout: :class:`PackedRows` gathers the rows' tokens out of the padded block and
scatters the step's outputs back into it (zeros where a row took no token; the verifiers never
read there because each row's draft cap stops it first).

The packing is decided on the host from per-row token counts the loop already knows (its host
mirrors of the rows' lengths and caps); the gathers and scatters run on the device, so a packed
verify adds one small host -> device copy of index tensors (queued, ``specc.runtime.uploads``) and no
device -> host sync.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from specc.runtime.uploads import upload

__all__ = ["PackedRows", "bucket_slack", "ragged_capable", "token_bucket"]


def ragged_capable(step) -> bool:
    """Whether ``step`` (a model definition, a compiled step, or a wrapper forwarding attributes
    such as ``GraphedStep``) accepts the ragged row descriptor (``row_slots`` / ``row_starts``)."""
    return step is not None and bool(getattr(step, "ragged_rows", False))


def token_bucket(tokens: int) -> int:
    """The padded token count a CUDA-graphed ragged step runs ``tokens`` packed tokens at: the
    next power of two up to 8, then the next multiple of 8 up to 64, of 32 up to 256, of 128
    beyond. Why: a graph has static shapes and a packed verify's token count changes every step;
    a few dozen buckets cover a batch of 64 rows of 16 tokens with at most 127 padding tokens
    (the cost of a bucket's padding is linear work on that many extra tokens)."""
    if tokens <= 0:
        raise ValueError(f"a packed verify of {tokens} tokens")
    if tokens <= 8:
        return 1 << (tokens - 1).bit_length()
    grain = 8 if tokens <= 64 else 32 if tokens <= 256 else 128
    return -(-tokens // grain) * grain


def bucket_slack(max_tokens: int) -> int:
    """The most padding tokens :func:`token_bucket` adds to a count of at most ``max_tokens``."""
    return max((token_bucket(t) - t for t in range(1, max(1, max_tokens) + 1)), default=0)


@dataclasses.dataclass
class PackedRows:
    """The packed layout of the rows of a padded block ``[B, W]`` that take tokens: row ``b``
    (a cache slot) takes its first ``counts[b]`` tokens. ``row_slots`` [R] and ``row_starts``
    [R + 1] are the ragged descriptor of the R rows with a count > 0, in slot order;
    ``token_rows`` / ``token_cols`` [T] give, for each packed token, its row and column in the
    padded block.

    Bucketed (``of(..., bucket=True)``, for a CUDA-graphed ragged step whose shapes must repeat):
    every slot is a row (R = B, rows with no tokens included, so the descriptor's shape is fixed),
    and the token axis is padded to :func:`token_bucket` (T) tokens. The padding tokens extend
    the last slot's row past its real tokens: the descriptor puts their K/V at cache positions
    after anything that row computes this step (the step that reaches a position writes it
    before reading it, so they are harmless, given cache room for them: :func:`bucket_slack`),
    causal attention keeps them out of every real token's output, and :meth:`unpack` drops their
    outputs. ``token_rows`` / ``token_cols`` then index the real tokens only; ``num_tokens`` is
    the padded count."""

    batch: int
    width: int
    row_slots: torch.Tensor
    row_starts: torch.Tensor
    token_rows: torch.Tensor
    token_cols: torch.Tensor
    gather_rows: torch.Tensor | None = None  # [T padded]: the block row each token (padding too) is read from
    gather_cols: torch.Tensor | None = None  # [T padded]: its block column (padding: column 0)
    offsets: torch.Tensor | None = None  # [T padded]: its position offset in its row (padding: after the row's)

    @classmethod
    def of(cls, counts: list[int], width: int, device, bucket: bool = False) -> "PackedRows":
        """The layout for per-row token ``counts`` (each in 0..width) of a ``[len(counts), width]``
        block; ``bucket``: every slot a row and the token axis padded (class doc)."""
        if any(not 0 <= c <= width for c in counts):
            raise ValueError(f"row token counts {counts} must lie in 0..{width}")
        slots = list(range(len(counts))) if bucket else [b for b, c in enumerate(counts) if c > 0]
        starts = [0, *itertools.accumulate(counts[b] for b in slots)]
        rows = [b for b in slots for _ in range(counts[b])]
        cols = [j for b in slots for j in range(counts[b])]
        r, t = len(slots), len(rows)
        if not bucket:
            # one host -> device copy for the descriptor and the token index
            flat = upload(slots + rows + cols + starts, device)
            return cls(len(counts), width, flat[:r], flat[r + 2 * t:], flat[r:r + t], flat[r + t:r + 2 * t])
        pad = token_bucket(t) - t if t else 0
        last = len(counts) - 1
        starts[-1] += pad  # the padding belongs to the last slot's row
        grows = rows + [last] * pad
        gcols = cols + [0] * pad
        offs = cols + list(range(counts[last], counts[last] + pad))
        n = t + pad
        flat = upload(slots + starts + rows + cols + grows + gcols + offs, device)
        parts = list(itertools.accumulate([r, r + 1, t, t, n, n, n]))
        cut = [flat[a:b] for a, b in zip([0, *parts[:-1]], parts)]
        return cls(len(counts), width, *cut)

    @property
    def num_tokens(self) -> int:
        """Tokens the step computes (bucketed: padding included)."""
        return (self.gather_rows if self.gather_rows is not None else self.token_rows).shape[0]

    @property
    def num_real(self) -> int:
        """Tokens the rows asked for."""
        return self.token_rows.shape[0]

    def tokens(self, block: torch.Tensor) -> torch.Tensor:
        """``block`` [B, W] -> the packed tokens [1, T]."""
        if self.gather_rows is not None:
            return block[self.gather_rows, self.gather_cols][None]
        return block[self.token_rows, self.token_cols][None]

    def positions(self, lengths: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """[1, T]: packed token (b, j) sits at sequence position ``lengths[b] + offset + j``."""
        if self.gather_rows is not None:
            return (lengths[self.gather_rows] + offset + self.offsets)[None]
        return (lengths[self.token_rows] + offset + self.token_cols)[None]

    def cache_len(self, lengths: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """[R]: each packed row's tokens are written from ``lengths[slot] + offset`` on."""
        return lengths[self.row_slots] + offset

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """A step output [1, T, X] -> [B, W, X] in the padded block's layout (zeros elsewhere;
        padding tokens' outputs dropped)."""
        out = packed.new_zeros(self.batch, self.width, packed.shape[-1])
        return out.index_put((self.token_rows, self.token_cols), packed[0, :self.num_real])
