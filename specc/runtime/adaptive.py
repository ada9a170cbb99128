"""Drafts per step from each request's measured acceptance and the batch's step-time curve (goodput).

Drafting k tokens per row makes a step cost T(B, k) (the batch's step-time curve: the cost
model's prediction, ``specc.search.batch_pricing.step_seconds``, or a measured table) and
commits in expectation E_b(k) = 1 + a_b + a_b^2 + ... + a_b^k tokens for row b, where a_b is
the request's own acceptance probability per drafted position, estimated from what it accepted
so far (a geometric fit: accepted drafts are successes, a rejection that ended a step a failure;
the prior is uniform, or, given ``prior_alpha``, the acceptance the batching choice was priced
with, worth ``prior_weight`` observations. The prior matters: a row whose estimate says "draft
nothing" offers no drafts, so it learns nothing more; a uniform prior of 0.5 on a pair that
accepts 0.9 can keep every row at k = 0 for good). :class:`GoodputDraftLength` picks, before each step, the k in
0..k_max that maximises sum_b E_b(min(k, cap_b)) / T(B, k) over the live rows (cap_b: the
drafts row b can still use before its budget), as SmartSpec / TurboSpec do. Greedy
verification keeps every k lossless: the choice changes speed, never tokens.

With a dense verify step one k serves every row (the step has one shape): a per-row cap below k
would lower E without lowering T. With a ragged (packed) verify (``DeviceSpeculativeDecoder``'s
``verifies_ragged``) a step costs what its rows verify, T_r(R, sum_b (k_b + 1)) over the R rows
(``ragged_seconds``), so :meth:`GoodputDraftLength.choose_rows` picks one k_b per request:
maximise sum_b E_b(k_b) / T_r(R, R + S) over S = sum_b k_b. For a fixed S the numerator is a sum
of concave functions (E_b(k) - E_b(k - 1) = a_b^k falls with k), so adding drafts one at a time
to the row whose next draft has the largest a_b^(k_b + 1) gives the best allocation of every S
(the exchange argument of separable concave resource allocation); one greedy pass therefore
visits the best allocation of each S in turn, and the best ratio among them is the optimum for
any step-time curve. Requests that accept more get more drafts; a request whose drafts are never
accepted gets none while the others keep theirs.
"""

from __future__ import annotations

import heapq
from typing import Callable


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a row commits in expectation with k drafts at per-position acceptance ``alpha``."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AcceptanceEstimate:
    """One request's per-position acceptance probability from its steps so far."""

    def __init__(self, prior_accepts: float = 1.0, prior_rejects: float = 1.0):
        self.accepts, self.rejects = prior_accepts, prior_rejects

    @classmethod
    def from_prior(cls, alpha: float, weight: float) -> "AcceptanceEstimate":
        """Starting at ``alpha`` (clamped into [0.01, 0.99]) with ``weight`` observations' worth."""
        a = min(max(float(alpha), 0.01), 0.99)
        return cls(a * weight, (1.0 - a) * weight)

    def observe(self, offered: int, accepted: int) -> None:
        """A step offered ``offered`` drafts and ``accepted`` of them were accepted."""
        self.accepts += accepted
        self.rejects += 1 if accepted < offered else 0

    @property
    def alpha(self) -> float:
        return self.accepts / (self.accepts + self.rejects)


class GoodputDraftLength:
    """``step_seconds(rows, k)``: seconds of one step (drafting + verification) with ``k`` drafts
    per row over ``rows`` rows; ``k_max``: the most drafts a step may take (the loop's).
    ``ragged_seconds(rows, tokens)``: seconds of one step whose ragged verify checks ``tokens``
    packed tokens over ``rows`` rows, drafting included (None: no per-request choice).
    ``prior_alpha``: where each request's acceptance estimate starts (the acceptance the choice was
    priced with; None: uniform), worth ``prior_weight`` observations."""

    def __init__(self, step_seconds: Callable[[int, int], float], k_max: int,
                 ragged_seconds: Callable[[int, int], float] | None = None, prior_alpha: float | None = None,
                 prior_weight: float = 4.0):
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        if prior_alpha is not None and not 0.0 <= prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha must lie in [0, 1], got {prior_alpha}")
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be positive, got {prior_weight}")
        self.step_seconds, self.k_max = step_seconds, int(k_max)
        self.ragged_seconds = ragged_seconds
        self.prior_alpha, self.prior_weight = prior_alpha, float(prior_weight)
        self._times: dict[tuple[int, int], float] = {}
        self._ragged_times: dict[tuple[int, int], float] = {}

    def new_estimate(self) -> AcceptanceEstimate:
        """A new request's acceptance estimate (the prior)."""
        if self.prior_alpha is None:
            return AcceptanceEstimate()
        return AcceptanceEstimate.from_prior(self.prior_alpha, self.prior_weight)

    def _time(self, rows: int, k: int) -> float:
        return _cached(self._times, self.step_seconds, "step_seconds", rows, k)

    def _ragged_time(self, rows: int, tokens: int) -> float:
        return _cached(self._ragged_times, self.ragged_seconds, "ragged_seconds", rows, tokens)

    def goodput(self, alphas: list[float], caps: list[int], rows: int, k: int) -> float:
        """Expected tokens per second of a step with k drafts."""
        return sum(expected_tokens(a, min(k, c)) for a, c in zip(alphas, caps)) / self._time(rows, k)

    def choose(self, alphas: list[float], caps: list[int], rows: int) -> int:
        """The k maximising goodput for live rows with acceptance ``alphas`` and draft caps
        ``caps`` in a batch of ``rows`` slots (ties: the smaller k)."""
        if not alphas:
            return 0
        top = min(self.k_max, max(caps))
        # E_b(k) = E_b(k - 1) + a_b^k while k <= cap_b: the sum over rows grows one power per row
        # and k (this runs on the host before every step: no closed form per (row, k) pair)
        total, powers = float(len(alphas)), list(alphas)
        best_k, best = 0, total / self._time(rows, 0)
        for k in range(1, top + 1):
            for b, cap in enumerate(caps):
                if cap >= k:
                    total += powers[b]
                    powers[b] *= alphas[b]
            goodput = total / self._time(rows, k)
            if goodput > best:  # ties: the smaller k
                best_k, best = k, goodput
        return best_k

    def choose_rows(self, alphas: list[float], caps: list[int], rows: int) -> list[int]:
        """Drafts per live row (row b: acceptance ``alphas[b]``, at most ``caps[b]`` and ``k_max``)
        maximising sum_b E_b(k_b) / ragged_seconds(R, sum_b (k_b + 1)) with R = len(alphas), the
        rows of the packed verify (module doc: greedy by marginal gain, exact). Ties: fewer
        drafts. Without ``ragged_seconds``: ``[choose(alphas, caps, rows)] * len(alphas)`` (one
        k for the batch of ``rows`` slots)."""
        if not alphas:
            return []
        if self.ragged_seconds is None:
            return [self.choose(alphas, caps, rows)] * len(alphas)
        live = len(alphas)
        limits = [max(0, min(self.k_max, c)) for c in caps]
        ks = [0] * live
        tokens = sum(expected_tokens(a, 0) for a in alphas)
        best, best_ks = tokens / self._ragged_time(live, live), list(ks)
        heap = [(-a, b) for b, a in enumerate(alphas) if limits[b] > 0]  # next draft's marginal gain a_b^(k_b + 1)
        heapq.heapify(heap)
        drafts = 0
        while heap:
            gain, b = heapq.heappop(heap)
            ks[b] += 1
            drafts += 1
            tokens += -gain
            if ks[b] < limits[b]:
                heapq.heappush(heap, (gain * alphas[b], b))
            goodput = tokens / self._ragged_time(live, live + drafts)
            if goodput > best:
                best, best_ks = goodput, list(ks)
        return best_ks


def _cached(table: dict, fn, name: str, rows: int, n: int) -> float:
    """``fn(rows, n)`` memoised in ``table``; a step time must be positive."""
    t = table.get((rows, n))
    if t is None:
        t = table[(rows, n)] = float(fn(rows, n))
        if not t > 0:
            raise ValueError(f"{name}({rows}, {n}) must be positive, got {t}")
    return t
