"""What a search records: evaluated candidates, the context proposers see, the result, progress.

    Evaluated(candidate): prediction, token-forcing verdict, re-measured acceptance, GPU timing
    SearchResult: baseline, best, per-round log; ``.choice()`` is what `specc compile` would use
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.choose import Choice
from specc.search.cost_model import SystemPrediction
from specc.search.proposers import Candidate


class SearchError(UserError):
    """The search cannot proceed (e.g. the starting configuration fails token forcing)."""


@dataclasses.dataclass
class Evaluated:
    """A candidate with what the search learnt about it."""

    candidate: Candidate
    prediction: SystemPrediction | None = None
    prediction_json: dict[str, Any] | None = None  # sandboxed candidates: the worker's prediction
    verified: bool | None = None
    forcing: dict[str, Any] | None = None
    acceptance: AcceptanceModel | None = None  # measured on the compiled system
    measured: dict[str, Any] | None = None
    status: str = "proposed"
    error: str | None = None
    lowering: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None  # sandboxed candidates: how the worker was confined ({"network": ...})

    @property
    def predicted_tokens_per_s(self) -> float | None:
        if self.prediction is not None:
            return self.prediction.tokens_per_s
        if self.prediction_json is not None:
            return float(self.prediction_json["tokens_per_s"])
        return None

    @property
    def score(self) -> float:
        """What decides: measured tokens/s when measured, else predicted."""
        if self.measured and self.measured.get("tokens_per_s"):
            return float(self.measured["tokens_per_s"])
        p = self.predicted_tokens_per_s
        return float(p) if p is not None else 0.0

    def prediction_summary(self) -> dict[str, Any]:
        if self.prediction is not None:
            p = self.prediction
            return {"tokens_per_s": p.tokens_per_s, "speedup": p.speedup, "step_s": p.step_time,
                    "ar_step_s": p.ar.time, "expected_tokens_per_step": p.expected_tokens}
        if self.prediction_json is not None:
            j = self.prediction_json
            return {k: j.get(k2) for k, k2 in (("tokens_per_s", "tokens_per_s"), ("speedup", "speedup"),
                                                ("step_s", "step_s"), ("ar_step_s", "ar_step_s"),
                                                ("expected_tokens_per_step", "expected_tokens_per_step"))}
        return {}

    def to_json(self, full: bool = False) -> dict[str, Any]:
        out = {"config": self.candidate.describe(), "parameters": self.candidate.parameters(),
               "mechanism": self.candidate.mechanism, "origin": self.candidate.origin, "reason": self.candidate.reason,
               "status": self.status, "verified": self.verified, "error": self.error,
               "predicted": self.prediction_summary(), "measured": self.measured}
        if self.sandbox is not None:
            out["sandbox"] = dict(self.sandbox)
        if self.acceptance is not None:
            out["acceptance"] = self.acceptance.to_json()
        if self.forcing is not None:
            out["forcing"] = {k: self.forcing.get(k) for k in ("passed", "prompts", "positions", "tolerance")}
            out["forcing"]["mismatches"] = len(self.forcing.get("failures", []))
            out["forcing"]["ties"] = len(self.forcing.get("ties", []))
        if full and self.prediction is not None:
            out["prediction"] = self.prediction.to_json()
        return out


@dataclasses.dataclass
class SearchContext:
    """What proposers see."""

    round: int
    method: str
    deployment: Any
    best: Evaluated
    gap_report: Any
    history: dict[str, Evaluated]
    memory: Any
    siblings: list
    passes: dict[str, Any]
    roles: tuple[str, ...]
    num_layers: dict[str, int]
    k_choices: list[int]
    model_name: str
    drafter_name: str
    ir_summary: Callable[[], str] = lambda: ""
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SearchResult:
    model: str
    drafter: str | None
    method: str
    deployment: str
    device: str
    measured: bool
    baseline: Evaluated
    best: Evaluated
    rounds: list[dict[str, Any]]
    acceptance: AcceptanceModel
    memory_path: str | None
    seconds: float

    def choice(self) -> "Choice":
        c = self.best.candidate
        return Choice(c.single_pipeline if c.single_pipeline is not None else c.pipeline("target"), c.num_draft,
                      self.best.prediction_summary())

    def summary_lines(self) -> list[str]:
        b, base = self.best, self.baseline
        lines = [f"search {self.model}" + (f" + {self.drafter}" if self.drafter else "") + f" ({self.method}) on "
                 f"{self.deployment}: {len(self.rounds)} rounds in {self.seconds:.1f} s"
                 + (" (measured on the GPU)" if self.measured else " (predicted by the cost model)"),
                 f"baseline: {base.candidate.describe()}: {base.score:,.1f} tok/s",
                 f"best:     {b.candidate.describe()}: {b.score:,.1f} tok/s "
                 f"({b.score / base.score if base.score else 0:.3f}x baseline"
                 + (f", {b.prediction.speedup:.2f}x over AR predicted" if b.prediction is not None else "") + ")"]
        if self.memory_path:
            lines.append(f"memory: {self.memory_path}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "drafter": self.drafter, "method": self.method, "deployment": self.deployment,
                "device": self.device, "measured": self.measured, "seconds": self.seconds,
                "baseline": self.baseline.to_json(), "best": self.best.to_json(full=True),
                "choice": dataclasses.asdict(self.choice()), "rounds": self.rounds,
                "acceptance": self.acceptance.to_json(), "memory": self.memory_path}


class Reporter:
    """Progress sink; the CLI passes a rich-based one."""

    def message(self, text: str) -> None:
        pass

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, text: str = "") -> None:
        pass

    def stop(self) -> None:
        pass


class _Recorder:
    """Wraps a system for verify_system and keeps the accepted lengths of its free decoding."""

    def __init__(self, system):
        self.system = system
        self.lengths: list[list[int]] = []

    def forced_argmax(self, prompt, tokens):
        return self.system.forced_argmax(prompt, tokens)

    def generate(self, prompt, max_new_tokens, eos_token_ids=()):
        result = self.system.generate(prompt, max_new_tokens, eos_token_ids)
        self.lengths.append(list(result.stats.accepted_lengths))
        return result
