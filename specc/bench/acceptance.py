"""Stated acceptance models for ``specc bench --acceptance SPEC`` (replayed by ``ReplayVerifier``).

SPEC is one of:

- ``tau:T`` - a geometric fit (constant alpha) to acceptance length T at the run's drafts per step
  (``tau:6.5@15`` states the k the tau was measured at; the alphas then serve any k);
- ``alpha:A`` - constant per-position acceptance probability A;
- ``alphas:a1,a2,...`` - per-position conditional acceptance probabilities;
- ``dflash-qwen3-8b:BENCH`` - DFlash's published tau on Qwen3-8B at block 16 (k = 15) for BENCH in
  ``gsm8k`` (6.55), ``math500`` (7.87), ``humaneval`` (6.55), ``mt-bench`` (4.25) (source: the
  DFlash paper / z-lab model card, as quoted in DESIGN.md), geometric fit;
- a JSON file (``{"alphas": [...]}``, ``{"tau": T, "num_draft": K}`` or ``{"accepted_lengths":
  [[...]], "num_draft": K}``: ``specc.search.acceptance.AcceptanceModel.from_file``);
- ``measured`` - no replay: the target decides (real checkpoints only).
"""

from __future__ import annotations

from pathlib import Path

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel

PUBLISHED = {
    "dflash-qwen3-8b": {
        "block_size": 16,
        "source": "DFlash (z-lab), Qwen3-8B, block 16: reported acceptance length (DESIGN.md)",
        "tau": {"gsm8k": 6.55, "math500": 7.87, "humaneval": 6.55, "mt-bench": 4.25},
    },
}


def parse_acceptance(spec: str | None, num_draft: int) -> AcceptanceModel | None:
    """The acceptance model SPEC states (None for ``measured`` / no spec)."""
    if spec is None or spec == "measured":
        return None
    k = max(int(num_draft), 1)
    kind, _, value = spec.partition(":")
    try:
        if kind == "tau" and value:
            tau_s, _, at = value.partition("@")
            tau, k_at = float(tau_s), int(at) if at else k
            return AcceptanceModel.from_tau(tau, k_at, source=f"stated tau {tau:g} at k={k_at} (geometric fit)")
        if kind == "alpha" and value:
            return AcceptanceModel.constant(float(value), k, source=f"stated constant alpha {float(value):g}")
        if kind == "alphas" and value:
            alphas = [float(a) for a in value.split(",") if a.strip()]
            if not alphas or any(not 0 <= a <= 1 for a in alphas):
                raise UserError("--acceptance alphas: give probabilities in [0, 1], comma separated")
            return AcceptanceModel(alphas, source="stated per-position alphas", measured_k=len(alphas))
    except ValueError:
        raise UserError(f"--acceptance {spec!r}: not a number where one was expected") from None
    if kind in PUBLISHED:
        prof = PUBLISHED[kind]
        if value not in prof["tau"]:
            raise UserError(f"--acceptance {kind}:BENCH, BENCH one of {', '.join(prof['tau'])}")
        kp = prof["block_size"] - 1
        tau = prof["tau"][value]
        return AcceptanceModel.from_tau(tau, kp, source=f"{prof['source']}: {value} tau {tau} at k={kp} (geometric fit)")
    if Path(spec).is_file():
        return AcceptanceModel.from_file(spec)
    raise UserError(f"--acceptance {spec!r}: give tau:T, alpha:A, alphas:a1,a2,..., "
                    f"{', '.join(p + ':BENCH' for p in PUBLISHED)}, a JSON file, or 'measured'")
