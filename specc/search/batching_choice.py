"""The batching choice per deployment: two-level verification (and its k1) or per-request k, or
neither, by the cost model's predicted tokens/s (``specc.search.batching_cost``).

``batching_section`` returns what `specc compile` writes into ``manifest["batching"]`` and the
engine applies to its loop:

    {"two_level_k1": k1 or None, "per_request_k": bool, "goodput_k": bool, "source": why,
     "batch_size": B, "num_draft": k, "acceptance_source": ..., "prior_alpha": a (where the goodput rule's
     per-request estimates start, :func:`prior_alpha`), "candidates": [priced options],
     "curve": {"rows": [...], "tokens_per_row": [1..k + 1], "seconds": [[...]]}}

The best option wins when it beats one level by :data:`MECHANISM_MARGIN` (10%); otherwise one
level (the simpler loop, and the step shape the model prices best). Why a margin: a mechanism's
steps change shape from step to step (k per step or per row, a second level), which the model
prices less surely than one level's, and every measured mechanism predicted to win by less lost:
H100, run 23, the goodput rule's one k predicted +1% / +8% over one level for specc-tiny at
B = 16 / 32 measured -27% / -25%, +2.7% for the hybrid at Qwen3.5-9B shapes, B = 16, -12%;
predicted +66% at Qwen3-8B shapes, B = 64, it measured +39%. With a
ragged step the goodput rule's one k per step (dense verify) is a candidate too, and per-request
k wins only where it beats it: where the best per-row allocation gives every row the same k, the
packed verify does the dense one's work plus the packing, which the model prices only as the
padding of the graphed step's token bucket (run 22,
H100, B = 32: per-request k with every row at k = 7 measured 9,955 steady tok/s against one
level's 12,484, where the model predicted 15,344 against 13,373). Both
mechanisms need an artifact that verifies packed rows: without one the choice is between one
level and the goodput rule's one k per step with the dense verify (``goodput_k``: what the
runtime's ``GoodputDraftLength`` does without ``ragged_seconds``), and the source says what the
mechanisms would give. At batch size 1 (one row: nothing to pack, and a second level is a second
forward of the same row), or with tree verification chosen (the options price chains), the
section says one level and why.
``curve`` is the cost model's ragged step time (drafting included) at a grid of rows and tokens
per row, which the runtime interpolates for the goodput rule (``specc.runtime.step_curve``): the
runtime cannot import the cost model.
"""

from __future__ import annotations

from typing import Any

from specc.errors import UserError, auto_off_or_int
from specc.search.acceptance import AcceptanceModel, geometric_alpha
from specc.search.batch_pricing import ragged_step_seconds
from specc.search.batching_cost import BatchingPricer

_BETTER = 1 + 1e-9
MECHANISM_MARGIN = 1.10  # a mechanism must beat one level's predicted tokens/s by this factor (module doc)


def parse_two_level(value, k: int):
    """``--two-level`` as given: "auto" (or None), "off" (-> "off"), or K1 in 1..k-1 (-> int)."""
    k1 = auto_off_or_int("auto" if value is None else value, "--two-level", "a level-1 draft count K1")
    if k1 in ("auto", "off"):
        return k1
    if k < 2:
        raise UserError(f"--two-level {k1}: two-level verification needs at least 2 drafts per step (k = {k})")
    if not 1 <= k1 < k:
        raise UserError(f"--two-level K1 needs 1 <= K1 < k = {k} (got {k1}; K1 = k is one level: --two-level off)")
    return k1


def check_given(two_level, batch_size: int, ragged: bool) -> None:
    """Refuse a given K1 the deployment or the target cannot use (before any compile work)."""
    if not isinstance(two_level, int):
        return
    if batch_size <= 1:
        raise UserError(f"--two-level {two_level}: batch size 1 has one row, so level 2 would be a second forward "
                        "of the same row (use a deployment with batch size > 1)")
    if not ragged:
        raise UserError(f"--two-level {two_level}: no ragged verify step (packed rows of their own lengths) for "
                        "this target, which level 2 needs")


def off_section(source: str, batch_size: int, num_draft: int) -> dict[str, Any]:
    return {"two_level_k1": None, "per_request_k": False, "goodput_k": False, "source": source,
            "batch_size": int(batch_size), "num_draft": int(num_draft)}


def prior_alpha(option, acceptance: AcceptanceModel, k: int) -> float:
    """Where the runtime's goodput rule starts each request's acceptance estimate: the priced
    acceptance as the one geometric alpha that gives its expected tokens at the option's mean
    drafts per row (the runtime's estimate is geometric; the model may not be: a drafter that is
    right only at the first position has alpha_1 = 0.75, alpha_2.. = 0, and E(1) = 1.75 means
    alpha 0.75, where a fit at k = 8 would say 0.43, too low for the rule to ever draft)."""
    ks = option.row_k or [k]
    drafts = max(1, min(k, round(sum(ks) / len(ks))))
    return geometric_alpha(acceptance.expected_tokens(drafts), drafts)


def curve_table(pricer: BatchingPricer, max_rows: int) -> dict[str, Any]:
    """The ragged step time (drafting included) at rows 1, 2, 4, ... up to >= ``max_rows`` and
    every tokens-per-row count 1..k + 1 (``seconds[i][j]``: rows[i] rows of tokens_per_row[j])."""
    rows = [1]
    while rows[-1] < max_rows:
        rows.append(rows[-1] * 2)
    seconds = ragged_step_seconds(pricer.cost, pricer.target_ir, pricer.draft_ir, pricer.method, pricer.context,
                                  pricer.k)
    per_row = list(range(1, pricer.k + 2))
    return {"rows": rows, "tokens_per_row": per_row, "context": pricer.context,
            "seconds": [[seconds(r, r * q) for q in per_row] for r in rows]}


def batching_section(pricer: BatchingPricer | None, batch_size: int, acceptance: AcceptanceModel | None, *,
                     two_level="auto", ragged: bool = True, tree_budget: int = 0, num_draft: int = 0,
                     per_request: bool = True, curve: bool = True) -> dict[str, Any]:
    """The choice for ``batch_size`` rows. ``pricer``: None when there are no drafts (AR);
    ``two_level``: "auto", "off" or a given k1 (:func:`parse_two_level`); ``ragged``: the target
    verifies packed rows; ``tree_budget``: the tree section's budget (> 0: trees chosen);
    ``per_request``: consider the goodput rule's draft lengths (per-request k, and one k per step
    verified dense)."""
    k = pricer.k if pricer is not None else int(num_draft)
    b = int(batch_size)
    if pricer is None or k < 1:
        return off_section("no drafts: AR decoding has one token per row to verify", b, k)
    if acceptance is None:
        return off_section("no measured acceptance to price the options with; one level", b, k)
    if tree_budget:
        return off_section(f"tree verification ({tree_budget} nodes) chosen: two-level and per-request k are "
                           "priced for chains", b, k)
    check_given(two_level, b, ragged)
    if b <= 1:
        return off_section("batch size 1: one row per step, so nothing to pack (per-request k is the step's k) "
                           "and a second level would be a second forward of the same row; one level", b, k)
    k1s = [two_level] if isinstance(two_level, int) else None
    options = pricer.options(b, acceptance, two_level=two_level != "off", per_request=per_request, k1s=k1s,
                             reference=True)
    one, dense = options[0], options[-1]

    def best_mechanism(candidates):
        """The best of ``candidates`` (mechanisms; ties: the earlier), or None."""
        best = None
        for opt in candidates:
            if best is None or opt.tokens_per_s > best.tokens_per_s * _BETTER:
                best = opt
        return best

    def chosen_of(mechanism):
        """``mechanism`` where it beats one level by the margin, else one level."""
        if mechanism is not None and mechanism.tokens_per_s > one.tokens_per_s * MECHANISM_MARGIN:
            return mechanism
        return one

    per_row = [o for o in options[:-1] if o.per_request_k]
    two_levels = [o for o in options[1:-1] if not o.per_request_k]  # two-level at each k1
    # what a ragged step allows; per-request k only where it beats one k for every row verified
    # dense (the same allocation packed costs the packing, which the model prices only as the
    # bucket's padding)
    best_packed = best_mechanism(two_levels + ([dense] + per_row if per_request else []))
    packed = chosen_of(best_packed)
    acc_src = acceptance.source or "stated"
    where = f" at B={b}, k={k} ({pricer.cost.deployment.name})"
    if isinstance(two_level, int):
        chosen = next(o for o in options if o.two_level_k1 == two_level)
        source = (f"given (--two-level {two_level}): predicted {chosen.tokens_per_s:,.0f} tok/s vs one level "
                  f"{one.tokens_per_s:,.0f}")
    elif ragged:
        chosen = packed
        off = " (two-level off)" if two_level == "off" else ""
        source = (f"cost model{off}: {chosen.option} predicted {chosen.tokens_per_s:,.0f} tok/s"
                  + ("" if chosen is one else f" vs one level {one.tokens_per_s:,.0f}") + where)
        if chosen is one:
            source += f": no mechanism beats one level by {MECHANISM_MARGIN - 1:.0%}"
            if best_packed is not None and best_packed.tokens_per_s > one.tokens_per_s:
                source += f" ({best_packed.option}: {best_packed.tokens_per_s:,.0f} predicted)"
        if chosen.per_request_k:
            source += f" (one goodput k for every row, dense verify: {dense.tokens_per_s:,.0f} tok/s)"
        elif chosen is dense and per_row:
            source += (f" (per-request k: {per_row[0].tokens_per_s:,.0f} tok/s, no better than one k for every row "
                       "verified dense)")
    else:  # no packed verify: one level, or the goodput rule's one k per step
        chosen = chosen_of(dense if per_request else None)
        source = ("no ragged verify step (packed rows of their own lengths), which two-level verification and "
                  f"per-request k need; cost model: {chosen.option} predicted {chosen.tokens_per_s:,.0f} tok/s"
                  + ("" if chosen is one else f" vs one level {one.tokens_per_s:,.0f}") + where
                  + f" (with a ragged step: {packed.option}, {packed.tokens_per_s:,.0f} tok/s)")
    section = {"two_level_k1": chosen.two_level_k1, "per_request_k": chosen.per_request_k,
               "goodput_k": chosen is dense, "source": source, "batch_size": b, "num_draft": k,
               "context": pricer.context, "acceptance_source": acc_src, "chosen": chosen.option,
               "prior_alpha": prior_alpha(chosen, acceptance, k),
               "candidates": [o.to_json() for o in options]}
    if curve:
        section["curve"] = curve_table(pricer, b)
    return section
