"""Configuration of hybrid recurrent targets (Qwen3.5 / Qwen3-Next): gated DeltaNet + gated attention.

These checkpoints interleave gated DeltaNet (GDN) linear-attention layers with gated full
attention (``layer_types``; by default layer i is full attention when (i + 1) % 4 == 0). A
:class:`HybridConfig` is a :class:`~specc.models.config.ModelConfig` (the attention layers' and
the MLP's fields, parsed the same way) plus the GDN fields and the rotary fraction, read from the
raw ``config.json``:

- ``qwen3_5_text``: a text-only Qwen3.5 checkpoint (``Qwen3_5ForCausalLM``);
- ``qwen3_5``: a multimodal Qwen3.5 checkpoint; its ``text_config`` is used, the vision tower is
  ignored (weights under ``model.language_model.``);
- ``qwen3_next``: Qwen3-Next, dense only. Its mixture-of-experts MLP layers are refused with a
  one-line error (specc has no MoE layer yet); the GDN input projections are stored fused per
  key-head group there and are rearranged at load time (``specc.models.hybrid_weights``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specc.models.config import ConfigError, ModelConfig, config_float, config_int

HYBRID_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next")
LAYER_KINDS = ("linear_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class HybridConfig(ModelConfig):
    """``layer_types[i]``: 'linear_attention' (GDN) or 'full_attention' (gated attention).
    GDN: ``linear_num_key_heads`` q/k heads of ``linear_key_head_dim``, ``linear_num_value_heads``
    v heads of ``linear_value_head_dim`` (each q/k head serves Hv / Hk consecutive v heads), a
    depthwise causal conv of ``linear_conv_kernel_dim`` taps. Attention: rotary over the first
    ``rotary_dim`` channels of each head. ``layout``: how the checkpoint stores GDN projections
    ('qwen3_5': separate qkv / z / b / a; 'qwen3_next': fused qkvz and ba per key-head group).
    ``weight_prefix``: the prefix of the language model's weights in the checkpoint."""

    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 1
    linear_key_head_dim: int = 1
    linear_value_head_dim: int = 1
    linear_conv_kernel_dim: int = 4
    rotary_dim: int = 0
    layout: str = "qwen3_5"
    weight_prefix: str = "model."

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def conv_channels(self) -> int:
        """Channels of the GDN short convolution: q, k (Hk * dk each) and v (Hv * dv)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * 2 * q + 2 * h * kv + q * h + 2 * self.head_dim
        vdim, hv = self.linear_num_value_heads * self.linear_value_head_dim, self.linear_num_value_heads
        gdn = h * self.conv_channels + h * vdim + 2 * h * hv + vdim * h + \
            self.conv_channels * self.linear_conv_kernel_dim + 2 * hv + self.linear_value_head_dim
        mixers = sum(gdn if t == "linear_attention" else attn for t in self.layer_types)
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return mixers + self.num_layers * (3 * h * i + 2 * h) + embed + h


def is_hybrid_config(raw: dict[str, Any]) -> bool:
    return isinstance(raw, dict) and raw.get("model_type") in HYBRID_MODEL_TYPES


def _text_part(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The language model's config and its weights' prefix (multimodal qwen3_5 nests text_config)."""
    if raw.get("model_type") == "qwen3_5":
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("config.json: a qwen3_5 checkpoint needs a text_config object")
        merged = dict(text)
        for key in ("eos_token_id", "bos_token_id", "dtype", "torch_dtype"):
            if key not in merged and key in raw:
                merged[key] = raw[key]
        if "tie_word_embeddings" in raw:  # the multimodal model ties its lm_head by the top-level flag
            merged["tie_word_embeddings"] = raw["tie_word_embeddings"]
        return merged, "model.language_model."
    return raw, "model."


def text_config_view(raw: dict[str, Any]) -> dict[str, Any]:
    """A multimodal qwen3_5 config as its language model's flat config (model_type
    ``qwen3_5_text``), which pairing checks read (vocab_size, hidden_size, ...); other configs
    unchanged. Weights load the same either way (``hybrid_weights`` accepts both prefixes)."""
    if not isinstance(raw, dict) or raw.get("model_type") != "qwen3_5":
        return raw
    text, _ = _text_part(raw)
    return {**text, "model_type": "qwen3_5_text"}


def _layer_types(raw: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    types = raw.get("layer_types")
    if types is None:
        interval = config_int(raw, "full_attention_interval", 4)
        return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))
    if not isinstance(types, list) or len(types) != num_layers or any(t not in LAYER_KINDS for t in types):
        raise ConfigError(f"config.json: layer_types must list {num_layers} of {', '.join(LAYER_KINDS)}")
    return tuple(types)


def _check_dense(raw: dict[str, Any], num_layers: int) -> None:
    """Qwen3-Next: every MLP must be dense (no experts, or all layers in mlp_only_layers)."""
    experts = raw.get("num_experts") or 0
    if not isinstance(experts, int) or experts <= 0:
        return
    only = raw.get("mlp_only_layers") or []
    step = raw.get("decoder_sparse_step", 1) or 1
    sparse = [i for i in range(num_layers) if i not in only and (i + 1) % step == 0]
    if sparse:
        raise ConfigError(f"qwen3_next with mixture-of-experts layers ({len(sparse)} of {num_layers}, "
                          f"num_experts={experts}) is not supported: specc runs dense Qwen3-Next only")


def hybrid_config_from_hf(raw: dict[str, Any]) -> HybridConfig:
    """Parse a qwen3_5 / qwen3_5_text / qwen3_next config.json dict (one-line ConfigError)."""
    from specc.models.config import model_config_from_hf

    if not is_hybrid_config(raw):
        raise ConfigError(f"not a hybrid checkpoint (model_type {raw.get('model_type')!r}; "
                          f"hybrid: {', '.join(HYBRID_MODEL_TYPES)})")
    text, prefix = _text_part(raw)
    layout = "qwen3_next" if raw.get("model_type") == "qwen3_next" else "qwen3_5"
    rope = text.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError("config.json: rope_parameters must be an object")
    fraction = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    # the attention / MLP fields: the same parser as Llama / Qwen3 (a qwen3-style copy of the dict)
    base_raw = {k: v for k, v in text.items() if k != "rope_parameters"}
    base_raw["rope_parameters"] = {k: v for k, v in rope.items()
                                   if k not in ("partial_rotary_factor", "mrope_section", "mrope_interleaved")}
    base_raw["model_type"] = "qwen3"
    base = model_config_from_hf(base_raw)
    layers = base.num_layers
    types = _layer_types(text, layers)
    if layout == "qwen3_next":
        _check_dense(text, layers)
    fraction = config_float({"partial_rotary_factor": fraction}, "partial_rotary_factor", 0.25, 0.0, 1.0)
    rotary_dim = int(base.head_dim * fraction)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(f"config.json: partial_rotary_factor {fraction} gives rotary dim {rotary_dim} "
                          f"(must be even and >= 2) for head_dim {base.head_dim}")
    hk = config_int(text, "linear_num_key_heads", 16)
    hv = config_int(text, "linear_num_value_heads", 32)
    if hv % hk:
        raise ConfigError(f"config.json: linear_num_value_heads {hv} is not a multiple of linear_num_key_heads {hk}")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ModelConfig)}
    fields.update(family=layout if layout == "qwen3_next" else "qwen3_5", qk_norm=True, raw=raw)
    return HybridConfig(
        **fields,
        layer_types=types,
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
        linear_key_head_dim=config_int(text, "linear_key_head_dim", 128),
        linear_value_head_dim=config_int(text, "linear_value_head_dim", 128),
        linear_conv_kernel_dim=config_int(text, "linear_conv_kernel_dim", 4),
        rotary_dim=rotary_dim,
        layout=layout,
        weight_prefix=prefix,
    )
