"""A reference DFlash drafter over HF transformers building blocks.

DFlash has no HF class, so stock needs one: this module follows the published architecture
(z-lab DFlash, "block diffusion") with transformers' Qwen3 MLP/RMSNorm/rotary embedding and an
HF ``DynamicCache``, written independently of ``specc.models.dflash`` so each checks the other.
It loads the public checkpoints' weights (``layers.*``, ``fc``, ``hidden_norm``, ``norm``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from specc.models.dflash import DFlashSpec


class _Attention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads, self.num_kv = config.num_attention_heads, config.num_key_value_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, cache):
        bsz, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(bsz, q_len, -1, self.head_dim)).transpose(1, 2)
        kv_in = torch.cat([ctx, x], dim=1)
        k = self.k_norm(self.k_proj(kv_in).view(bsz, kv_in.shape[1], -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_in).view(bsz, kv_in.shape[1], -1, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
        k = k * cos + rotate_half(k) * sin
        k, v = cache.update(k, v, self.layer_idx)
        groups = self.num_heads // self.num_kv
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


class _Layer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = _Attention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, cache):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashReference(nn.Module):
    """forward(noise_embedding, target_hidden, position_ids, cache) -> normed hidden [B, Q, H]."""

    def __init__(self, raw_config: dict):
        super().__init__()
        fields = {k: v for k, v in raw_config.items() if k not in ("architectures", "auto_map", "dflash_config")}
        self.config = Qwen3Config(**fields)
        self.spec = DFlashSpec.from_hf(raw_config)
        hidden = self.config.hidden_size
        self.layers = nn.ModuleList(_Layer(self.config, i) for i in range(self.config.num_hidden_layers))
        self.fc = nn.Linear(len(self.spec.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=self.config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=self.config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(self.config)

    def forward(self, noise_embedding, target_hidden, position_ids, cache):
        ctx = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self.rotary_emb(noise_embedding, position_ids)
        x = noise_embedding
        for layer in self.layers:
            x = layer(x, ctx, cos, sin, cache)
        return self.norm(x)

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32, device="cpu") -> "DFlashReference":
        from specc.models.loading import load_config, load_state_dict, resolve_checkpoint

        path = resolve_checkpoint(path)
        model = cls(load_config(path))
        result = model.load_state_dict(load_state_dict(path), strict=False)
        if result.missing_keys:
            raise ValueError(f"{path}: DFlash weights missing: {result.missing_keys[:3]}")
        return model.to(device=device, dtype=dtype).eval()
