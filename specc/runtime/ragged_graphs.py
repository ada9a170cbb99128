"""CUDA graphs for the ragged (packed) verify step: token-count buckets, one graph per bucket.

Why: a packed verify (per-request draft lengths, the second level of two-level verification) is
a whole target forward, hundreds of kernel launches; eager it costs milliseconds of launch
overhead per step at small batches, more than its work. Its shapes change every step (T, the
packed token count, and R, the rows taking part), which a CUDA graph cannot follow. The loop
therefore packs bucketed (``specc.runtime.ragged.PackedRows.of(..., bucket=True)``): every slot
is a row (R = B, fixed) and T is padded up to ``token_bucket(T)`` with tokens that are harmless
by construction (they extend the last slot's row past its real tokens; their outputs are
dropped). :class:`GraphedRaggedStep` then captures one graph per (bucket, batch) as
``GraphedStep`` does per shape, and replays it.

The loop sees the step's ``token_buckets`` attribute (True here) and pads; it also allocates
the cache room the padding writes into (``pad_room``). Off CUDA the wrapper runs the step
eagerly on the padded inputs, which is what the CPU tests compare with unpadded verifies.
"""

from __future__ import annotations

from specc.runtime.graphs import GraphedStep
from specc.runtime.ragged import bucket_slack

__all__ = ["GraphedRaggedStep"]


class GraphedRaggedStep(GraphedStep):
    """A ragged step (``step(ids [1, T], positions [1, T], cache_len [R], row_slots=[R],
    row_starts=[R + 1])``) whose calls are CUDA-graphed per input shape (module doc). ``pool``:
    the graph memory pool shared with the loop's other steps (None: a new one on CUDA).
    ``max_tokens``: calls with more packed tokens run eagerly."""

    ragged_rows = True
    token_buckets = True  # the loop pads packed verifies to ``token_bucket`` sizes for this step

    def __init__(self, step, max_tokens: int = 1 << 16, pool=None, warmup: int | None = None):
        super().__init__(step, max_tokens=max_tokens, warmup=warmup, pool=pool)

    def _run(self, ids, positions, cache_len, row_slots, row_starts):
        return self.step(ids, positions, cache_len, row_slots=row_slots, row_starts=row_starts)

    def __call__(self, ids, positions, cache_len, row_slots=None, row_starts=None):
        if row_slots is None or row_starts is None:
            raise TypeError("a ragged step needs row_slots and row_starts")
        return super().__call__(ids, positions, cache_len, row_slots, row_starts)

    @staticmethod
    def pad_room(max_tokens: int) -> int:
        """Cache positions past a row's block that the padding of a verify of up to
        ``max_tokens`` packed tokens may write (the loop allocates them)."""
        return bucket_slack(max_tokens)
