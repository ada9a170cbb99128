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
from specc.models.config import ConfigError
from specc.models.loading import CheckpointError, load_config, resolve_checkpoint
from specc.models.registry import classify

METHODS = ("ar", "ar-draft", "pard", "dflash")
# drafter kind -> methods it can serve
METHODS_BY_DRAFTER = {"causal_lm": ("ar-draft",), "pard": ("pard", "ar-draft"), "dflash": ("dflash",)}
DEFAULT_METHOD = {"causal_lm": "ar-draft", "pard": "pard", "dflash": "dflash"}


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


def inspect_checkpoint(name: str) -> Checkpoint:
    try:
        path = resolve_checkpoint(name)
        raw = load_config(path)
        kind = classify(raw)
    except ConfigError as exc:
        raise UserError(f"{name}: {exc}") from exc
    except CheckpointError as exc:
        raise UserError(str(exc)) from exc
    return Checkpoint(name=str(name), path=path, raw=raw, kind=kind)


def resolve_pair(model: str, drafter: str | None = None, method: str | None = None) -> Pair:
    if method is not None and method not in METHODS:
        raise UserError(f"unknown method {method!r} (choose from {', '.join(METHODS)})")
    target = inspect_checkpoint(model)
    if target.kind != "causal_lm":
        raise UserError(f"{model} is a {target.kind} drafter, not a target model")
    if drafter is None:
        if method not in (None, "ar"):
            raise UserError(f"--method {method} needs a --drafter")
        _check_weights(target)
        return Pair(target, None, "ar")
    if method == "ar":
        raise UserError("--method ar runs the target alone; drop --drafter or choose another method")
    draft = inspect_checkpoint(drafter)
    allowed = METHODS_BY_DRAFTER[draft.kind]
    method = method or DEFAULT_METHOD[draft.kind]
    if method not in allowed:
        raise UserError(f"--method {method} does not fit {drafter} (a {draft.kind} checkpoint: use {' or '.join(allowed)})")
    _check_compatible(target, draft)
    _check_weights(target)
    _check_weights(draft)
    return Pair(target, draft, method)


def _check_weights(ckpt: Checkpoint) -> None:
    """Weights readable and matching the config, and the model fits in memory (before loading)."""
    from specc.models.registry import check_checkpoint

    check_checkpoint(ckpt.path, ckpt.raw, ckpt.kind)


def _check_compatible(target: Checkpoint, draft: Checkpoint) -> None:
    tv, dv = target.raw.get("vocab_size"), draft.raw.get("vocab_size")
    if tv != dv:
        raise UserError(f"vocabulary mismatch: target {target.name} has {tv} tokens, drafter {draft.name} has {dv}")
    if draft.kind == "dflash":
        from specc.models.dflash import DFlashSpec

        spec = DFlashSpec.from_hf(draft.raw)
        layers = int(target.raw["num_hidden_layers"])
        if draft.raw.get("hidden_size") != target.raw.get("hidden_size"):
            raise UserError(f"DFlash drafter hidden size {draft.raw.get('hidden_size')} != target's {target.raw.get('hidden_size')}")
        if max(spec.target_layer_ids) >= layers:
            raise UserError(f"DFlash target_layer_ids {list(spec.target_layer_ids)} exceed the target's {layers} layers")
        if spec.num_target_layers is not None and int(spec.num_target_layers) != layers:
            raise UserError(f"DFlash drafter was trained for a {spec.num_target_layers}-layer target, {target.name} has {layers}")


MAX_NUM_DRAFT = 255  # far beyond any useful speculation length; a typo must not allocate GBs


def check_num_draft(pair, k: int | None) -> None:
    """--num-draft within what the method can draft (a DFlash block proposes block_size - 1)."""
    if k is None:
        return
    if k < 1:
        raise UserError(f"--num-draft must be >= 1 (got {k})")
    if k > MAX_NUM_DRAFT:
        raise UserError(f"--num-draft {k} is more than {MAX_NUM_DRAFT}")
    if pair.method == "dflash":
        from specc.models.dflash import DFlashSpec

        block = DFlashSpec.from_hf(pair.drafter.raw).block_size
        if k > block - 1:
            raise UserError(f"--num-draft {k} is larger than the DFlash drafter's block allows "
                            f"(block_size {block}: at most {block - 1} drafts per step)")
