"""Which checkpoints specc understands, and how to build a model from one.

``classify`` looks at a raw config.json and says what the checkpoint is: a causal LM usable as
a target or AR drafter (Llama / Qwen3), a PARD drafter (a causal LM whose config carries
``pard_token``), or a DFlash drafter. ``load_model`` builds the specc definition and loads the
weights with strict name checking.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from specc.models.config import ConfigError, ModelConfig, model_config_from_hf
from specc.models.decoder import CausalLM
from specc.models.dflash import DFlashDraft, DFlashSpec, is_dflash_config
from specc.models.loading import CheckpointError, load_config, load_state_dict, load_tokenizer, resolve_checkpoint

ARCHITECTURES = {
    # name: (role, HF architectures / marker, description)
    "llama": ("target, ar drafter", "LlamaForCausalLM", "Llama 2 / 3.x: GQA/MQA, llama3 rope scaling, tied or untied"),
    "qwen3": ("target, ar drafter", "Qwen3ForCausalLM", "Qwen3 dense: per-head q/k RMSNorm"),
    "pard": ("drafter", "llama/qwen3 + config.pard_token", "PARD parallel drafter: K-1 mask tokens, causal, one forward"),
    "dflash": ("drafter", "DFlashDraftModel + dflash_config", "DFlash block drafter: target hidden states injected as K/V"),
}

KINDS = ("causal_lm", "pard", "dflash")


def classify(raw: dict[str, Any]) -> str:
    """'dflash', 'pard' or 'causal_lm'; raises ConfigError for unsupported checkpoints."""
    if is_dflash_config(raw):
        if raw.get("model_type") != "qwen3":
            raise ConfigError(f"DFlash drafter with model_type {raw.get('model_type')!r}: only qwen3-style is supported")
        model_config_from_hf(raw)  # validates every field
        DFlashSpec.from_hf(raw)
        return "dflash"
    cfg = model_config_from_hf(raw)  # validates the family and every field
    if "pard_token" in raw:
        pt = raw["pard_token"]
        if not isinstance(pt, int) or isinstance(pt, bool) or not 0 <= pt < cfg.vocab_size:
            raise ConfigError(f"config.json: pard_token {pt!r} is not a token id below vocab_size {cfg.vocab_size}")
        return "pard"
    return "causal_lm"


@dataclasses.dataclass
class Loaded:
    """A model definition with its weights, where it came from, and its tokenizer (or None)."""

    kind: str
    model: torch.nn.Module
    config: ModelConfig
    raw_config: dict[str, Any]
    path: Path
    tokenizer: Any = None

    @property
    def pard_token(self) -> int | None:
        return self.raw_config.get("pard_token")


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], path, tied: bool, assign: bool = False) -> None:
    """Copy (or, with ``assign``, share) HF-named tensors into a specc definition, strictly."""
    renamed = {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}
    if tied:
        renamed.pop("lm_head.weight", None)
    expected = dict(model.named_parameters(remove_duplicate=True))
    missing = sorted(set(expected) - set(renamed))
    unexpected = sorted(k for k in set(renamed) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} weights (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} weights (e.g. {unexpected[0]})")
        raise CheckpointError(f"{path}: weights do not match the config: {'; '.join(parts)}")
    for name, param in expected.items():
        if renamed[name].shape != param.shape:
            raise CheckpointError(f"{path}: {name} has shape {tuple(renamed[name].shape)}, config implies {tuple(param.shape)}")
    if assign:
        model.load_state_dict({k: renamed[k] for k in expected}, strict=False, assign=True)
        if tied:
            model.lm_head.weight = model.embed_tokens.weight
        return
    with torch.no_grad():
        for name, param in expected.items():
            param.copy_(renamed[name])


def check_checkpoint(path: Path, raw: dict[str, Any], kind: str, bytes_per_param: int = 4, device="cpu") -> None:
    """Before loading anything: the weight files' headers are readable and match the config
    (names and shapes, built on the meta device), and the model fits in memory."""
    from specc.models.loading import check_fits, weight_shapes

    shapes = weight_shapes(Path(path))
    try:
        with torch.device("meta"):
            if kind == "dflash":
                model: torch.nn.Module = DFlashDraft.from_hf_config(raw)
                tied = False
            else:
                cfg = model_config_from_hf(raw)
                model, tied = CausalLM(cfg), cfg.tie_word_embeddings
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    expected = {k: tuple(p.shape) for k, p in model.named_parameters(remove_duplicate=True)}
    if shapes is None:  # a config-only directory (cost model): nothing will be loaded
        return
    check_fits(sum(math.prod(s) for s in expected.values()) * bytes_per_param, f"{path}: the model", device)
    renamed = {k[len("model."):] if k.startswith("model.") else k: v for k, v in shapes.items()}
    if tied:
        renamed.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(renamed))
    unexpected = sorted(k for k in set(renamed) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        parts = ([f"missing {len(missing)} weights (e.g. {missing[0]})"] if missing else []) + \
            ([f"unexpected {len(unexpected)} weights (e.g. {unexpected[0]})"] if unexpected else [])
        raise CheckpointError(f"{path}: weights do not match the config: {'; '.join(parts)}")
    for name, shape in expected.items():
        if renamed[name] != shape:
            raise CheckpointError(f"{path}: {name} has shape {renamed[name]}, config implies {shape}")


def load_model(name_or_path, dtype: torch.dtype | None = torch.float32, device="cpu",
               with_tokenizer: bool = True) -> Loaded:
    """Load a checkpoint (path, zoo name or hub id) into its specc definition."""
    path = resolve_checkpoint(name_or_path)
    raw = load_config(path)
    try:
        kind = classify(raw)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    check_checkpoint(path, raw, kind)
    try:
        if kind == "dflash":
            model: torch.nn.Module = DFlashDraft.from_hf_config(raw)
            cfg = model.config
        else:
            cfg = model_config_from_hf(raw)
            model = CausalLM(cfg)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    load_weights(model, load_state_dict(path), path, tied=kind != "dflash" and cfg.tie_word_embeddings)
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = cfg.rope.inv_freq(cfg.head_dim).to(device)  # keep fp32 whatever the dtype
    tokenizer = load_tokenizer(path) if with_tokenizer else None
    return Loaded(kind=kind, model=model, config=cfg, raw_config=raw, path=path, tokenizer=tokenizer)
