"""DFlash drafter ("block diffusion", z-lab), checkpoint-compatible with the public drafters.

A DFlash drafter is a few Qwen3-style layers with no embedding or LM head of its own. Per step it
takes (a) hidden states of some target layers for the tokens committed since its last step
("context"), concatenated and projected by ``fc`` then ``hidden_norm``, and (b) the target's
embeddings of the block [last committed token, mask x (b - 1)] ("noise"). In every layer the
queries come from the noise, the keys/values from [context; noise], and attention is non-causal
inside the block. The context K/V are kept in the drafter's cache (they are committed), the
noise K/V are discarded by not advancing the cache length. The final hidden states go through
the target's LM head. Weight names: ``layers.*``, ``fc``, ``hidden_norm``, ``norm`` (no prefix).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from specc.models import ops
from specc.models.config import ConfigError, ModelConfig, model_config_from_hf
from specc.models.decoder import MLP, Attention, Linear, RMSNorm


@dataclasses.dataclass(frozen=True)
class DFlashSpec:
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "DFlashSpec":
        extra = raw.get("dflash_config") or {}
        if not isinstance(extra, dict):
            raise ConfigError("DFlash config: dflash_config must be an object")

        def value(name, default=None):
            return extra.get(name, raw.get(name, default))

        layer_ids = value("target_layer_ids")
        mask_id = value("mask_token_id")
        if layer_ids is None or mask_id is None:
            raise ConfigError("DFlash config needs dflash_config.target_layer_ids and mask_token_id")

        def ok_int(v, lo, hi):
            return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

        block = value("block_size", 16)
        if not ok_int(block, 2, 1024):
            raise ConfigError(f"DFlash config: block_size must be an integer in 2..1024 (got {block!r})")
        if not ok_int(mask_id, 0, 1 << 23):
            raise ConfigError(f"DFlash config: mask_token_id must be a token id (got {mask_id!r})")
        if not isinstance(layer_ids, list) or not layer_ids or not all(ok_int(i, 0, 1 << 10) for i in layer_ids):
            raise ConfigError(f"DFlash config: target_layer_ids must be a non-empty list of layer indices (got {layer_ids!r})")
        ntl = value("num_target_layers")
        if ntl is not None and not ok_int(ntl, 1, 1 << 10):
            raise ConfigError(f"DFlash config: num_target_layers must be a positive integer (got {ntl!r})")
        return cls(
            block_size=block,
            mask_token_id=mask_id,
            target_layer_ids=tuple(layer_ids),
            num_target_layers=ntl,
        )


def is_dflash_config(raw: dict[str, Any]) -> bool:
    archs = raw.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    return any(isinstance(a, str) and a.startswith("DFlash") for a in archs) or "dflash_config" in raw


class DFlashAttention(Attention):
    def forward(self, x, ctx, cos, sin, cache_len):
        """x: noise [B, Q, H]; ctx: projected context [B, C, H]; cos/sin cover [ctx; noise]."""
        num_q = x.shape[1]
        q = self.project_q(x, cos[:, -num_q:], sin[:, -num_q:])
        k, v = self.project_kv(torch.cat([ctx, x], dim=1), cos, sin)
        out = ops.attention(q, k, v, self.cache_k, self.cache_v, cache_len, "full", self.scale)
        return self.o_proj(out)


class DFlashLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, cache_len):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, cache_len)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """The drafter's own weights. ``forward`` returns normed hidden states of the block."""

    def __init__(self, cfg: ModelConfig, spec: DFlashSpec):
        super().__init__()
        self.config, self.spec = cfg, spec
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.fc = Linear(len(spec.target_layer_ids) * cfg.hidden_size, cfg.hidden_size)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", cfg.rope.inv_freq(cfg.head_dim), persistent=False)
        self.max_batch = 0
        self.max_len = 0

    @classmethod
    def from_hf_config(cls, raw: dict[str, Any]) -> "DFlashDraft":
        return cls(model_config_from_hf(raw), DFlashSpec.from_hf(raw))

    def state_specs(self) -> list:
        """Per layer a K and V cache holding context K/V of up to ``max_len`` tokens plus one
        block of noise (``extra_len`` = block size)."""
        return [spec for i, layer in enumerate(self.layers)
                for spec in layer.self_attn.state_specs(f"layers.{i}.self_attn.", self.spec.block_size)]

    def setup_caches(self, batch: int, max_len: int, dtype=None, device=None):
        """Buffers for ``state_specs()``, allocated and bound to this module."""
        from specc.models.state import allocate_buffers, bind_buffers

        dtype = dtype or self.fc.weight.dtype
        device = device or self.fc.weight.device
        bind_buffers(self, allocate_buffers(self.state_specs(), batch, max_len, dtype, device))
        self.max_batch, self.max_len = batch, max_len

    def forward(self, noise: torch.Tensor, target_hidden: torch.Tensor, positions: torch.Tensor,
                cache_len: torch.Tensor) -> torch.Tensor:
        """noise [B, Q, H], target_hidden [B, C, n*H], positions [B, C + Q], cache_len [B]."""
        ctx = self.hidden_norm(self.fc(target_hidden))
        cos, sin = ops.rope_tables(positions, self.inv_freq, noise)
        x = noise
        for layer in self.layers:
            x = layer(x, ctx, cos, sin, cache_len)
        return self.norm(x)


class DFlashDrafter(nn.Module):
    """Draft step function: the DFlash drafter bound to its target's embedding and LM head.

    forward(block_ids [B, b], target_hidden [B, C, n*H], positions [B, C + b], cache_len [B])
      -> logits [B, b - 1, V] for block slots 1..b-1 (slot 0 is the last committed token).
    """

    def __init__(self, draft: DFlashDraft, embed_tokens: nn.Embedding, lm_head: Linear):
        super().__init__()
        self.draft = draft
        self.embed_tokens = embed_tokens  # shared with the target, not copied
        self.lm_head = lm_head

    @property
    def spec(self) -> DFlashSpec:
        return self.draft.spec

    @property
    def device(self) -> torch.device:
        return self.draft.fc.weight.device

    def state_specs(self) -> list:
        return [spec.with_prefix("draft.") for spec in self.draft.state_specs()]

    def setup_caches(self, batch: int, max_len: int, dtype=None, device=None):
        return self.draft.setup_caches(batch, max_len, dtype, device)

    def forward(self, block_ids, target_hidden, positions, cache_len):
        noise = ops.embedding(block_ids, self.embed_tokens.weight)
        hidden = self.draft(noise, target_hidden, positions, cache_len)
        return self.lm_head(hidden[:, 1:])
