"""Drafts per step from each request's measured acceptance and the batch's step-time curve (goodput).

Drafting k tokens per row makes a step cost T(B, k) (the batch's step-time curve: the cost
model's prediction, ``specc.search.batch_pricing.step_seconds``, or a measured table) and
commits in expectation E_b(k) = 1 + a_b + a_b^2 + ... + a_b^k tokens for row b, where a_b is
the request's own acceptance probability per drafted position, estimated from what it accepted
so far (a geometric fit with a uniform prior: accepted drafts are successes, a rejection that
ended a step a failure). :class:`GoodputDraftLength` picks, before each step, the k in
0..k_max that maximises sum_b E_b(min(k, cap_b)) / T(B, k) over the live rows (cap_b: the
drafts row b can still use before its budget), as SmartSpec / TurboSpec do. Greedy
verification keeps every k lossless: the choice changes speed, never tokens.

The verify step has one shape for the whole batch (no ragged verify yet), so one k serves every
row; per-row caps below k would lower E without lowering T.
"""

from __future__ import annotations

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

    def observe(self, offered: int, accepted: int) -> None:
        """A step offered ``offered`` drafts and ``accepted`` of them were accepted."""
        self.accepts += accepted
        self.rejects += 1 if accepted < offered else 0

    @property
    def alpha(self) -> float:
        return self.accepts / (self.accepts + self.rejects)


class GoodputDraftLength:
    """``step_seconds(rows, k)``: seconds of one step (drafting + verification) with ``k`` drafts
    per row over ``rows`` rows; ``k_max``: the most drafts a step may take (the loop's)."""

    def __init__(self, step_seconds: Callable[[int, int], float], k_max: int):
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        self.step_seconds, self.k_max = step_seconds, int(k_max)
        self._times: dict[tuple[int, int], float] = {}

    def _time(self, rows: int, k: int) -> float:
        key = (rows, k)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = float(self.step_seconds(rows, k))
            if not t > 0:
                raise ValueError(f"step_seconds({rows}, {k}) must be positive, got {t}")
        return t

    def goodput(self, alphas: list[float], caps: list[int], rows: int, k: int) -> float:
        """Expected tokens per second of a step with k drafts."""
        return sum(expected_tokens(a, min(k, c)) for a, c in zip(alphas, caps)) / self._time(rows, k)

    def choose(self, alphas: list[float], caps: list[int], rows: int) -> int:
        """The k maximising goodput for live rows with acceptance ``alphas`` and draft caps
        ``caps`` in a batch of ``rows`` slots (ties: the smaller k)."""
        if not alphas:
            return 0
        top = min(self.k_max, max(caps))
        return max(range(top + 1), key=lambda k: (self.goodput(alphas, caps, rows, k), -k))
