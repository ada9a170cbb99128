"""The leaf operations of specc's model definitions.

Each function here is one meaningful node of the IR (``torch.fx.wrap`` keeps it opaque to the
tracer), so passes see ``rms_norm`` or ``attention`` rather than a dozen ATen ops. Their eager
bodies are the reference semantics: they follow HF transformers' op order and precision (fp32
statistics in RMSNorm, cos/sin cast to the activation dtype before the rotation) so a model
built from them matches HF eager on the same weights.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

# Mask kinds understood by ``attention``. "causal": query i of the block sees the committed
# cache and new keys 0..i (plain decoding, chain verification, PARD drafting). "full": every
# query sees the committed cache and every new key (DFlash's non-causal block). "tree": the
# committed cache and the new keys an explicit [Q, Q] visibility tensor allows, at or before the
# query's own slot (tree verification: ``tree_mask`` [B, Q, Q] or [Q, Q], the ancestor mask of a
# draft tree whose nodes come in topological order, so only its lower triangle is read; kernels
# skip the key tiles after a query block as for "causal"; the block's positions are base + depth,
# given by the caller). The one list of mask kinds in specc.
MASK_KINDS = ("causal", "full", "tree")
DENSE_MASK_KINDS = ("causal", "full")  # the kinds attention_mask builds without a visibility tensor


@torch.fx.wrap
def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, weight)


@torch.fx.wrap
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


@torch.fx.wrap
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@torch.fx.wrap
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@torch.fx.wrap
def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype_like: torch.Tensor):
    """cos/sin of shape [B, Q, head_dim] for integer positions [B, Q]."""
    freqs = positions[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype_like.dtype), emb.sin().to(dtype_like.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.fx.wrap
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, D] by cos/sin [B, T, D] (broadcast over heads)."""
    cos = cos.unsqueeze(2)
    sin = sin.unsqueeze(2)
    return x * cos + _rotate_half(x) * sin


def attention_mask(
    cache_len: torch.Tensor, num_queries: int, num_new_keys: int, kv_len: int, mask_kind: str,
    tree_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean visibility [B, 1, Q, kv_len] for a block written at ``cache_len`` per batch row.

    The block's ``num_new_keys`` keys occupy cache slots [cache_len, cache_len + num_new_keys);
    its queries are the last ``num_queries`` of them (DFlash writes context keys before its
    queries, so num_new_keys >= num_queries). "tree": the committed cache is visible to every
    query, block key t to query i iff ``t <= i`` and ``tree_mask[(b,) i, t]`` (num_new_keys ==
    num_queries; a tree's nodes are in topological order, so its upper triangle is never read).
    """
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {mask_kind!r} (known: {MASK_KINDS})")
    if (mask_kind == "tree") != (tree_mask is not None):
        raise ValueError("mask kind 'tree' needs a tree_mask, and only it takes one")
    device = cache_len.device
    key_pos = torch.arange(kv_len, device=device)[None, None, :]
    end = (cache_len + num_new_keys)[:, None, None]
    visible = key_pos < end
    if mask_kind == "tree":
        bsz = cache_len.shape[0]
        tm = tree_mask.bool()
        tm = tm.expand(bsz, num_queries, num_new_keys) if tm.dim() == 2 else tm
        rel = key_pos - cache_len[:, None, None]  # block slot of each key (negative: committed)
        in_block = (rel >= 0) & visible
        block_vis = tm.gather(2, rel.clamp(0, num_new_keys - 1).expand(bsz, num_queries, kv_len))
        lower = rel <= torch.arange(num_queries, device=device)[None, :, None]
        visible = (rel < 0) | (in_block & block_vis & lower)
    elif mask_kind == "causal":
        query_pos = (cache_len + num_new_keys - num_queries)[:, None, None] + torch.arange(
            num_queries, device=device
        )[None, :, None]
        visible = visible & (key_pos <= query_pos)
    else:
        visible = visible.expand(-1, num_queries, -1)
    return visible[:, None]


@torch.fx.wrap
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    cache_len: torch.Tensor,
    mask_kind: str,
    scale: float,
    tree_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write the block's K/V into a static cache and attend over it.

    q: [B, Q, Hq, D]; k, v: [B, Qk, Hkv, D] (Qk >= Q); cache_k/v: [Bmax, Hkv, S, D];
    cache_len: [B] int64, the number of committed tokens per row. New keys land in slots
    [cache_len, cache_len + Qk). Nothing is "committed" here: the caller advances its lengths,
    so rejected drafts and DFlash/PARD mask slots are discarded by not counting them.
    ``tree_mask`` ([B, Q, Q] or [Q, Q], mask kind "tree" only): ancestor-only visibility inside
    the block (tree verification). Returns [B, Q, Hq * D].
    """
    bsz, num_q, num_heads, head_dim = q.shape
    num_new = k.shape[1]
    slots = cache_len[:, None] + torch.arange(num_new, device=q.device)[None, :]  # [B, Qk]
    rows = torch.arange(bsz, device=q.device)[:, None].expand(-1, num_new)
    cache_k[rows, :, slots] = k.to(cache_k.dtype)
    cache_v[rows, :, slots] = v.to(cache_v.dtype)
    kv_len = int((cache_len + num_new).max())
    keys = cache_k[:bsz, :, :kv_len]
    values = cache_v[:bsz, :, :kv_len]
    groups = num_heads // keys.shape[1]
    if groups > 1:
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
    mask = attention_mask(cache_len, num_q, num_new, kv_len, mask_kind, tree_mask)
    qh = q.transpose(1, 2)
    scores = torch.matmul(qh, keys.transpose(2, 3)) * scale
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, values)  # [B, Hq, Q, D]
    return out.transpose(1, 2).reshape(bsz, num_q, num_heads * head_dim)


@torch.fx.wrap
def ragged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    cache_len: torch.Tensor,
    row_slots: torch.Tensor,
    row_starts: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention for a packed (ragged) block: rows with different numbers of new tokens
    (and different cache lengths) in one token axis, no padding, each row in any cache slot.

    Why: a batched verify step where each request verifies its own number of drafts (per-request
    draft length, or the second level of two-level verification, where only some requests take
    part) computes exactly the tokens it needs; the linears see T tokens, and attention walks
    each row's cache once.

    q: [1, T, Hq, D]; k, v: [1, T, Hkv, D]; cache_k/v: [S, Hkv, L, D] over S slots;
    row_slots: [R] int64, the (distinct) cache slot of row r; row_starts: [R + 1] int64,
    cumulative offsets: row r's tokens are t in [row_starts[r], row_starts[r + 1]) (possibly
    none); cache_len: [R] int64, committed tokens in row r's slot. Token t = row_starts[r] + j
    writes its K/V at ``cache[row_slots[r], :, cache_len[r] + j]`` and attends to
    ``cache[row_slots[r], :, : cache_len[r] + j + 1]``. Slots not named are untouched; nothing
    is committed (the caller advances lengths). Returns [1, T, Hq * D].
    """
    total, num_heads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    out = q.new_zeros(total, num_heads, head_dim)
    starts = row_starts.tolist()
    for r, slot in enumerate(row_slots.tolist()):
        lo, hi = starts[r], starts[r + 1]
        if hi <= lo:
            continue
        base = int(cache_len[r])
        cache_k[slot, :, base:base + hi - lo] = k[0, lo:hi].transpose(0, 1).to(cache_k.dtype)
        cache_v[slot, :, base:base + hi - lo] = v[0, lo:hi].transpose(0, 1).to(cache_v.dtype)
        row = attention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], cache_k[slot:slot + 1], cache_v[slot:slot + 1],
                        cache_len[r:r + 1], "causal", scale)
        out[lo:hi] = row[0].view(hi - lo, num_heads, head_dim)
    return out.reshape(1, total, num_heads * head_dim)
