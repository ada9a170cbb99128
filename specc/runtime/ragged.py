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
verify adds one small host -> device copy of index tensors and no device -> host sync.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

__all__ = ["PackedRows", "ragged_capable"]


def ragged_capable(step) -> bool:
    """Whether ``step`` (a model definition, a compiled step, or a wrapper forwarding attributes
    such as ``GraphedStep``) accepts the ragged row descriptor (``row_slots`` / ``row_starts``)."""
    return step is not None and bool(getattr(step, "ragged_rows", False))


@dataclasses.dataclass
class PackedRows:
    """The packed layout of the rows of a padded block ``[B, W]`` that take tokens: row ``b``
    (a cache slot) takes its first ``counts[b]`` tokens. ``row_slots`` [R] and ``row_starts``
    [R + 1] are the ragged descriptor of the R rows with a count > 0, in slot order;
    ``token_rows`` / ``token_cols`` [T] give, for each packed token, its row and column in the
    padded block."""

    batch: int
    width: int
    row_slots: torch.Tensor
    row_starts: torch.Tensor
    token_rows: torch.Tensor
    token_cols: torch.Tensor

    @classmethod
    def of(cls, counts: list[int], width: int, device) -> "PackedRows":
        """The layout for per-row token ``counts`` (each in 0..width) of a ``[len(counts), width]`` block."""
        if any(not 0 <= c <= width for c in counts):
            raise ValueError(f"row token counts {counts} must lie in 0..{width}")
        slots = [b for b, c in enumerate(counts) if c > 0]
        starts = [0, *itertools.accumulate(counts[b] for b in slots)]
        rows = [b for b in slots for _ in range(counts[b])]
        cols = [j for b in slots for j in range(counts[b])]
        # one host -> device copy for the descriptor and the token index
        flat = torch.tensor(slots + rows + cols + starts, dtype=torch.long).to(device)
        r, t = len(slots), len(rows)
        return cls(len(counts), width, flat[:r], flat[r + 2 * t:], flat[r:r + t], flat[r + t:r + 2 * t])

    @property
    def num_tokens(self) -> int:
        return self.token_rows.shape[0]

    def tokens(self, block: torch.Tensor) -> torch.Tensor:
        """``block`` [B, W] -> the packed tokens [1, T]."""
        return block[self.token_rows, self.token_cols][None]

    def positions(self, lengths: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """[1, T]: packed token (b, j) sits at sequence position ``lengths[b] + offset + j``."""
        return (lengths[self.token_rows] + offset + self.token_cols)[None]

    def cache_len(self, lengths: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """[R]: each packed row's tokens are written from ``lengths[slot] + offset`` on."""
        return lengths[self.row_slots] + offset

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """A step output [1, T, X] -> [B, W, X] in the padded block's layout (zeros elsewhere)."""
        out = packed.new_zeros(self.batch, self.width, packed.shape[-1])
        return out.index_put((self.token_rows, self.token_cols), packed[0])
