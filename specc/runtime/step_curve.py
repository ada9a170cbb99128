"""The cost model's step-time table, recorded in the artifact, as the goodput rule's functions.

`specc compile` prices a ragged speculative step (drafting + a packed verify) at a grid of rows
and tokens per row and writes the table into ``manifest["batching"]["curve"]``
(``specc.search.batching_choice.curve_table``). The runtime cannot import the cost model (it
sits below the search layer), so :class:`StepCurve` reads that table back and interpolates it:
``ragged_seconds(rows, tokens)`` and ``step_seconds(rows, k)`` (k drafts for every row), the two
step-time functions of ``specc.runtime.adaptive.GoodputDraftLength``. Interpolation is linear
in the rows and in the tokens per row, extended linearly past the grid's ends.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended with the end segments."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class StepCurve:
    """``seconds[i][j]``: one step over ``rows[i]`` rows of ``tokens_per_row[j]`` tokens each."""

    def __init__(self, rows: Sequence[int], tokens_per_row: Sequence[int], seconds: Sequence[Sequence[float]]):
        self.rows = [int(r) for r in rows]
        self.tokens_per_row = [int(q) for q in tokens_per_row]
        self.seconds = [[float(s) for s in line] for line in seconds]
        if (not self.rows or not self.tokens_per_row or len(self.seconds) != len(self.rows)
                or any(len(line) != len(self.tokens_per_row) for line in self.seconds)):
            raise ValueError("a step curve needs one line of seconds per row count, one value per tokens-per-row")
        if self.rows != sorted(set(self.rows)) or self.tokens_per_row != sorted(set(self.tokens_per_row)):
            raise ValueError("a step curve's rows and tokens per row must be increasing")
        if self.rows[0] < 1 or self.tokens_per_row[0] < 1 or any(s <= 0 for line in self.seconds for s in line):
            raise ValueError("a step curve's rows, tokens per row and seconds must be positive")

    @classmethod
    def from_section(cls, curve) -> "StepCurve":
        """From the manifest's ``batching.curve`` ({"rows", "tokens_per_row", "seconds"})."""
        if not isinstance(curve, dict):
            raise ValueError("batching.curve must be an object with rows, tokens_per_row and seconds")
        try:
            return cls(curve["rows"], curve["tokens_per_row"], curve["seconds"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"batching.curve is malformed ({type(exc).__name__}: {exc})") from None

    def ragged_seconds(self, rows: int, tokens: int) -> float:
        """A step whose packed verify takes ``tokens`` tokens over ``rows`` rows."""
        per_row = tokens / max(int(rows), 1)
        at_rows = [_interp(self.tokens_per_row, line, per_row) for line in self.seconds]
        return max(_interp(self.rows, at_rows, float(rows)), 1e-9)

    def step_seconds(self, rows: int, k: int) -> float:
        """A step with ``k`` drafts for every one of ``rows`` rows."""
        return self.ragged_seconds(rows, rows * (int(k) + 1))


def draft_length_rule(section: dict, num_draft: int):
    """The goodput rule a batching choice (``manifest["batching"]``, or
    ``specc.search.batching_choice.batching_section``'s dict) asks for, over its step curve:
    per-request k (one k per row, ragged verify) or goodput k (one k per step, dense verify);
    None when it asks for neither (the loop's k every step) or has no curve. Each request's
    acceptance estimate starts at the section's ``prior_alpha`` (the acceptance it was priced with)."""
    per_row, one_k = section.get("per_request_k"), section.get("goodput_k")
    if not ((per_row or one_k) and section.get("curve") and num_draft):
        return None
    from specc.runtime.adaptive import GoodputDraftLength

    curve = StepCurve.from_section(section["curve"])
    prior = section.get("prior_alpha")  # absent from artifacts written before it: a uniform prior
    prior = None if prior is None else float(prior)
    if not per_row:  # one k per step over the dense verify
        return GoodputDraftLength(curve.step_seconds, num_draft, prior_alpha=prior)
    return GoodputDraftLength(curve.step_seconds, num_draft, ragged_seconds=curve.ragged_seconds, prior_alpha=prior)
