"""Architecture-neutral model configuration parsed from a HF ``config.json``.

specc's model definitions never read a transformers config object: they read this small
dataclass, built from the raw JSON dict. That keeps them independent of the transformers
version (4.x writes ``rope_theta``/``rope_scaling``, 5.x writes ``rope_parameters``) and makes
every field the definitions depend on visible in one place.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch


class ConfigError(ValueError):
    """A config.json that specc cannot use (unknown architecture, missing field, ...)."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    SUPPORTED = ("default", "linear", "llama3")

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "RopeConfig":
        params = dict(raw.get("rope_parameters") or {})
        scaling = raw.get("rope_scaling") or {}
        params.update({k: v for k, v in scaling.items() if v is not None})
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default")) or "default"
        if kind not in cls.SUPPORTED:
            raise ConfigError(f"rope type {kind!r} is not supported (supported: {', '.join(cls.SUPPORTED)})")
        return cls(
            theta=float(theta),
            kind=kind,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        )

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """Inverse frequencies in fp32, computed exactly as HF transformers does."""
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if self.kind == "linear":
            inv = inv / self.factor
        elif self.kind == "llama3":
            low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
            high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
            inv = torch.where(medium, smoothed, scaled)
        return inv


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything a decoder definition needs. ``family`` is 'llama' or 'qwen3'."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def num_params(self) -> int:
        """Parameter count of a decoder LM with this config (embedding counted once if tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (2 * self.head_dim if self.qk_norm else 0)
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h


FAMILY_BY_MODEL_TYPE = {"llama": "llama", "qwen3": "qwen3"}


def _require(raw: dict[str, Any], key: str) -> Any:
    if key not in raw:
        raise ConfigError(f"config.json has no {key!r}")
    return raw[key]


def _eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(e) for e in eos)


def model_config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    """Parse a Llama / Qwen3 (or Qwen3-style DFlash) config.json dict."""
    model_type = raw.get("model_type")
    family = FAMILY_BY_MODEL_TYPE.get(model_type)
    if family is None:
        raise ConfigError(
            f"unsupported model_type {model_type!r} (supported: {', '.join(sorted(FAMILY_BY_MODEL_TYPE))})"
        )
    hidden = int(_require(raw, "hidden_size"))
    heads = int(_require(raw, "num_attention_heads"))
    head_dim = raw.get("head_dim") or hidden // heads
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"hidden_act {act!r} is not supported (only 'silu')")
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    return ModelConfig(
        family=family,
        vocab_size=int(_require(raw, "vocab_size")),
        hidden_size=hidden,
        num_layers=int(_require(raw, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate_size=int(_require(raw, "intermediate_size")),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=RopeConfig.from_hf(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw),
        torch_dtype=str(dtype),
        raw=raw,
    )
