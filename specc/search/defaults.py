"""A search's defaults: the starting pipeline, drafts per step and the drafts per step it sweeps.

Drafts per step are the method's business (``specc.methods``); these helpers only read them
for a resolved pair."""

from __future__ import annotations

from specc.passes.pipelines import DEFAULT_PIPELINE

__all__ = ["default_num_draft", "default_pipeline", "k_choices", "one_line"]


def default_pipeline() -> str:
    return DEFAULT_PIPELINE


def _drafter_raw(pair):
    return pair.drafter.raw if pair.drafter is not None else None


def default_num_draft(pair) -> int:
    """Drafts per step `specc compile` uses by default (the method's; 0 without a drafter)."""
    return pair.impl.default_num_draft(_drafter_raw(pair)) if pair.impl.uses_drafter else 0


def k_choices(pair, start: int) -> list[int]:
    """Drafts per step the search tries for ``pair`` around ``start`` ([] without a drafter)."""
    return pair.impl.search_k_choices(_drafter_raw(pair), start)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
