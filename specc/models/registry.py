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
from specc.models.hybrid_config import hybrid_config_from_hf, is_hybrid_config
from specc.models.loading import CheckpointError, load_config, load_state_dict, load_tokenizer, resolve_checkpoint

ARCHITECTURES = {
    # name: (role, HF architectures / marker, description)
    "llama": ("target, ar drafter", "LlamaForCausalLM", "Llama 2 / 3.x: GQA/MQA, llama3 rope scaling, tied or untied"),
    "qwen3": ("target, ar drafter", "Qwen3ForCausalLM", "Qwen3 dense: per-head q/k RMSNorm"),
    "qwen3_5": ("target", "Qwen3_5ForCausalLM / Qwen3_5ForConditionalGeneration (text part)",
                "Qwen3.5 hybrid: gated DeltaNet + gated attention (docs/hybrid.md)"),
    "qwen3_next": ("target", "Qwen3NextForCausalLM (dense)", "Qwen3-Next hybrid, dense MLPs only (MoE refused)"),
    "pard": ("drafter", "llama/qwen3 + config.pard_token", "PARD parallel drafter: K-1 mask tokens, causal, one forward"),
    "dflash": ("drafter", "DFlashDraftModel + dflash_config", "DFlash block drafter: target hidden states injected as K/V"),
}

KINDS = ("causal_lm", "hybrid", "pard", "dflash")


def classify(raw: dict[str, Any]) -> str:
    """'dflash', 'pard', 'hybrid' (a Qwen3.5 / Qwen3-Next target) or 'causal_lm'; raises
    ConfigError for unsupported checkpoints."""
    if is_hybrid_config(raw):
        hybrid_config_from_hf(raw)  # validates every field (and refuses MoE)
        return "hybrid"
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


def build_model(raw: dict[str, Any], kind: str) -> tuple[torch.nn.Module, ModelConfig, bool]:
    """(definition without weights, its config, whether lm_head is tied) for a classified config."""
    if kind == "dflash":
        model: torch.nn.Module = DFlashDraft.from_hf_config(raw)
        return model, model.config, False
    if kind == "hybrid":
        from specc.models.hybrid import HybridLM

        hcfg = hybrid_config_from_hf(raw)
        return HybridLM(hcfg), hcfg, hcfg.tie_word_embeddings
    cfg = model_config_from_hf(raw)
    return CausalLM(cfg), cfg, cfg.tie_word_embeddings


def checkpoint_names(state: dict, cfg: ModelConfig, kind: str) -> dict:
    """Checkpoint tensors (or meta stand-ins) under the definition's parameter names."""
    if kind == "hybrid":
        from specc.models.hybrid_weights import to_specc_names

        return to_specc_names(state, cfg)
    return state


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """fp32 inverse frequencies over the rotated channels (hybrid attention rotates a fraction)."""
    return cfg.rope.inv_freq(getattr(cfg, "rotary_dim", 0) or cfg.head_dim)


def check_checkpoint(path: Path, raw: dict[str, Any], kind: str, bytes_per_param: int = 4, device="cpu") -> None:
    """Before loading anything: the weight files' headers are readable and match the config
    (names and shapes, built on the meta device), and the model fits in memory."""
    from specc.models.loading import check_fits, weight_shapes

    shapes = weight_shapes(Path(path))
    try:
        with torch.device("meta"):
            model, cfg, tied = build_model(raw, kind)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    expected = {k: tuple(p.shape) for k, p in model.named_parameters(remove_duplicate=True)}
    if shapes is None:  # a config-only directory (cost model): nothing will be loaded
        return
    check_fits(sum(math.prod(s) for s in expected.values()) * bytes_per_param, f"{path}: the model", device)
    if kind == "hybrid":
        try:
            meta = {k: torch.empty(v, device="meta") for k, v in shapes.items()}
            shapes = {k: tuple(t.shape) for k, t in checkpoint_names(meta, cfg, kind).items()}
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: weights do not match the config ({' '.join(str(exc).split())})") from exc
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
        model, cfg, tied = build_model(raw, kind)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    load_weights(model, checkpoint_names(load_state_dict(path), cfg, kind), path, tied=tied)
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = rope_inv_freq(cfg).to(device)  # keep fp32 whatever the dtype
    tokenizer = load_tokenizer(path) if with_tokenizer else None
    return Loaded(kind=kind, model=model, config=cfg, raw_config=raw, path=path, tokenizer=tokenizer)
