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


from specc.errors import UserError


class ConfigError(UserError, ValueError):
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
        rp, scaling = raw.get("rope_parameters") or {}, raw.get("rope_scaling") or {}
        if not isinstance(rp, dict) or not isinstance(scaling, dict):
            raise ConfigError("config.json: rope_parameters / rope_scaling must be objects")
        params = dict(rp)
        params.update({k: v for k, v in scaling.items() if v is not None})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default")) or "default"
        if not isinstance(kind, str) or kind not in cls.SUPPORTED:
            raise ConfigError(f"rope type {kind!r} is not supported (supported: {', '.join(cls.SUPPORTED)})")
        return cls(
            theta=config_float(params, "rope_theta", 10000.0, 0.0, 1e12),
            kind=kind,
            factor=config_float(params, "factor", 1.0, 0.0, 1e6),
            low_freq_factor=config_float(params, "low_freq_factor", 1.0, 0.0, 1e6),
            high_freq_factor=config_float(params, "high_freq_factor", 4.0, 0.0, 1e6),
            original_max_position_embeddings=config_int(params, "original_max_position_embeddings", 8192),
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


# Upper bounds far above any real model, low enough that a typo cannot allocate the machine away.
LIMITS = {"hidden_size": 1 << 17, "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12,
          "head_dim": 1 << 12, "intermediate_size": 1 << 19, "vocab_size": 1 << 23, "num_hidden_layers": 1 << 10,
          "max_position_embeddings": 1 << 24}


def config_int(raw: dict[str, Any], key: str, default: Any = None, lo: int = 1) -> int:
    """An integer config field in [lo, LIMITS[key]] (an integral float like 4096.0 is accepted)."""
    v = raw.get(key, default) if default is not None else _require(raw, key)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConfigError(f"config.json: {key} must be an integer (got {v!r})")
    hi = LIMITS.get(key, 1 << 31)
    if not lo <= v <= hi:
        raise ConfigError(f"config.json: {key} = {v} is out of range ({lo}..{hi})")
    return v


def config_float(raw: dict[str, Any], key: str, default: float, lo: float, hi: float, open_lo: bool = True) -> float:
    import math

    v = raw.get(key, default)
    if v is None:
        v = default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
            or v < lo or v > hi or (open_lo and v == lo):
        raise ConfigError(f"config.json: {key} must be a number in {'(' if open_lo else '['}{lo}, {hi}] (got {v!r})")
    return float(v)


def _token_id(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ConfigError(f"config.json: {what} must be a non-negative token id (got {v!r})")
    return v


def _eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    if isinstance(eos, int) and not isinstance(eos, bool):
        return (_token_id(eos, "eos_token_id"),)
    if not isinstance(eos, list):
        raise ConfigError(f"config.json: eos_token_id must be a token id or a list of them (got {eos!r})")
    return tuple(_token_id(e, "eos_token_id") for e in eos)


def model_config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    """Parse a Llama / Qwen3 (or Qwen3-style DFlash) config.json dict."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json must hold one JSON object")
    model_type = raw.get("model_type")
    family = FAMILY_BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ConfigError(
            f"unsupported model_type {model_type!r} (supported: {', '.join(sorted(FAMILY_BY_MODEL_TYPE))})"
        )
    hidden = config_int(raw, "hidden_size")
    heads = config_int(raw, "num_attention_heads")
    kv_heads = config_int(raw, "num_key_value_heads", heads) if raw.get("num_key_value_heads") is not None else heads
    if heads % kv_heads:
        raise ConfigError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if raw.get("head_dim") is not None:
        head_dim = config_int(raw, "head_dim")
    else:
        if hidden % heads:
            raise ConfigError(f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        head_dim = hidden // heads
    if head_dim % 2:
        raise ConfigError(f"config.json: head_dim {head_dim} must be even (rotary embedding)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"hidden_act {act!r} is not supported (only 'silu')")
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"config.json: dtype {dtype!r} is not float32, bfloat16 or float16")
    vocab = config_int(raw, "vocab_size")
    for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        if not isinstance(raw.get(key, False), bool) and raw.get(key) is not None:
            raise ConfigError(f"config.json: {key} must be true or false (got {raw.get(key)!r})")
    bos = raw.get("bos_token_id")
    if bos is not None:
        _token_id(bos, "bos_token_id")
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=config_int(raw, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=config_int(raw, "intermediate_size"),
        rms_norm_eps=config_float(raw, "rms_norm_eps", 1e-6, 0.0, 1.0),
        rope=RopeConfig.from_hf(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
        max_position_embeddings=config_int(raw, "max_position_embeddings", 4096),
        bos_token_id=bos,
        eos_token_ids=_eos_ids(raw),
        torch_dtype=str(dtype),
        raw=raw,
    )
