"""A search's defaults: the starting pipeline, drafts per step and the drafts per step it sweeps."""

from __future__ import annotations

from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.search.proposers import K_CHOICES

__all__ = ["K_CHOICES", "default_num_draft", "default_pipeline", "k_choices", "one_line"]


def default_pipeline() -> str:
    return DEFAULT_PIPELINE


def default_num_draft(pair) -> int:
    """Drafts per step `specc compile` uses by default: 4 ar-draft, 8 pard, block_size - 1 dflash."""
    if pair.method == "dflash":
        from specc.models.dflash import DFlashSpec

        return DFlashSpec.from_hf(pair.drafter.raw).block_size - 1
    return {"pard": 8, "ar-draft": 4}.get(pair.method, 0)


def k_choices(pair, start: int) -> list[int]:
    if pair.method == "ar":
        return []
    ks = set(K_CHOICES.get(pair.method, ()))
    if pair.method == "dflash":
        ks = {k for k in ks if k <= default_num_draft(pair)} | {default_num_draft(pair)}
    ks.add(start)
    return sorted(k for k in ks if k >= 1)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
