"""Acceptance models: how many tokens one speculative step commits, on average.

Greedy verification accepts the drafts up to the first one that differs from the target's own
argmax, then commits the target's token at that position. With ``alpha_i`` the probability that
draft i is accepted *given that drafts 1..i-1 were* (a per-position conditional acceptance
probability), a step with k drafts commits on average

    E[tokens per step] = 1 + sum_{i=1..k} prod_{j=1..i} alpha_j                         (1)

tokens (the 1 is the target's own token, always committed). Three sources, one per constructor:

- measured: :meth:`AcceptanceModel.from_accepted_lengths` turns the ``accepted_lengths`` of
  stock runs (one list per prompt) into per-position estimates; :func:`measure_stock` runs stock
  on calibration prompts and does that.
- given: :meth:`AcceptanceModel.from_file` reads a JSON file (``{"alphas": [...]}``,
  ``{"tau": 6.55, "num_draft": 15}`` or ``{"accepted_lengths": [[...], ...], "num_draft": k}``).
- published: :meth:`AcceptanceModel.from_tau` fits a constant alpha (a geometric model) to a
  reported acceptance length tau at k drafts: solve ``(1 - alpha^(k+1)) / (1 - alpha) = tau``.

Clipping at the end of a sequence. The last step of each sequence is cut by EOS or the token
budget, so its committed length L says only that the number of accepted drafts a >= L - 1
(right-censored). The estimator is Kaplan-Meier-like: position i is "at risk" in every step
known to have accepted drafts 1..i-1 whose outcome at i is observed; a censored step counts at
positions i <= L - 1 (all accepted) and not after. ``alpha_i = accepted_i / at_risk_i``. Steps
before the last are exact even when the loop capped k to the remaining budget (a step that
accepts all of a capped block ends the sequence, so it *is* the last step).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

from specc.errors import UserError


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """Formula (1) over the first k alphas."""
    total, survive = 1.0, 1.0
    for i in range(k):
        survive *= alphas[i]
        total += survive
    return total


def expected_longest(rows) -> float:
    """E[the most tokens any row commits in one step], rows independent: ``rows`` = [(acceptance
    model, drafts), ...]. P(max > m) = 1 - prod_r (1 - P(row r commits more than m)), where a row
    with k drafts commits more than m (m <= k) with probability prod(alpha_1..alpha_m); summed over
    m = 0 .. the most drafts. A batched drafter feeds every row as many new context entries as the
    row that committed most last step (``specc.runtime.drafters``), so that is what a batch's
    draft forward is priced at."""
    rows = [(model, int(k)) for model, k in rows]
    if not rows:
        return 0.0
    survive = [1.0] * len(rows)  # P(row r commits more than m)
    total = 0.0
    for m in range(max(k for _, k in rows) + 1):
        none_longer = 1.0
        for r, (model, k) in enumerate(rows):
            if m:
                survive[r] = survive[r] * model.alpha(m) if m <= k else 0.0
            none_longer *= 1.0 - survive[r]
        total += 1.0 - none_longer
    return total


def geometric_alpha(tau: float, k: int) -> float:
    """The constant alpha whose k-draft expected committed length is tau (bisection)."""
    if k <= 0 or tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if expected_tokens([mid] * k, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclasses.dataclass
class AcceptanceModel:
    """Per-position conditional acceptance probabilities ``alphas[i-1] = alpha_i``.

    ``counts[i-1] = (accepted, at_risk)`` when measured. ``measured_k`` is the number of drafts
    per step the alphas were measured or fitted at; positions beyond ``len(alphas)`` reuse the
    last alpha (reported as extrapolated by :meth:`describe`).
    """

    alphas: list[float]
    source: str = ""
    measured_k: int | None = None
    counts: list[tuple[int, int]] | None = None
    sequences: int = 0
    steps: int = 0

    # ------------------------------------------------------------------ evaluation

    def alpha(self, i: int) -> float:
        """alpha_i (1-based position); beyond the measured positions, the last one."""
        if i < 1:
            raise ValueError("positions start at 1")
        if not self.alphas:
            return 0.0
        return self.alphas[min(i, len(self.alphas)) - 1]

    def alphas_for(self, k: int) -> list[float]:
        return [self.alpha(i) for i in range(1, k + 1)]

    def expected_tokens(self, k: int) -> float:
        """Expected tokens committed per step with k drafts, formula (1)."""
        return expected_tokens(self.alphas_for(k), k)

    def expected_max_tokens(self, k: int, rows: int) -> float:
        """E[max over ``rows`` independent rows of the tokens a step commits] with k drafts each
        (:func:`expected_longest`). One row: ``expected_tokens(k)``."""
        return expected_longest([(self, int(k))] * max(1, int(rows)))

    def distribution(self, k: int) -> list[float]:
        """P(step commits n tokens) for n = 1..k+1."""
        out, survive = [], 1.0
        for i in range(1, k + 1):
            a = self.alpha(i)
            out.append(survive * (1 - a))
            survive *= a
        out.append(survive)
        return out

    def extrapolated(self, k: int) -> bool:
        return k > len(self.alphas)

    def formula(self, k: int) -> str:
        terms = " + ".join(f"prod(alpha_1..alpha_{i})" for i in range(1, k + 1))
        return "E = 1" + (f" + {terms}" if k else "")

    def describe(self, k: int | None = None) -> str:
        alphas = ", ".join(f"{a:.3f}" for a in self.alphas[:16]) + (" ..." if len(self.alphas) > 16 else "")
        text = f"{self.source or 'acceptance'}: alpha = [{alphas}]"
        if k is not None:
            text += f"; E[tokens/step] at k={k}: {self.expected_tokens(k):.3f}"
            if self.extrapolated(k):
                text += f" (positions > {len(self.alphas)} extrapolated with the last alpha)"
        return text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alphas": [round(a, 6) for a in self.alphas], "source": self.source,
                               "measured_k": self.measured_k}
        if self.counts is not None:
            out["counts"] = [list(c) for c in self.counts]
            out["sequences"], out["steps"] = self.sequences, self.steps
        return out

    # ------------------------------------------------------------------ constructors

    @classmethod
    def none(cls) -> "AcceptanceModel":
        """Plain AR decoding: no drafts, one token per step."""
        return cls([], source="AR (no drafts)", measured_k=0)

    @classmethod
    def constant(cls, alpha: float, k: int, source: str = "") -> "AcceptanceModel":
        if not 0.0 <= alpha <= 1.0:
            raise UserError(f"acceptance probability must be in [0, 1] (got {alpha})")
        return cls([float(alpha)] * max(k, 1), source=source or f"constant alpha {alpha:g}", measured_k=k)

    @classmethod
    def from_tau(cls, tau: float, num_draft: int, source: str = "") -> "AcceptanceModel":
        """Geometric fit to a published acceptance length tau at ``num_draft`` drafts per step."""
        if num_draft < 1:
            raise UserError("a tau needs the number of drafts per step it was measured at (num_draft >= 1)")
        if not 1.0 <= tau <= num_draft + 1:
            raise UserError(f"tau must lie in [1, num_draft + 1] = [1, {num_draft + 1}] (got {tau})")
        alpha = geometric_alpha(tau, num_draft)
        return cls([alpha] * num_draft, source=source or f"tau {tau:g} at k={num_draft} (geometric fit)",
                   measured_k=num_draft)

    @classmethod
    def from_accepted_lengths(cls, sequences: Sequence[Sequence[int]], num_draft: int,
                              source: str = "") -> "AcceptanceModel":
        """Estimate alphas from per-step committed lengths, one list per generated sequence;
        the last step of each sequence is treated as censored (see the module docstring)."""
        if num_draft < 1:
            return cls.none()
        accepted = [0] * num_draft
        at_risk = [0] * num_draft
        n_steps = 0
        for seq in sequences:
            seq = [int(x) for x in seq]
            for j, length in enumerate(seq):
                if length < 1 or length > num_draft + 1:
                    raise UserError(f"committed length {length} outside 1..{num_draft + 1} for k={num_draft}")
                n_steps += 1
                a = length - 1  # drafts accepted (exact unless censored)
                censored = j == len(seq) - 1
                for i in range(1, num_draft + 1):  # position i is at risk when drafts < i all accepted
                    if a < i - 1:
                        break
                    if censored and a == i - 1:
                        break  # the step ended here: the outcome at i is unknown
                    at_risk[i - 1] += 1
                    if a >= i:
                        accepted[i - 1] += 1
        alphas: list[float] = []
        last = 0.0
        for acc, risk in zip(accepted, at_risk):
            if risk:
                last = acc / risk
            alphas.append(last)  # unobserved positions: the last observed alpha (0 before any)
        return cls(alphas, source=source or f"measured ({len(sequences)} sequences, {n_steps} steps)",
                   measured_k=num_draft, counts=list(zip(accepted, at_risk)), sequences=len(sequences), steps=n_steps)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "<json>") -> "AcceptanceModel":
        if not isinstance(data, dict):
            raise UserError(f"{source}: an acceptance file holds a JSON object")
        label = data.get("source") or source
        k = data.get("num_draft")
        if k is None and data.get("block_size") is not None:
            k = int(data["block_size"]) - 1
        if "alphas" in data:
            alphas = data["alphas"]
            if not isinstance(alphas, list) or not all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in alphas):
                raise UserError(f"{source}: alphas must be a list of probabilities in [0, 1]")
            return cls([float(a) for a in alphas], source=label, measured_k=data.get("measured_k") or len(alphas))
        if "tau" in data:
            if k is None:
                raise UserError(f"{source}: a tau needs num_draft (or block_size) it was measured at")
            return cls.from_tau(float(data["tau"]), int(k), source=f"{label}: tau {data['tau']} at k={k} (geometric fit)")
        if "accepted_lengths" in data:
            if k is None:
                raise UserError(f"{source}: accepted_lengths need num_draft")
            seqs = data["accepted_lengths"]
            if seqs and isinstance(seqs[0], int):
                seqs = [seqs]
            return cls.from_accepted_lengths(seqs, int(k), source=label)
        raise UserError(f"{source}: give 'alphas', 'tau' (+ 'num_draft') or 'accepted_lengths' (+ 'num_draft')")

    @classmethod
    def from_file(cls, path) -> "AcceptanceModel":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as exc:
            raise UserError(f"{p}: cannot read acceptance file ({exc.strerror})") from exc
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}: not valid JSON ({exc})") from exc
        return cls.from_json(data, source=str(p))


def measure_stock(pair, prompts: Sequence[Sequence[int]], num_draft: int, max_new_tokens: int = 32,
                  dtype=None, device="cpu", stock=None) -> tuple[AcceptanceModel, list]:
    """Run stock on ``prompts`` and estimate the acceptance model from its accepted lengths.

    Returns (model, results) so callers can reuse the stock tokens (e.g. for token forcing).
    """
    import torch

    from specc.stock.runner import StockSystem

    if not pair.impl.uses_drafter:
        return AcceptanceModel.none(), []
    stock = stock or StockSystem(pair, num_draft, dtype or torch.float32, device)
    results = [stock.generate(list(p), max_new_tokens) for p in prompts]
    model = AcceptanceModel.from_accepted_lengths(
        [r.stats.accepted_lengths for r in results], num_draft,
        source=f"stock {pair.method} k={num_draft} on {len(prompts)} prompts x {max_new_tokens} tokens")
    return model, results
