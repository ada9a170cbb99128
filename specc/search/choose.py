"""``choose_pipeline``: the cheap pipeline and drafts-per-step choice `specc compile` makes.

No compilation and no weights: cost-model predictions on meta-device IRs (:class:`MetaPair`) of
the default pipeline and the validated configurations in the search memory. The one exception is
the caller's ``measure`` callback (stock on the calibration prompts), run when the memory holds no
measured acceptance to choose drafts per step with.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.cost_model import CostModel, SystemPrediction, default_context
from specc.search.defaults import default_num_draft, default_pipeline, k_choices
from specc.search.defaults import one_line as _one_line
from specc.search.meta_pair import MetaPair
from specc.search.proposers import Candidate


@dataclasses.dataclass
class Choice:
    """What `specc compile` should use: a pass pipeline (both roles), drafts per step, and the
    prediction that chose them (tokens/s, speedup, step times, the candidates considered)."""

    pipeline: str
    num_draft: int
    prediction: dict[str, Any]


def memory_acceptance(mem, model: str, drafter: str, method: str, k: int | None = None,
                      weights: str | None = None) -> AcceptanceModel | None:
    """The measured acceptance the search memory holds for the pair (this deployment's file
    first, then the family's other deployments), or None; ``weights``: the pair's
    ``memory.weights_fingerprint`` (only records measured on those weights count)."""
    for m in [mem] + mem.siblings():
        found = m.find_acceptance(model, drafter, method, k, weights)
        if found is not None:
            return found
    return None


def resolve_acceptance(model: str, drafter: str | None, method: str, family: str, deployment: str, k: int, *,
                       tau: float | None = None, alpha: float | None = None, file: str | None = None,
                       memory=None, weights: str | None = None) -> tuple[AcceptanceModel, str, AcceptanceModel | None]:
    """The one acceptance `specc cost` and `specc compile` predict with, and which it is:
    (model, kind, the memory's measured model or None). ``kind``: "stated" (``tau`` / ``alpha``
    / ``file`` given: the user's word wins), "measured" (the search memory's record for the
    pair, which `specc compile` and `specc search` write from stock's accepted lengths), or
    "unknown" (E = 1 token per step). AR (``k == 0``) has no acceptance: kind "ar"."""
    from specc.search.memory import Memory

    if k < 1:
        return AcceptanceModel.none(), "ar", None
    recorded = None
    if memory is not False and drafter:
        mem = memory if isinstance(memory, Memory) else Memory.open(family, deployment, memory)
        recorded = memory_acceptance(mem, model, drafter, method, k, weights)
    if tau is not None:
        return AcceptanceModel.from_tau(tau, k, source=f"stated: tau {tau:g} at k={k} (geometric fit)"), "stated", recorded
    if alpha is not None:
        return AcceptanceModel.constant(alpha, k, source=f"stated: constant alpha {alpha:g}"), "stated", recorded
    if file:
        acc = AcceptanceModel.from_file(file)
        acc.source = f"stated: {acc.source}"
        return acc, "stated", recorded
    if recorded is not None:
        recorded.source = f"measured: {recorded.source} (search memory)"
        return recorded, "measured", recorded
    return AcceptanceModel([], source="unknown: E = 1 token per step assumed"), "unknown", None


def choose_pipeline(pair, deployment, memory=None, *, num_draft: int | None = None,
                    acceptance: AcceptanceModel | None = None, context: int | None = None,
                    measure: Callable[[int], AcceptanceModel | None] | None = None,
                    drafter_pipeline: str | None = None) -> Choice:
    """Pick the pipeline and drafts per step for ``pair`` (a ``specc.pairing.Pair``) on
    ``deployment`` (a name, file or Deployment) by predicted tokens/s. Cheap: no compilation,
    no weights; the IRs are traced from config.json on the meta device.

    Candidates: the default pipeline, and every validated single-pipeline configuration in the
    memory (``memory``: a Memory, a path, None for the default location, False for none) of
    this family on this deployment, then on the family's other deployments. Acceptance:
    ``acceptance`` if given, else the memory's record for this pair, else unknown (E = 1 is
    assumed and step times decide; drafts per step then stay at the default unless the memory
    validated another k for this drafter). With a known acceptance and no ``num_draft``, drafts
    per step are swept too.

    ``measure(k)``: stock's acceptance at k drafts per step on the calibration prompts (what
    `specc compile` passes), called once, at the largest drafts per step swept, when no
    ``acceptance`` is given, no ``num_draft`` fixes k and the memory holds no record measured at
    that many drafts (``_needs_measuring``). Without it a first compile on an empty memory
    assumes E = 1 and keeps the method's default k whatever the drafter accepts (a k its own
    measured acceptance may then price far below another k, even below AR), while the next
    compile, reading that measurement back from the memory, sweeps k and picks another. Measured
    here, both choose from the same acceptance (``prediction["choice_acceptance"]`` says which).

    ``context``: the KV-cache length priced; default ``cost_model.default_context``, at most the
    target's and drafter's max_position_embeddings.

    ``drafter_pipeline``: the drafter's own pipeline (`specc compile --drafter-passes`): every
    candidate's drafter is priced with it, and only the target's pipeline is chosen.
    """
    from specc.passes import available_passes
    from specc.search.deployments import get_deployment
    from specc.search.memory import Memory, family_of, pair_weights
    from specc.search.proposers import _pipeline_usable

    dep = get_deployment(deployment) if isinstance(deployment, str) else deployment
    method, drafts = pair.method, pair.impl.uses_drafter
    model_name, drafter_name = pair.target.name, (pair.drafter.name if pair.drafter else "")
    mem = None
    if memory is not False:
        mem = memory if isinstance(memory, Memory) else Memory.open(family_of(pair.target.raw), dep.name, memory)
    k_default = (num_draft or default_num_draft(pair)) if drafts else 0
    options: list[tuple[str, int, str]] = [(default_pipeline(), k_default, "default pipeline")]
    registered = available_passes()
    acc_source, given = "given", acceptance is not None
    skipped: list[str] = []  # memory entries whose pass code changed since they were validated
    if mem is not None:
        for m in [mem] + mem.siblings():
            for e in m.validated(model_name, drafter_name, method, notes=skipped):
                cand = Candidate.from_parameters(e.parameters)
                pipe = cand.single_pipeline
                if pipe is None or not _pipeline_usable(pipe, registered):
                    continue
                same = e.drafter == drafter_name and e.method == method
                k = (num_draft or (cand.num_draft if same and cand.num_draft else k_default)) if drafts else 0
                options.append((pipe, k, f"memory ({e.deployment or m.deployment}): {e.mechanism}"))
        if acceptance is None and drafts:
            acceptance = memory_acceptance(mem, model_name, drafter_name, method, weights=pair_weights(pair))
            acc_source = "memory" if acceptance is not None else "unknown"
    if measure is not None and not given and num_draft is None and drafts:
        k_max = max(k_choices(pair, k_default))
        if _needs_measuring(acceptance, k_max):
            measured = measure(k_max)
            if measured is not None:
                acceptance, acc_source = _as_remembered(measured), "measured"
    if acceptance is None:
        acceptance = AcceptanceModel([], source="unknown: E = 1 assumed") if drafts else AcceptanceModel.none()
        acc_source = "unknown" if drafts else "ar"
    if acc_source in ("given", "memory", "measured") and num_draft is None and drafts:
        ks = k_choices(pair, k_default)
        options = [(p, k, s) for p, _, s in options for k in ks] + options
    metas = MetaPair(pair.target.raw, pair.drafter.raw if pair.drafter else None, method, dep.dtype)
    cost = CostModel(dep)
    if context is None:  # no longer than the models' positions, as `specc cost` prices it
        context = default_context(dep, pair.target.raw, pair.drafter.raw if drafts and pair.drafter else None)
    considered = []
    best: tuple[float, str, int, str, SystemPrediction] | None = None
    seen = set()
    for pipe, k, source in options:
        if (pipe, k) in seen:
            continue
        seen.add((pipe, k))
        try:
            t_ir, d_ir = metas.irs(pipe)
            if drafter_pipeline is not None and d_ir is not None:
                d_ir = metas.irs(drafter_pipeline)[1]
        except Exception as exc:
            considered.append({"pipeline": pipe, "num_draft": k, "source": source, "error": _one_line(exc)})
            continue
        pred = cost.predict(t_ir, d_ir, method=method, num_draft=k, acceptance=acceptance, context=context)
        considered.append({"pipeline": pipe, "num_draft": k, "source": source, "tokens_per_s": pred.tokens_per_s,
                           "step_s": pred.step_time})
        if best is None or pred.tokens_per_s > best[0] * (1 + 1e-9):
            best = (pred.tokens_per_s, pipe, k, source, pred)
    if best is None:
        raise UserError(f"no pipeline could be predicted for {model_name} on {dep.name}")
    _, pipe, k, source, pred = best
    prediction = {"tokens_per_s": pred.tokens_per_s, "speedup": pred.speedup, "step_s": pred.step_time,
                  "ar_step_s": pred.ar.time, "ar_tokens_per_s": pred.ar_tokens_per_s,
                  "expected_tokens_per_step": pred.expected_tokens, "deployment": dep.name,
                  "drafter_pipeline": drafter_pipeline if drafter_pipeline is not None and drafts else None,
                  "batch_size": pred.batch_size, "context": pred.context, "source": source,
                  "acceptance": acceptance.to_json(), "acceptance_source": acc_source,
                  "choice_acceptance": _describe_source(acc_source, acceptance),
                  "gap_report": pred.gap_report().to_json(), "candidates": considered,
                  "memory": str(mem.path) if mem is not None else None, "skipped": skipped}
    return Choice(pipe, k, prediction)


def _needs_measuring(acceptance: AcceptanceModel | None, k_max: int) -> bool:
    """Whether a remembered acceptance (None: none) cannot price drafts per step up to ``k_max``:
    it was measured at fewer drafts, so the positions beyond would only repeat its last alpha."""
    if acceptance is None:
        return True
    return (acceptance.measured_k or len(acceptance.alphas)) < k_max


def _as_remembered(acceptance: AcceptanceModel) -> AcceptanceModel:
    """``acceptance`` with its alphas as the search memory keeps them (``to_json`` rounds), so
    the compile that measured it and a later one that reads it back price the same numbers."""
    return dataclasses.replace(acceptance, alphas=[float(a) for a in acceptance.to_json()["alphas"]])


def _describe_source(kind: str, acceptance: AcceptanceModel) -> str:
    """Which acceptance a choice was made with, in words."""
    if kind == "memory":
        return f"{acceptance.source} (search memory)"
    if kind == "measured":
        return f"{acceptance.source} (measured for this choice: the search memory held none at this k)"
    if kind == "given":
        return f"given: {acceptance.source}"
    return acceptance.source
