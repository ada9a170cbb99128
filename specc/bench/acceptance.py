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

Draft trees (an artifact compiled with a tree budget) replay a per-rank model
(``specc.search.tree_acceptance.TreeAcceptanceModel``, replayed by
``specc.runtime.tree_replay.TreeReplayVerifier``), from :func:`parse_tree_acceptance`:

- ``ranks:FILE`` - a tree acceptance JSON (``{"p": [[...], ...]}`` or ``{"rank_counts": ...}``, what
  ``specc.search.measure_tree`` measures and `specc compile --tree auto` records in the manifest);
  the chain replays its rank-0 column;
- ``SPEC+ranks:FILE`` - rank 0 from the chain SPEC above (e.g. a published tau), ranks >= 1 from
  FILE's split of the remaining mass: ``p[d][r] = (1 - alpha_d) * q[d][r] / (1 - q[d][0])`` with
  ``q`` the file's rows (assumed: the target's token falls among the drafter's other candidates
  as in FILE's pair when rank 0 misses);
- any chain SPEC alone - rank 0 only (``TreeAcceptanceModel.from_chain``): a tree then accepts
  what the chain does and only its cost shows.
"""

from __future__ import annotations

import json
from pathlib import Path

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.tree_acceptance import TreeAcceptanceModel

PUBLISHED = {
    "dflash-qwen3-8b": {
        "block_size": 16,
        "source": "DFlash (z-lab), Qwen3-8B, block 16: reported acceptance length (DESIGN.md)",
        "tau": {"gsm8k": 6.55, "math500": 7.87, "humaneval": 6.55, "mt-bench": 4.25},
    },
}


def parse_acceptance(spec: str | None, num_draft: int) -> AcceptanceModel | None:
    """The acceptance model SPEC states (None for ``measured`` / no spec); a tree SPEC
    (``ranks:``) gives its rank-0 chain."""
    if spec is None or spec == "measured":
        return None
    if "ranks:" in spec:
        tree = parse_tree_acceptance(spec, num_draft)
        k = max(int(num_draft), 1)
        return AcceptanceModel([tree.prob(d, 0) for d in range(1, k + 1)], source=f"rank 0 of {tree.source}",
                               measured_k=k)
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


def _rank_file(path: str) -> TreeAcceptanceModel:
    if not Path(path).is_file():
        raise UserError(f"--acceptance ranks:{path}: no such file (a tree acceptance JSON: {{'p': ...}} or "
                        "{'rank_counts': ...})")
    model = TreeAcceptanceModel.from_file(path)  # source: the path
    if not model.p or any(not row for row in model.p):
        raise UserError(f"--acceptance ranks:{path}: no rank probabilities at some depth (nothing was measured)")
    stated = json.loads(Path(path).read_text()).get("source")
    if isinstance(stated, str) and stated:
        model.source = f"{path} ({stated})"
    return model


def parse_tree_acceptance(spec: str | None, depth: int) -> TreeAcceptanceModel | None:
    """The per-rank tree acceptance model SPEC states for trees of ``depth`` drafted positions
    (None for ``measured`` / no spec). See the module doc for the forms and what each assumes."""
    if spec is None or spec == "measured":
        return None
    k = max(int(depth), 1)
    if spec.startswith("ranks:"):
        return _rank_file(spec[len("ranks:"):])
    chain_spec, plus, rank_spec = spec.partition("+")
    if plus and not rank_spec.startswith("ranks:"):
        raise UserError(f"--acceptance {spec!r}: after '+' give ranks:FILE")
    chain = parse_acceptance(chain_spec, k)
    if chain is None:
        raise UserError(f"--acceptance {spec!r}: 'measured' cannot be combined with a rank model")
    if not plus:
        return TreeAcceptanceModel.from_chain(chain, k)
    shares = _rank_file(rank_spec[len("ranks:"):])
    rows = []
    for d in range(1, k + 1):
        alpha = float(chain.alpha(d))
        q0 = shares.prob(d, 0)
        width = len(shares.p[min(d, len(shares.p)) - 1]) if shares.p else 1
        rest = [(1.0 - alpha) * shares.prob(d, r) / (1.0 - q0) if q0 < 1.0 else 0.0 for r in range(1, width)]
        rows.append([alpha] + rest)
    source = (f"rank 0: {chain.source}; ranks >= 1: the remaining mass split as in {shares.source or rank_spec} "
              "(assumed to carry over)")
    return TreeAcceptanceModel(rows, source=source)
