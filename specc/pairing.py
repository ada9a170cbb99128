"""Resolving a (target, drafter, method) choice into checked checkpoint paths.

Shared by every command that takes MODEL [--drafter D] [--method M]: the checks that a user can
get wrong (a drafter that is not a drafter, mismatched vocabularies, a method that does not fit
the drafter) live here once and raise ``UserError`` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from specc.errors import UserError
from specc.methods import Method, get_method, default_method, method_names, methods_for_kind
from specc.models.config import ConfigError
from specc.models.loading import CheckpointError, load_config, resolve_checkpoint
from specc.models.registry import classify

@dataclasses.dataclass
class Checkpoint:
    name: str
    path: Path
    raw: dict[str, Any]
    kind: str


@dataclasses.dataclass
class Pair:
    target: Checkpoint
    drafter: Checkpoint | None
    method: str

    @property
    def impl(self) -> Method:
        """The registered ``specc.methods.Method`` behind ``method``."""
        return get_method(self.method)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids as HF ``generate`` uses them: generation_config.json first, then config.json."""
        gen = self.target.path / "generation_config.json"
        source = self.target.raw
        if gen.is_file():
            try:
                gen_raw = json.loads(gen.read_text())
                if gen_raw.get("eos_token_id") is not None:
                    source = gen_raw
            except json.JSONDecodeError:
                pass
        eos = source.get("eos_token_id")
        if eos is None:
            return ()
        return (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)


#: checkpoint kinds (``specc.models.registry.classify``) that can be targets; "hybrid" targets
#: (Qwen3.5 / Qwen3-Next) run eagerly and cannot be compiled yet (docs/hybrid.md)
TARGET_KINDS = ("causal_lm", "hybrid")


def inspect_checkpoint(name: str) -> Checkpoint:
    try:
        path = resolve_checkpoint(name)
        raw = load_config(path)
        kind = classify(raw)
    except ConfigError as exc:
        raise UserError(f"{name}: {exc}") from exc
    except CheckpointError as exc:
        raise UserError(str(exc)) from exc
    if kind == "hybrid":  # a multimodal Qwen3.5 checkpoint: its language model's fields
        from specc.models.hybrid_config import text_config_view

        raw = text_config_view(raw)
    return Checkpoint(name=str(name), path=path, raw=raw, kind=kind)


def resolve_pair(model: str, drafter: str | None = None, method: str | None = None) -> Pair:
    """Check a target (+ drafter) and pick the method: ``method`` if given, else the drafter
    kind's default (``specc.methods.default_method``). One-line ``UserError`` on any misfit."""
    impl = get_method(method) if method is not None else None
    target = inspect_checkpoint(model)
    if target.kind not in TARGET_KINDS:
        raise UserError(f"{model} is a {target.kind} drafter, not a target model")
    draft = inspect_checkpoint(drafter) if drafter is not None else None
    if impl is None:
        impl = default_method(draft.kind if draft is not None else None)
    if draft is not None and impl.uses_drafter and draft.kind not in impl.drafter_kinds:
        allowed = methods_for_kind(draft.kind)
        hint = f"use {' or '.join(allowed)}" if allowed else "no method drafts with one"
        raise UserError(f"--method {impl.name} does not fit {drafter} (a {draft.kind} checkpoint: {hint})")
    impl.check_pair(target, draft)
    _check_weights(target)
    if draft is not None and impl.uses_drafter:
        _check_weights(draft)
    return Pair(target, draft, impl.name)


def _check_weights(ckpt: Checkpoint) -> None:
    """Weights readable and matching the config, and the model fits in memory (before loading)."""
    from specc.models.registry import check_checkpoint

    check_checkpoint(ckpt.path, ckpt.raw, ckpt.kind)


MAX_NUM_DRAFT = 255  # far beyond any useful speculation length; a typo must not allocate GBs


def check_num_draft(pair, k: int | None) -> None:
    """--num-draft within what the pair's method can draft (a DFlash block proposes block_size - 1)."""
    if k is None:
        return
    if k < 1:
        raise UserError(f"--num-draft must be >= 1 (got {k})")
    if k > MAX_NUM_DRAFT:
        raise UserError(f"--num-draft {k} is more than {MAX_NUM_DRAFT}")
    pair.impl.num_draft(k, pair.drafter.raw if pair.drafter is not None else None)


def __getattr__(name: str):
    if name == "METHODS":  # the registered method names (kept for callers of the old constant)
        return method_names()
    raise AttributeError(name)
