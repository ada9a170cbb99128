"""Qwen3.5 / Qwen3-Next text models: gated DeltaNet layers interleaved with gated attention.

The same step interface as ``specc.models.decoder.CausalLM`` (one forward for prefill, AR,
chain verify and tree verify; ``capture_layers`` for DFlash drafters), so the loops and drafters
need not know a target is hybrid. What differs is the decoding state:

- attention layers keep static K/V caches (kind ``kv``: a rejected draft is dropped by not
  counting it);
- GDN layers keep a recurrent matrix state (kind ``recurrent``, fp32 [Hv, dk, dv] per slot) and a
  conv window (kind ``conv``, the last K - 1 pre-conv columns). Neither can be rolled back by a
  length, so each buffer has ``2 + max_block`` entries per slot: entry 0 is the live state,
  entry ``1 + n`` the state after the step's first n tokens (chain) -- entry 1 the state before
  the step, entry ``2 + i`` the state after block node i in general (trees: after node i's
  ancestor path). A step reads entry 0 and writes the others; a chain step also writes its
  final state into entry 0, so prefill and forced blocks need no commit. Committing ``a``
  tokens of a chain copies entry ``1 + a`` to 0; committing a tree path copies the entry of the
  path's last node (``specc.runtime.state``: kinds ``recurrent`` / ``conv``).
- a row whose ``cache_len`` is 0 starts a new sequence: its recurrent state and conv window
  read as zeros (as KV rows read nothing before ``cache_len``).

Parameter names match HF ``Qwen3_5ForCausalLM`` (``model.`` stripped on load); Qwen3-Next's
fused projections are rearranged into these names by ``specc.models.hybrid_weights``.
"""

from __future__ import annotations

import torch
from torch import nn

from specc.models import gdn, ops
from specc.models.decoder import MLP, Linear, StatefulLM
from specc.models.hybrid_config import HybridConfig


class OffsetRMSNorm(nn.Module):
    """Zero-centred RMSNorm (scale 1 + weight), as every Qwen3.5 norm outside the GDN output."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gdn.rms_norm_offset(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gdn.gated_rms_norm(x, gate, self.weight, self.eps)


class DepthwiseConv(nn.Module):
    """Holds the GDN conv weight [C, 1, K] under HF's name (``conv1d.weight``)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


def _block_specs(prefix: str, names_shapes, extra: int) -> list:
    from specc.models.state import StateSpec

    return [StateSpec(prefix + name, kind, shape, "float32" if kind == "recurrent" else None, extra)
            for name, kind, shape in names_shapes]


class GatedDeltaNet(nn.Module):
    """One GDN token mixer with its recurrent state and conv window (see the module doc)."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.channels = cfg.conv_channels
        self.in_proj_qkv = Linear(cfg.hidden_size, self.channels)
        self.in_proj_z = Linear(cfg.hidden_size, self.hv * self.dv)
        self.in_proj_b = Linear(cfg.hidden_size, self.hv)
        self.in_proj_a = Linear(cfg.hidden_size, self.hv)
        self.conv1d = DepthwiseConv(self.channels, self.kernel)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(self.hv * self.dv, cfg.hidden_size)
        self.register_buffer("recurrent_state", None, persistent=False)
        self.register_buffer("conv_state", None, persistent=False)

    def state_specs(self, prefix: str = "", max_block: int = 16) -> list:
        """Recurrent state (fp32 [Hv, dk, dv]) and conv window ([C, K - 1]) per slot, each with
        ``1 + max_block`` snapshot entries after the live one (``extra_len``)."""
        return _block_specs(prefix, [("recurrent_state", "recurrent", (self.hv, self.dk, self.dv)),
                                     ("conv_state", "conv", (self.channels, self.kernel - 1))], max_block + 1)

    def forward(self, x: torch.Tensor, cache_len: torch.Tensor, parents: torch.Tensor | None) -> torch.Tensor:
        """One step over a block (chain: ``parents`` None; tree: [B, Q]); the two state ops read
        the live entries and write the snapshot entries (``specc.models.gdn`` step ops)."""
        if self.recurrent_state is None:
            raise RuntimeError("GDN state not allocated: call model.setup_caches(batch, max_len) first")
        if parents is None:
            mixed = gdn.conv_step(self.in_proj_qkv(x), self.conv_state, self.conv1d.weight, cache_len)
        else:
            mixed = gdn.conv_step(self.in_proj_qkv(x), self.conv_state, self.conv1d.weight, cache_len, parents)
        g, beta = gdn.gdn_gates(self.in_proj_b(x), self.in_proj_a(x), self.A_log, self.dt_bias)
        if parents is None:
            out = gdn.delta_rule_step(mixed, g, beta, self.recurrent_state, cache_len, self.hk)
        else:
            out = gdn.delta_rule_step(mixed, g, beta, self.recurrent_state, cache_len, self.hk, parents)
        return self.out_proj(gdn.gated_head_norm(out, self.in_proj_z(x), self.norm.weight, self.norm.eps))


class GatedAttention(nn.Module):
    """Full attention with a per-head output gate (q_proj yields [q, gate] per head), zero-centred
    q/k RMSNorm and rotary over the first ``rotary_dim`` channels of each head."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        self.scale = cfg.head_dim**-0.5
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, 2 * q_dim, cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, kv_dim, cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, kv_dim, cfg.attention_bias)
        self.o_proj = Linear(q_dim, cfg.hidden_size, cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)

    def state_specs(self, prefix: str = "", extra_len: int = 0) -> list:
        from specc.models.state import StateSpec

        shape = (self.num_kv_heads, self.head_dim)
        return [StateSpec(prefix + name, "kv", shape, None, extra_len) for name in ("cache_k", "cache_v")]

    def _rope(self, x, cos, sin):
        r = self.rotary_dim
        return torch.cat([ops.rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def forward(self, x, cos, sin, cache_len, tree_mask=None):
        if self.cache_k is None:
            raise RuntimeError("KV cache not allocated: call model.setup_caches(batch, max_len) first")
        bsz, seq = x.shape[0], x.shape[1]
        q, gate = self.q_proj(x).view(bsz, seq, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self._rope(self.q_norm(q), cos, sin)
        k = self._rope(self.k_norm(self.k_proj(x).view(bsz, seq, self.num_kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(bsz, seq, self.num_kv_heads, self.head_dim)
        if tree_mask is None:
            out = ops.attention(q, k, v, self.cache_k, self.cache_v, cache_len, "causal", self.scale)
        else:
            out = ops.attention(q, k, v, self.cache_k, self.cache_v, cache_len, "tree", self.scale, tree_mask)
        out = out * torch.sigmoid(gate.reshape(bsz, seq, -1))
        return self.o_proj(out)


class HybridLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache_len, tree_mask, parents):
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            h = self.linear_attn(h, cache_len, parents)
        else:
            h = self.self_attn(h, cos, sin, cache_len, tree_mask)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridLM(StatefulLM):
    """A Qwen3.5 / Qwen3-Next causal LM (dense).

    forward(input_ids [B, Q], positions [B, Q], cache_len [B], tree_mask [B, Q, Q] | None)
    -> logits [B, Q, V], or (logits, hidden) with ``capture_layers`` set (DFlash targets).
    ``max_block``: the largest verify block whose per-node states are kept for a commit
    (``setup_caches(..., max_block=)``); longer chains (prefill) keep only their final state."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(cfg, kind) for kind in cfg.layer_types)
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", cfg.rope.inv_freq(cfg.rotary_dim), persistent=False)
        self.mask_kind = "causal"
        self.capture_layers: tuple[int, ...] = ()
        self.max_batch = self.max_len = 0
        self.max_block = 16

    def state_specs(self) -> list:
        """Per attention layer its K/V caches; per GDN layer its recurrent state and conv window."""
        specs = []
        for i, layer in enumerate(self.layers):
            if layer.kind == "linear_attention":
                specs += layer.linear_attn.state_specs(f"layers.{i}.linear_attn.", self.max_block)
            else:
                specs += layer.self_attn.state_specs(f"layers.{i}.self_attn.")
        return specs

    def setup_caches(self, batch: int, max_len: int, dtype: torch.dtype | None = None, device=None,
                     max_block: int | None = None):
        """Allocate every state buffer from ``state_specs()``; ``max_block``: the largest block a
        verify step commits a prefix or path of (default: the last one set, 16)."""
        if max_block is not None:
            self.max_block = int(max_block)
        super().setup_caches(batch, max_len, dtype, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache_len: torch.Tensor,
                tree_mask: torch.Tensor | None = None):
        x = self.embed(input_ids)
        cos, sin = ops.rope_tables(positions, self.inv_freq, x)
        parents = None if tree_mask is None else gdn.tree_parents(tree_mask, x)
        captured = {}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache_len, tree_mask, parents)
            if i in self.capture_layers:
                captured[i] = x
        normed = self.norm(x)
        logits = self.lm_head(normed)
        if self.capture_layers:
            if last in captured:
                captured[last] = normed
            return logits, torch.cat([captured[i] for i in self.capture_layers], dim=-1)
        return logits
