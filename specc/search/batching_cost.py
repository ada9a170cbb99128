"""Pricing a batched speculative step with and without the batching mechanisms (issue #19).

For B rows, k drafts per row and an acceptance model (per-position conditional acceptance
alpha_i, ``specc.search.acceptance``), three ways to verify one step are priced with the
calibrated cost model (``specc.search.batch_pricing``: dense and packed verify forwards):

- **one level**: one verify of B x (k + 1) tokens. Step = draft + verify(B, k + 1).
- **two-level, k1** (1 <= k1 < k): level 1 verifies every row's first k1 drafts (B x (k1 + 1)
  tokens); the rows that accepted all k1 (each with probability p = alpha_1 ... alpha_k1,
  independently, so their number N2 is Binomial(B, p)) continue from level 1's state in a packed
  level-2 verify of N2 x (k - k1) tokens over caches k1 + 1 tokens longer; N2 = 0 skips it.
  Step = draft + verify(B, k1 + 1) + E[T2(N2)], with T2(0) = 0 and T2(n) the packed verify of
  n rows (priced exactly at n = 1..8 and at 12, 16, 24, 32, 48, 64, ... and B, linearly
  interpolated between). A row that rejects in level 1 commits what it would have committed in
  one level, and a row that goes on commits the same as in one level, so the expected
  committed tokens are the one-level ones, B x E(k): only the time differs. k1 = k is one level.
- **per-request k** (ragged verify): each row r verifies its own k_r + 1 tokens in one packed
  forward. For a total of D drafts the expected tokens are largest when the D drafts go to the
  highest marginal gains prod_{j<=i} alpha_{r,j} (non-increasing in i, so the greedy pick keeps
  each row's drafts a prefix); D is scanned over a grid of 0..B k (every multiple of B/2, at
  least 1) and the best goodput kept. Step = draft + packed verify of the chosen counts; the
  drafter's batched forward is dense (drafters have no ragged step) and drafts the longest row's
  k for every row, as the runtime does. With one acceptance model for every row this is the
  goodput choice of one length, or two neighbouring lengths, for the batch; with a list of
  per-row models (``row_acceptance``) it prices a mixed batch.

A reference, not a mechanism the choice records: the **dense goodput k** (:meth:`BatchingPricer.dense_goodput`),
one k' <= k for every row with the dense verify, which the runtime's goodput rule already does
without ragged verify; beside per-request k it says how much of the gain is the shorter k.

tokens/s = expected committed tokens per step / step time; the AR baseline is the target's own
step at Q = 1 for B rows, as in ``CostModel.predict``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any, Sequence

from specc.search.acceptance import AcceptanceModel, expected_longest
from specc.search.batch_pricing import draft_seconds, ragged_verify
from specc.search.cost_model import CostModel, default_context

ONE_LEVEL, PER_REQUEST, GOODPUT = "one level", "per-request k", "goodput k, dense"
_EXACT_ROWS = 8  # level-2 row counts priced exactly up to here, then on a sparser grid
_NEGLIGIBLE = 1e-12  # binomial mass below this is left out of the expected level-2 time


def two_level_name(k1: int) -> str:
    return f"two-level k1={k1}"


def row_grid(batch: int) -> list[int]:
    """Row counts priced exactly: 1..8, then 12, 16, 24, 32, 48, 64, ... (x1.5 / x1.33), and ``batch``."""
    grid = list(range(1, min(batch, _EXACT_ROWS) + 1))
    n = _EXACT_ROWS
    while n < batch:
        n = n * 3 // 2 if (n & (n - 1)) == 0 else n * 4 // 3
        grid.append(min(n, batch))
    return sorted(set(grid + [batch]))


def binomial(n: int, p: float) -> list[float]:
    """P(N = i) for i = 0..n, N ~ Binomial(n, p)."""
    if p <= 0.0:
        return [1.0] + [0.0] * n
    if p >= 1.0:
        return [0.0] * n + [1.0]
    return [math.comb(n, i) * p ** i * (1.0 - p) ** (n - i) for i in range(n + 1)]


@dataclasses.dataclass
class OptionPrediction:
    """One way to verify a batched step, priced: times per step and expected tokens over all rows."""

    option: str
    batch_size: int
    num_draft: int
    expected_tokens: float  # committed per step, summed over the rows
    draft_s: float
    verify_s: float  # one level: the verify; two-level: level 1; per-request k: the packed verify
    ar_step_s: float
    two_level_k1: int | None = None
    per_request_k: bool = False
    level2_s: float = 0.0  # two-level: expected time of level 2 (0 when no row goes on)
    level2_rows: float = 0.0  # two-level: expected rows in level 2 (B x P(accept all k1))
    row_k: list[int] | None = None  # per-request k: drafts per row of the best allocation

    @property
    def step_s(self) -> float:
        return self.draft_s + self.verify_s + self.level2_s

    @property
    def tokens_per_s(self) -> float:
        return self.expected_tokens / self.step_s

    @property
    def ar_tokens_per_s(self) -> float:
        return self.batch_size / self.ar_step_s

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.ar_tokens_per_s

    def to_json(self) -> dict[str, Any]:
        out = {"option": self.option, "batch_size": self.batch_size, "num_draft": self.num_draft,
               "two_level_k1": self.two_level_k1, "per_request_k": self.per_request_k,
               "expected_tokens": self.expected_tokens, "step_s": self.step_s, "draft_s": self.draft_s,
               "verify_s": self.verify_s, "level2_s": self.level2_s, "level2_rows": self.level2_rows,
               "tokens_per_s": self.tokens_per_s, "speedup": self.speedup, "ar_step_s": self.ar_step_s}
        if self.row_k is not None:
            counts: dict[int, int] = {}
            for k in self.row_k:
                counts[k] = counts.get(k, 0) + 1
            out["row_k"] = {str(k): n for k, n in sorted(counts.items())}
        return out


class BatchingPricer:
    """Prices the options of a speculative step with ``num_draft`` drafts for one (target verify
    IR, draft IR, method) on the cost model's deployment at a context length; every forward it
    prices is cached, so pricing many batch sizes and k1 shares the work."""

    def __init__(self, cost: CostModel, target_ir, draft_ir, method, num_draft: int, context: int | None = None,
                 draft_ahead: bool | None = None):
        """``draft_ahead``: whether one-level steps draft the next step ahead of their host read
        (``DeviceSpeculativeDecoder.batch_draft_ahead``); None: as ``engine.build_loop`` sets
        it, on a CUDA-graphed deployment for a drafter that can, when ``SPECC_BATCH_DRAFT_AHEAD``
        asks for it."""
        from specc.methods import get_method
        from specc.runtime.drafters import drafts_ahead
        from specc.switches import batch_draft_ahead_enabled

        self.cost, self.target_ir, self.draft_ir = cost, target_ir, draft_ir
        self.method = get_method(method) if isinstance(method, str) else method
        if draft_ahead is None:
            draft_ahead = bool(cost.graphs and drafts_ahead(self.method.strategy) and batch_draft_ahead_enabled())
        self.draft_ahead = draft_ahead
        self.k = int(num_draft)
        if self.k < 1:
            raise ValueError("batching options need drafts (num_draft >= 1)")
        self.context = int(context if context is not None else default_context(cost.deployment))
        self._verify: dict[tuple, float] = {}
        self._draft: dict[tuple, float] = {}

    # ------------------------------------------------------------ forwards

    def verify_seconds(self, row_tokens: Sequence[int], context: int | None = None, packed: bool = False) -> float:
        """A verify of ``row_tokens`` (tokens per row) over caches of ``context`` tokens: dense
        (equal rows: the dense step) or, ``packed``, the runtime's ragged step, which pads its
        tokens to a bucket where it runs CUDA-graphed (``ragged_verify``'s ``bucket``)."""
        counts = tuple(sorted((int(q) for q in row_tokens if q > 0), reverse=True))
        bucket = bool(packed and self.cost.graphs)
        key = (counts, int(self.context if context is None else context), bucket)
        hit = self._verify.get(key)
        if hit is None:
            hit = self._verify[key] = ragged_verify(self.cost, self.target_ir, counts, key[1], bucket=bucket).time
        return hit

    def draft_seconds(self, rows: int, committed: int, k: int | None = None) -> float:
        """The drafter's forwards for ``rows`` rows drafting ``k`` (default: the step's k)."""
        key = (int(rows), int(committed), self.k if k is None else int(k))
        hit = self._draft.get(key)
        if hit is None:
            hit = self._draft[key] = draft_seconds(self.cost, self.draft_ir, self.method, rows, key[2], self.context,
                                                   committed)
        return hit

    def ar_seconds(self, rows: int) -> float:
        return self.verify_seconds([1] * rows)

    def _drafting(self, rows: int, acceptance: AcceptanceModel, k: int | None = None) -> float:
        """The batched draft of ``k`` (default: the step's) for ``rows`` rows, each fed as many new
        context entries as the row that committed most last step (its expected value)."""
        k = self.k if k is None else int(k)
        return self.draft_seconds(rows, max(1, round(acceptance.expected_max_tokens(k, rows))), k)

    def level2_seconds(self, batch: int, acceptance: AcceptanceModel, k1: int) -> tuple[float, float]:
        """(expected time, expected rows) of level 2 after a level 1 of ``k1`` drafts."""
        p = math.prod(acceptance.alphas_for(k1))
        q, context = self.k - k1, self.context + k1 + 1
        grid = row_grid(batch)
        priced = {n: self.verify_seconds([q] * n, context, packed=True) for n in grid}

        def t2(n: int) -> float:
            if n in priced:
                return priced[n]
            hi = next(g for g in grid if g > n)
            lo = max(g for g in grid if g < n)
            return priced[lo] + (priced[hi] - priced[lo]) * (n - lo) / (hi - lo)

        expected = sum(w * t2(n) for n, w in enumerate(binomial(batch, p)) if n and w > _NEGLIGIBLE)
        return expected, batch * p

    # ------------------------------------------------------------ options

    def one_level(self, batch: int, acceptance: AcceptanceModel) -> OptionPrediction:
        """One k for every row, dense. Drafting ahead (``draft_ahead``, batch > 1), the host's
        work between steps (``Deployment.spec_host_s``, priced in the verify's acceptance read)
        runs while the GPU drafts the next step, so it is hidden up to the draft's time."""
        drafting, verify = self._drafting(batch, acceptance), self.verify_seconds([self.k + 1] * batch)
        if self.draft_ahead and batch > 1:
            verify -= min(self.cost.deployment.spec_host_s, drafting)
        return OptionPrediction(ONE_LEVEL, batch, self.k, batch * acceptance.expected_tokens(self.k),
                                drafting, verify, self.ar_seconds(batch))

    def two_level(self, batch: int, acceptance: AcceptanceModel, k1: int) -> OptionPrediction:
        """Level 1 at ``k1`` drafts, level 2 the rest (k1 = k: one level, named so)."""
        k1 = int(k1)
        if not 1 <= k1 <= self.k:
            raise ValueError(f"k1 must be in 1..{self.k}, got {k1}")
        if k1 == self.k:
            return self.one_level(batch, acceptance)
        level2, rows2 = self.level2_seconds(batch, acceptance, k1)
        return OptionPrediction(two_level_name(k1), batch, self.k, batch * acceptance.expected_tokens(self.k),
                                self._drafting(batch, acceptance), self.verify_seconds([k1 + 1] * batch),
                                self.ar_seconds(batch), two_level_k1=k1, level2_s=level2, level2_rows=rows2)

    def per_request(self, batch: int, acceptance: AcceptanceModel,
                    row_acceptance: Sequence[AcceptanceModel] | None = None) -> OptionPrediction:
        """Per-row drafts (ragged verify) at the best goodput; ``row_acceptance``: one model per
        row (default: ``acceptance`` for every row)."""
        models = list(row_acceptance) if row_acceptance is not None else [acceptance] * batch
        if len(models) != batch:
            raise ValueError(f"{len(models)} row acceptance models for a batch of {batch}")
        gains = []  # (-gain, row, position): the greedy order of drafts
        for r, m in enumerate(models):
            survive = 1.0
            for i, a in enumerate(m.alphas_for(self.k), start=1):
                survive *= a
                gains.append((-survive, i, r))
        order = heapq.nsmallest(len(gains), gains)
        stride = max(1, batch // 2)
        best = None
        row_k, expected, taken = [0] * batch, float(batch), 0
        for total in sorted(set(range(0, batch * self.k + 1, stride)) | {batch * self.k}):
            while taken < total:
                gain, _, r = order[taken]
                row_k[r] += 1
                expected -= gain
                taken += 1
            longest = max(row_k)
            committed = expected_longest([(m, k) for m, k in zip(models, row_k)])
            draft = self.draft_seconds(batch, max(1, round(committed)), longest) if longest else 0.0
            pred = OptionPrediction(PER_REQUEST, batch, self.k, expected, draft,
                                    self.verify_seconds([k + 1 for k in row_k], packed=True), self.ar_seconds(batch),
                                    per_request_k=True, row_k=list(row_k))
            if best is None or pred.tokens_per_s > best.tokens_per_s * (1 + 1e-12):
                best = pred
        return best

    def dense_goodput(self, batch: int, acceptance: AcceptanceModel) -> OptionPrediction:
        """One k' in 0..k for every row, dense verify (the goodput rule without ragged verify, which
        the runtime has anyway): the reference that says how much of per-request k's gain is the
        shorter k and how much the packing."""
        best = None
        for kk in range(self.k + 1):
            expected = batch * acceptance.expected_tokens(kk)
            draft = self._drafting(batch, acceptance, kk) if kk else 0.0
            pred = OptionPrediction(GOODPUT, batch, self.k, expected, draft, self.verify_seconds([kk + 1] * batch),
                                    self.ar_seconds(batch), row_k=[kk] * batch)
            if best is None or pred.tokens_per_s > best.tokens_per_s * (1 + 1e-12):
                best = pred
        return best

    def options(self, batch: int, acceptance: AcceptanceModel, *, two_level: bool = True, per_request: bool = True,
                k1s: Sequence[int] | None = None, reference: bool = False) -> list[OptionPrediction]:
        """One level, then two-level at each k1 in ``k1s`` (default 1..k-1), then per-request k;
        ``reference``: also the dense goodput k (:meth:`dense_goodput`, last)."""
        out = [self.one_level(batch, acceptance)]
        if two_level:
            out += [self.two_level(batch, acceptance, k1) for k1 in (k1s or range(1, self.k)) if k1 < self.k]
        if per_request:
            out.append(self.per_request(batch, acceptance))
        if reference:
            out.append(self.dense_goodput(batch, acceptance))
        return out
