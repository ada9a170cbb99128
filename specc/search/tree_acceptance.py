"""Acceptance of draft trees: a per-depth, per-rank model and the tree shape it prefers.

Greedy tree verification commits the longest root path whose every token is the target's own
argmax. With ``p[d][r]`` the probability that the target's token at depth d (1-based) is the
drafter's rank-r candidate there, given that the path up to depth d - 1 was accepted, and ranks
at different depths taken as independent (the assumption DDTree and Sequoia make), a tree T
commits on average

    E[tokens per step] = 1 + sum_{v in T, v != root} prod_{i=1..depth(v)} p[i][rank_i(v)]     (2)

tokens: node v contributes exactly when its whole path is the target's greedy continuation. A
chain is the tree whose nodes all have rank 0, and (2) becomes the chain formula (1) of
``acceptance.py`` with ``alpha_d = p[d][0]``.

Because every factor is <= 1, a node never contributes more than its parent, so the tree with the
largest (2) under a node budget is the set of the ``budget`` best paths: the same best-first
construction the runtime runs on the drafter's own distributions (``runtime.trees.build_tree``),
here on the model's ``log p``. ``TreeAcceptanceModel.best_tree(budget)`` returns that static shape
and ``expected_tokens(budget)`` its value; the cost model weighs it against the verify step's
price at ``budget + 1`` query rows.

Where p comes from: :meth:`from_rank_counts` (measured: at each step and each depth the accepted
path reached, the rank of the target's token in the drafter's distribution, or a miss beyond the
top ranks recorded), :meth:`from_chain` (a chain ``AcceptanceModel``: rank 0 only, so trees add
nothing: the honest default when ranks were never measured), or a JSON file.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

from specc.errors import UserError


@dataclasses.dataclass
class TreeAcceptanceModel:
    """``p[d - 1][r]``: P(target token at depth d is the drafter's rank r | path accepted to d - 1).

    Rows need not sum to 1 (the rest is the mass beyond the recorded ranks). Depths beyond
    ``len(p)`` reuse the last row."""

    p: list[list[float]]
    source: str = ""
    counts: list[list[int]] | None = None  # counts[d - 1][r]; the last column: misses
    reached: list[int] | None = None  # steps whose accepted path reached depth d - 1

    def __post_init__(self) -> None:
        for d, row in enumerate(self.p, 1):
            if any(x < 0 or x > 1 for x in row) or sum(row) > 1 + 1e-6:
                raise UserError(f"tree acceptance row {d} is not a sub-probability vector: {row}")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_chain(cls, chain, depth: int) -> "TreeAcceptanceModel":
        """Rank 0 only, from a chain ``AcceptanceModel`` (alpha_d = p[d][0])."""
        return cls([[float(chain.alpha(d))] for d in range(1, depth + 1)],
                   source=f"chain only ({chain.source or 'acceptance'}): ranks > 0 never measured")

    @classmethod
    def from_rank_counts(cls, counts: Sequence[Sequence[int]], source: str = "") -> "TreeAcceptanceModel":
        """``counts[d - 1]`` = [hits at rank 0, rank 1, ..., rank R - 1, misses] at depth d."""
        p, reached = [], []
        for row in counts:
            total = int(sum(row))
            reached.append(total)
            if total == 0:
                break
            p.append([c / total for c in row[:-1]])
        return cls(p, source=source, counts=[list(map(int, r)) for r in counts[: len(p)]], reached=reached[: len(p)])

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str | None = None) -> "TreeAcceptanceModel":
        if "rank_counts" in data:
            return cls.from_rank_counts(data["rank_counts"], source=source or data.get("source", ""))
        if "p" in data:
            return cls([list(map(float, r)) for r in data["p"]], source=source or data.get("source", ""))
        raise UserError("tree acceptance JSON needs 'p' (per-depth rank probabilities) or 'rank_counts'")

    @classmethod
    def from_file(cls, path: str | Path) -> "TreeAcceptanceModel":
        p = Path(path)
        try:
            return cls.from_json(json.loads(p.read_text()), source=str(p))
        except OSError as exc:
            raise UserError(f"{p}: cannot read tree acceptance file ({exc.strerror})") from exc
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}: not valid JSON ({exc})") from exc

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"p": self.p, "source": self.source}
        if self.counts is not None:
            out["rank_counts"] = self.counts
        return out

    # ------------------------------------------------------------------ evaluation

    def prob(self, depth: int, rank: int) -> float:
        if not self.p:
            return 0.0
        row = self.p[min(depth, len(self.p)) - 1]
        return row[rank] if rank < len(row) else 0.0

    def chain_expected_tokens(self, k: int) -> float:
        total, survive = 1.0, 1.0
        for d in range(1, k + 1):
            survive *= self.prob(d, 0)
            total += survive
        return total

    def best_tree(self, budget: int, max_depth: int) -> list[tuple[int, tuple[int, ...], float]]:
        """The ``budget`` most likely paths (each a tuple of ranks) up to ``max_depth``, best
        first, as (parent index in this list or -1 for the root, ranks, path probability)."""
        import heapq

        if budget < 1 or max_depth < 1:
            return []
        width = max((len(r) for r in self.p), default=0)
        heap = [(-self.prob(1, 0), (0,))] if width else []
        out: list[tuple[int, tuple[int, ...], float]] = []
        index: dict[tuple[int, ...], int] = {}
        while heap and len(out) < budget:
            neg, ranks = heapq.heappop(heap)
            if -neg <= 0:
                break
            parent = index.get(ranks[:-1], -1)
            index[ranks] = len(out)
            out.append((parent, ranks, -neg))
            d = len(ranks)
            sib = ranks[:-1] + (ranks[-1] + 1,)
            p_sib = self.prob(d, sib[-1])
            if p_sib > 0:
                prefix = -neg / self.prob(d, ranks[-1]) if self.prob(d, ranks[-1]) > 0 else 0.0
                heapq.heappush(heap, (-prefix * p_sib, sib))
            if d < max_depth and self.prob(d + 1, 0) > 0:
                heapq.heappush(heap, (neg * self.prob(d + 1, 0), ranks + (0,)))
        return out

    def expected_tokens(self, budget: int, max_depth: int) -> float:
        """Formula (2) for the best tree of ``budget`` drafted nodes."""
        return 1.0 + math.fsum(prob for _, _, prob in self.best_tree(budget, max_depth))

    def describe(self) -> str:
        rows = "; ".join(f"d{d}: " + ", ".join(f"{x:.2f}" for x in row[:4]) + (" ..." if len(row) > 4 else "")
                         for d, row in enumerate(self.p[:6], 1))
        return f"{self.source or 'tree acceptance'}: {rows}" + (" ..." if len(self.p) > 6 else "")
