"""Llama / Qwen3 decoder-only LMs written for speculative decoding.

One ``forward`` serves every step function: prefill (Q = prompt length), AR (Q = 1), verify
(Q = k drafted tokens + 1) and PARD drafting. Inputs carry explicit positions and per-row cache
lengths; KV caches are static buffers on the attention modules, declared by ``state_specs()``
and allocated from those declarations (``setup_caches``; ``specc.models.state``), so a step never
allocates and the whole step traces into one torch.fx graph.
Llama and Qwen3 differ only in Qwen3's per-head q/k RMSNorm.
"""

from __future__ import annotations

import torch
from torch import nn

from specc.models import ops
from specc.models.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Linear(nn.Module):
    """nn.Linear's parameters, but the forward is the ``ops.linear`` leaf the IR rewrites."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class Attention(nn.Module):
    """GQA attention over a static KV cache; ``mask_kind`` comes from the owning model."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, q_dim, cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, kv_dim, cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, kv_dim, cfg.attention_bias)
        self.o_proj = Linear(q_dim, cfg.hidden_size, cfg.attention_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)

    def state_specs(self, prefix: str = "", extra_len: int = 0) -> list:
        """This layer's decoding state: a static K and V cache, per slot (kv heads, head_dim)."""
        from specc.models.state import StateSpec

        shape = (self.num_kv_heads, self.head_dim)
        return [StateSpec(prefix + name, "kv", shape, None, extra_len) for name in ("cache_k", "cache_v")]

    def allocate_cache(self, batch: int, max_len: int, dtype: torch.dtype, device) -> None:
        from specc.models.state import allocate_buffers, bind_buffers

        bind_buffers(self, allocate_buffers(self.state_specs(), batch, max_len, dtype, device))

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        bsz, seq = x.shape[0], x.shape[1]
        k = self.k_proj(x).view(bsz, seq, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        v = self.v_proj(x).view(bsz, seq, self.num_kv_heads, self.head_dim)
        return ops.rope(k, cos, sin), v

    def project_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        bsz, seq = x.shape[0], x.shape[1]
        q = self.q_proj(x).view(bsz, seq, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return ops.rope(q, cos, sin)

    def forward(self, x, cos, sin, cache_len, mask_kind: str, tree_mask=None, ragged=None):
        if self.cache_k is None:
            raise RuntimeError("KV cache not allocated: call model.setup_caches(batch, max_len) first")
        q = self.project_q(x, cos, sin)
        k, v = self.project_kv(x, cos, sin)
        if ragged is not None:  # a packed block: (row_slots, row_starts), see CausalLM.forward
            row_slots, row_starts = ragged
            out = ops.ragged_attention(q, k, v, self.cache_k, self.cache_v, cache_len, row_slots, row_starts,
                                       self.scale)
        elif tree_mask is None:  # chain steps: the op call (and so the traced node) has no mask argument
            out = ops.attention(q, k, v, self.cache_k, self.cache_v, cache_len, mask_kind, self.scale)
        else:
            out = ops.attention(q, k, v, self.cache_k, self.cache_v, cache_len, "tree", self.scale, tree_mask)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache_len, mask_kind: str, tree_mask=None, ragged=None):
        # chain steps call attention as before (the traced node has no extra arguments)
        extra = () if tree_mask is None and ragged is None else (tree_mask,) if ragged is None else (None, ragged)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache_len, mask_kind, *extra)
        return x + self.mlp(self.post_attention_layernorm(x))


class StatefulLM(nn.Module):
    """What every specc causal LM shares around its own ``state_specs()`` and ``forward``: the
    state buffers allocated from the specs and bound on the module, the device, the embedding."""

    embed_tokens: nn.Embedding

    def setup_caches(self, batch: int, max_len: int, dtype: torch.dtype | None = None, device=None):
        """Allocate the declared state (KV caches, recurrent states) for ``batch`` rows of up to
        ``max_len`` tokens from ``state_specs()`` and bind it here (the runtime wraps it in its
        ``DecodingState``)."""
        from specc.models.state import allocate_buffers, bind_buffers

        dtype = dtype or self.embed_tokens.weight.dtype
        device = device or self.embed_tokens.weight.device
        bind_buffers(self, allocate_buffers(self.state_specs(), batch, max_len, dtype, device))
        self.max_batch, self.max_len = batch, max_len

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return ops.embedding(input_ids, self.embed_tokens.weight)


class CausalLM(StatefulLM):
    """A Llama or Qwen3 causal LM. Parameter names match HF checkpoints (``model.`` prefix
    stripped on load, see ``specc.models.loading``).

    Step interface (all steps are this one forward):
        forward(input_ids [B, Q], positions [B, Q], cache_len [B]) -> logits [B, Q, V]
    Tree verification passes ``tree_mask`` [B, Q, Q] (bool, the draft tree's ancestor mask,
    ``specc.runtime.trees.DraftTree.ancestor_mask``) with positions = base + depth: every block
    token sees the committed cache and its own root path only.
    A ragged (packed) verify passes ``row_slots`` [R] and ``row_starts`` [R + 1] with
    input_ids / positions [1, T]: row r's tokens are ``row_starts[r]:row_starts[r + 1]`` of the
    token axis, written into cache slot ``row_slots[r]`` at ``cache_len[r]`` ([R]) onward, causal
    within the row (``ops.ragged_attention``): rows verify different numbers of tokens without
    padding, and slots not named are untouched.
    With ``capture_layers`` set (DFlash targets) it returns ``(logits, hidden)`` where hidden is
    the concatenation of the listed layers' outputs [B, Q, n * H] (HF's hidden_states[i + 1]).
    ``ragged_rows`` (True) tells the runtime this step takes the ragged descriptor (packed verify).
    """

    ragged_rows = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", cfg.rope.inv_freq(cfg.head_dim), persistent=False)
        self.mask_kind = "causal"
        self.capture_layers: tuple[int, ...] = ()
        self.max_batch = 0
        self.max_len = 0

    def state_specs(self) -> list:
        """The decoding state this model declares (``specc.models.state.StateSpec``): per
        layer, its attention's K and V caches, named by attribute path from this module."""
        return [spec for i, layer in enumerate(self.layers)
                for spec in layer.self_attn.state_specs(f"layers.{i}.self_attn.")]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache_len: torch.Tensor,
                tree_mask: torch.Tensor | None = None, row_slots: torch.Tensor | None = None,
                row_starts: torch.Tensor | None = None):
        if (row_slots is None) != (row_starts is None) or (row_slots is not None and tree_mask is not None):
            raise ValueError("a ragged step takes row_slots and row_starts together, and no tree_mask")
        ragged = None if row_slots is None else (row_slots, row_starts)
        extra = () if ragged is None else (ragged,)
        x = self.embed(input_ids)
        cos, sin = ops.rope_tables(positions, self.inv_freq, x)
        captured = {}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache_len, self.mask_kind, tree_mask, *extra)
            if i in self.capture_layers:
                captured[i] = x
        normed = self.norm(x)
        logits = self.lm_head(normed)
        if self.capture_layers:
            # HF's hidden_states[last + 1] is the final-normed state; keep that convention.
            if last in captured:
                captured[last] = normed
            return logits, torch.cat([captured[i] for i in self.capture_layers], dim=-1)
        return logits
