"""Tie-aware equality of two greedy outputs of the same prompts (batched vs alone, speculative vs AR).

Why: a batch of B rows runs the target's linears at M = B (or B x (k + 1)) tokens where a request
alone runs them at M = 1, so in bf16 on a GPU the kernels, and their reduction order, differ. Where
a position's top-2 logits are within rounding of each other the argmax may then flip: a numerical
tie, which is reported (never silently forgiven) and never counted as a bug. Every other
difference is a bug. This is the rule token forcing applies (``specc.verify.forcing``), for the
case where both sides are free greedy runs of the system itself rather than stock vs the system.

For each request the outputs are compared up to their first difference only (after a tie the two
runs continue from different tokens, so later positions are not comparable). There the reference
run's top-2 margin is measured by :class:`PrefixLogits`: one forward of a model definition over
the prompt and the reference's tokens before that position. A margin below the tolerance is a
tie (request, position, margin, and the fp32 gap between the two tokens where an fp32 copy of
the model is at hand); anything else is a failure.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Sequence

import torch

from specc.verify.forcing import top2_margins

__all__ = ["Divergence", "EqualityReport", "PrefixLogits", "compare_outputs"]


@dataclasses.dataclass
class Divergence:
    """The first position where a request's output differs from the reference's."""

    request: int
    position: int
    expected: int  # the reference's token there
    got: int | None  # the compared output's token (None: that output ended before it)
    margin: float  # the reference's top-2 logit margin there (NaN: non-finite logits)
    fp32_margin: float | None = None  # fp32 logit(expected) - logit(got), when measured

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class EqualityReport:
    tolerance: float
    requests: int = 0
    ties: list[Divergence] = dataclasses.field(default_factory=list)
    failures: list[Divergence] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        text = (f"{self.requests} requests, {len(self.failures)} differences, {len(self.ties)} numerical ties "
                f"(tolerance {self.tolerance:g})")
        if self.failures:
            d = self.failures[0]
            text += (f"; first difference: request {d.request} position {d.position}: expected {d.expected}, "
                     f"got {d.got}, reference margin {d.margin:.4g}")
        return text


class PrefixLogits:
    """The reference's next-token logits after ``prompt + tokens[:position]``, from one forward of
    a model definition (``CausalLM``-like: ``setup_caches`` and ``forward(ids, positions,
    cache_len)``, logits or (logits, hidden)) over the whole prefix. The model's caches are
    reallocated for one row: pass a definition no loop is running on (compiled steps have their
    own state). ``fp32``: also measure the gap between the two tokens in an fp32 copy of the
    model, made at the first call that needs it (memory: twice the weights again in bf16)."""

    def __init__(self, model, fp32: bool = False):
        self.model, self.fp32 = model, fp32
        self._fp32_model = None

    @staticmethod
    @torch.inference_mode()
    def logits(model, prompt: Sequence[int], tokens: Sequence[int], position: int) -> torch.Tensor:
        """[V] fp32 logits predicting generated token ``position`` (0: the prefill's token)."""
        ids = list(prompt) + list(tokens[:position])
        device = model.device
        model.setup_caches(1, len(ids) + 1)
        out = model(torch.tensor([ids], dtype=torch.long, device=device),
                    torch.arange(len(ids), device=device)[None], torch.zeros(1, dtype=torch.long, device=device))
        out = out[0] if isinstance(out, tuple) else out
        return out[0, -1].float()

    def __call__(self, prompt, tokens, position: int, got: int | None) -> tuple[float, float | None]:
        """(top-2 margin, fp32 logit(expected) - logit(got) or None) at ``position``."""
        low = self.logits(self.model, prompt, tokens, position)
        margin = top2_margins(low[None])[0]  # NaN where the logits are not all finite
        if got is None or position >= len(tokens):
            return margin, None
        expected = int(tokens[position])
        if next(self.model.parameters()).dtype == torch.float32:
            return margin, float(low[expected] - low[got])
        if not self.fp32:
            return margin, None
        if self._fp32_model is None:
            self._fp32_model = copy.deepcopy(self.model).float()
        ref = self.logits(self._fp32_model, prompt, tokens, position)
        return margin, float(ref[expected] - ref[got])


def first_difference(reference: Sequence[int], got: Sequence[int]) -> int | None:
    """The first position where ``got`` differs from ``reference`` (a shorter or longer output
    differs where the shorter ends), or None when they are equal."""
    for pos, (a, b) in enumerate(zip(reference, got)):
        if a != b:
            return pos
    return None if len(reference) == len(got) else min(len(reference), len(got))


def compare_outputs(prompts: Sequence[Sequence[int]], reference: Sequence[Sequence[int]],
                    got: Sequence[Sequence[int]], margins, tolerance: float) -> EqualityReport:
    """Compare ``got[i]`` with ``reference[i]`` for every request (module doc). ``margins(prompt,
    reference_tokens, position, got_token) -> (margin, fp32 margin or None)``, e.g. a
    :class:`PrefixLogits`; called only where outputs differ."""
    if not len(prompts) == len(reference) == len(got):
        raise ValueError(f"{len(prompts)} prompts, {len(reference)} reference outputs, {len(got)} outputs")
    report = EqualityReport(tolerance=tolerance, requests=len(prompts))
    for index, (prompt, ref, out) in enumerate(zip(prompts, reference, got)):
        pos = first_difference(ref, out)
        if pos is None:
            continue
        other = int(out[pos]) if pos < len(out) else None
        if pos >= len(ref):  # the output runs on past the reference: nothing to measure a tie by
            report.failures.append(Divergence(index, pos, -1, other, math.nan))
            continue
        margin, fp32_margin = margins(prompt, ref, pos, other)
        d = Divergence(index, pos, int(ref[pos]), other, margin, fp32_margin)
        # NaN compares False: non-finite logits are a failure, never a tie; a missing token too
        (report.ties if other is not None and margin < tolerance else report.failures).append(d)
    return report
