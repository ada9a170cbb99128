"""Fused (per-head q/k RMSNorm) + rotary embedding + KV-cache write, one launch per layer.

Computes exactly what the model definitions do (``specc.models.ops``): cos/sin from integer
positions and ``inv_freq`` in fp32 (``freqs = pos * inv_freq``; ``cos``/``sin`` through
libdevice, then rounded to the activation dtype as HF does), Qwen3's per-head RMSNorm of q and k
when norm weights are given (fp32 statistics, ``w * (x * rstd).to(dtype)``), the rotation
``x * cos + rotate_half(x) * sin`` with the reference's roundings (each product, then the sum),
and the cache write of the rotated k and of v at slots ``cache_len[b] + t`` (cast to the cache
dtype). Compiled without FMA contraction, so the roundings really happen where the reference has
them (bit-identical outputs up to last-bit differences of cos/sin/rsqrt). q's positions are the last Q of the Qk key positions (DFlash: context keys come first).
Slots past the cache's capacity are not written (no host check; the reference raises).

Inputs may be strided views (e.g. slices of one fused qkv projection): only the head dim must be
contiguous. One program per (row, key token) handles all heads of that token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    next_pow2,
    precise_cos,
    precise_sin,
    round_to,
    rounded,
    tl_dtype,
    use_triton,
)
from specc.codegen.kernels.pdl import pdl_args, pdl_wait
from specc.models import ops

__all__ = ["rope_and_cache", "rope_and_cache_reference"]


@triton.jit
def _load_heads(x_ptr, stride_h, H, HALF, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """The two halves [BLOCK_H, BLOCK_HALF] of the first H heads of one token, as fp32."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_f = tl.arange(0, BLOCK_HALF)
    m = (offs_h < H)[:, None] & (offs_f < HALF)[None, :]
    p = x_ptr + offs_h.to(tl.int64)[:, None] * stride_h + offs_f[None, :]
    return tl.load(p, mask=m, other=0.0).to(tl.float32), tl.load(p + HALF, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _norm_rope(x1, x2, w_ptr, cos, sin, eps, HALF,
               HAS_NORM: tl.constexpr, X_DTYPE: tl.constexpr, N_DTYPE: tl.constexpr,
               BLOCK_HALF: tl.constexpr):
    """Rotated (and normed) halves of loaded heads, fp32 holding N_DTYPE values."""
    offs_f = tl.arange(0, BLOCK_HALF)
    if HAS_NORM:
        ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
        rstd = tl.rsqrt(ms + eps)[:, None]
        w1 = tl.load(w_ptr + offs_f, mask=offs_f < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs_f, mask=offs_f < HALF, other=0.0).to(tl.float32)[None, :]
        x1 = rounded(w1 * rounded(x1 * rstd, X_DTYPE), N_DTYPE)
        x2 = rounded(w2 * rounded(x2 * rstd, X_DTYPE), N_DTYPE)
    c = cos[None, :]
    s = sin[None, :]
    o1 = rounded(rounded(x1 * c, N_DTYPE) + rounded(-(x2 * s), N_DTYPE), N_DTYPE)
    o2 = rounded(rounded(x2 * c, N_DTYPE) + rounded(x1 * s, N_DTYPE), N_DTYPE)
    return o1, o2


@triton.jit
def _rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, invf_ptr, qw_ptr, kw_ptr, qo_ptr, ck_ptr, cv_ptr, len_ptr,
    QN, QK, HQ, HKV, HALF, S, eps,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh, stride_pb, stride_pt,
    stride_ob, stride_ot, stride_oh,
    stride_ckb, stride_ckh, stride_cks, stride_cvb, stride_cvh, stride_cvs,
    HAS_QN: tl.constexpr, HAS_KN: tl.constexpr,
    ACT_DTYPE: tl.constexpr, QX_DTYPE: tl.constexpr, Q_DTYPE: tl.constexpr,
    KX_DTYPE: tl.constexpr, K_DTYPE: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl_wait(PDL)
    # Every load is issued before any store: the kernel is latency-bound (one token per
    # program), and loads placed after a store would wait for it (the compiler cannot prove the
    # pointers disjoint).
    pid = tl.program_id(0)
    b = pid // QK
    t = pid % QK
    b64 = b.to(tl.int64)
    qi = t - (QK - QN)  # the last QN key positions are the queries
    HQ_T = tl.where(qi >= 0, HQ, 0)  # heads of q this token has (a context key has none)
    qi = tl.maximum(qi, 0)
    pos = tl.load(pos_ptr + b64 * stride_pb + t * stride_pt).to(tl.float32)
    slot = tl.load(len_ptr + b).to(tl.int64) + t
    offs_f = tl.arange(0, BLOCK_HALF)
    invf = tl.load(invf_ptr + offs_f, mask=offs_f < HALF, other=0.0).to(tl.float32)
    k1, k2 = _load_heads(k_ptr + b64 * stride_kb + t * stride_kt, stride_kh, HKV, HALF,
                         BLOCK_HKV, BLOCK_HALF)
    v1, v2 = _load_heads(v_ptr + b64 * stride_vb + t * stride_vt, stride_vh, HKV, HALF,
                         BLOCK_HKV, BLOCK_HALF)
    q1, q2 = _load_heads(q_ptr + b64 * stride_qb + qi * stride_qt, stride_qh, HQ_T, HALF,
                         BLOCK_HQ, BLOCK_HALF)
    freqs = pos * invf
    cos = rounded(precise_cos(freqs), ACT_DTYPE)
    sin = rounded(precise_sin(freqs), ACT_DTYPE)

    # k: norm + rope, then into the cache; v: into the cache
    k1, k2 = _norm_rope(k1, k2, kw_ptr, cos, sin, eps, HALF, HAS_KN, KX_DTYPE, K_DTYPE, BLOCK_HALF)
    q1, q2 = _norm_rope(q1, q2, qw_ptr, cos, sin, eps, HALF, HAS_QN, QX_DTYPE, Q_DTYPE, BLOCK_HALF)
    offs_h = tl.arange(0, BLOCK_HKV).to(tl.int64)
    mk = (offs_h < HKV)[:, None] & (offs_f < HALF)[None, :]
    mkc = mk & ((offs_h * 0 + slot) < S)[:, None] & ((offs_h * 0 + slot) >= 0)[:, None]
    ck = ck_ptr + b64 * stride_ckb + offs_h[:, None] * stride_ckh + slot * stride_cks \
        + offs_f[None, :]
    cdt = ck_ptr.dtype.element_ty
    tl.store(ck, round_to(k1, cdt), mask=mkc)
    tl.store(ck + HALF, round_to(k2, cdt), mask=mkc)
    cv = cv_ptr + b64 * stride_cvb + offs_h[:, None] * stride_cvh + slot * stride_cvs \
        + offs_f[None, :]
    vdt = cv_ptr.dtype.element_ty
    tl.store(cv, round_to(v1, vdt), mask=mkc)
    tl.store(cv + HALF, round_to(v2, vdt), mask=mkc)
    offs_q = tl.arange(0, BLOCK_HQ).to(tl.int64)
    mq = (offs_q < HQ_T)[:, None] & (offs_f < HALF)[None, :]
    qo = qo_ptr + b64 * stride_ob + qi * stride_ot + offs_q[:, None] * stride_oh + offs_f[None, :]
    odt = qo_ptr.dtype.element_ty
    tl.store(qo, round_to(q1, odt), mask=mq)
    tl.store(qo + HALF, round_to(q2, odt), mask=mq)


def _check(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, qw, kw, op):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("positions", positions, op, ndim=2, dtypes=(torch.int64, torch.int32))
    check_tensor("inv_freq", inv_freq, op, ndim=1, dtypes=FLOAT_DTYPES)
    check_tensor("cache_k", cache_k, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_v", cache_v, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_len", cache_len, op, ndim=1, dtypes=(torch.int64, torch.int32))
    bsz, num_q, hq, d = q.shape
    _, num_k, hkv, dk = k.shape
    if k.shape[0] != bsz or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                         f"[B={bsz}, Qk, Hkv, D]")
    if dk != d or d % 2:
        raise ValueError(f"{op}: head dims of q ({d}) and k ({dk}) must match and be even")
    if num_k < num_q:
        raise ValueError(f"{op}: k has {num_k} tokens, fewer than q's {num_q}")
    if tuple(positions.shape) != (bsz, num_k):
        raise ValueError(f"{op}: positions must be [B, Qk] = {(bsz, num_k)}, got "
                         f"{tuple(positions.shape)}")
    if inv_freq.shape[0] != d // 2:
        raise ValueError(f"{op}: inv_freq must have D/2 = {d // 2} entries, got "
                         f"{inv_freq.shape[0]}")
    if cache_k.shape != cache_v.shape or cache_k.shape[1] != hkv or cache_k.shape[3] != d:
        raise ValueError(f"{op}: caches must be [Bmax, Hkv={hkv}, S, D={d}], got "
                         f"{tuple(cache_k.shape)} and {tuple(cache_v.shape)}")
    if cache_k.shape[0] < bsz or cache_len.shape[0] != bsz:
        raise ValueError(f"{op}: batch {bsz} needs cache rows >= B and cache_len [B]")
    for name, w in (("q_norm_weight", qw), ("k_norm_weight", kw)):
        if w is not None:
            check_tensor(name, w, op, ndim=1, dtypes=FLOAT_DTYPES)
            if w.shape[0] != d:
                raise ValueError(f"{op}: {name} must be [D={d}], got {tuple(w.shape)}")
    check_same_device(op, q=q, k=k, v=v, positions=positions, inv_freq=inv_freq,
                      cache_k=cache_k, cache_v=cache_v, cache_len=cache_len, q_norm_weight=qw,
                      k_norm_weight=kw)


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                   inv_freq: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                   cache_len: torch.Tensor, q_norm_weight: torch.Tensor | None = None,
                   k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate q ``[B, Q, Hq, D]`` and k ``[B, Qk, Hkv, D]`` (after optional per-head RMSNorm),
    write rotated k and v ``[B, Qk, Hkv, D]`` into ``cache_k/v [Bmax, Hkv, S, D]`` at slots
    ``cache_len[b] + [0, Qk)``, return the rotated q ``[B, Q, Hq, D]`` (into ``out`` if given).
    positions: ``[B, Qk]`` int (q uses the last Q); inv_freq: ``[D/2]``."""
    op = "rope_and_cache"
    qw, kw = q_norm_weight, k_norm_weight
    _check(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, qw, kw, op)
    q_dtype = q.dtype if qw is None else torch.promote_types(qw.dtype, q.dtype)
    k_dtype = k.dtype if kw is None else torch.promote_types(kw.dtype, k.dtype)
    if out is None:
        out = torch.empty(q.shape, dtype=q_dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q_dtype or out.stride(-1) != 1:
        raise ValueError(f"{op}: out must be {q_dtype} {tuple(q.shape)} with unit inner stride")
    if not use_triton(q):
        out.copy_(rope_and_cache_reference(q, k, v, positions, inv_freq, cache_k, cache_v,
                                           cache_len, qw, kw, eps))
        return out
    bsz, num_q, hq, d = q.shape
    num_k, hkv = k.shape[1], k.shape[2]
    for name, t in (("q", q), ("k", k), ("v", v), ("cache_k", cache_k), ("cache_v", cache_v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} needs unit stride along the head dim")
    if bsz * num_k == 0:
        return out
    half = d // 2
    inv = inv_freq if inv_freq.stride(0) == 1 else inv_freq.contiguous()
    _rope_cache_kernel[(bsz * num_k,)](
        q, k, v, positions, inv, qw if qw is not None else inv, kw if kw is not None else inv,
        out, cache_k, cache_v, cache_len,
        num_q, num_k, hq, hkv, half, cache_k.shape[2], float(eps),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), positions.stride(0), positions.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        HAS_QN=qw is not None, HAS_KN=kw is not None,
        ACT_DTYPE=tl_dtype(q.dtype), QX_DTYPE=tl_dtype(q.dtype), Q_DTYPE=tl_dtype(q_dtype),
        KX_DTYPE=tl_dtype(k.dtype), K_DTYPE=tl_dtype(k_dtype),
        BLOCK_HQ=next_pow2(hq), BLOCK_HKV=next_pow2(hkv), BLOCK_HALF=max(2, next_pow2(half)),
        num_warps=4,
        # no FMA contraction: the reference rounds x*cos and rotate_half(x)*sin to the dtype
        # before adding them (seen on an H200: fused bf16 FMAs changed ~15% of q's bits)
        enable_fp_fusion=False, **pdl_args(q, "rope"),
    )
    return out


def rope_and_cache_reference(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len,
                             q_norm_weight=None, k_norm_weight=None, eps: float = 1e-6):
    """The model definitions' ops in order (rope_tables, rms_norm, rope, the cache write)."""
    num_q, num_k = q.shape[1], k.shape[1]
    cos, sin = ops.rope_tables(positions, inv_freq, q)
    if q_norm_weight is not None:
        q = ops.rms_norm(q, q_norm_weight, eps)
    if k_norm_weight is not None:
        k = ops.rms_norm(k, k_norm_weight, eps)
    q = ops.rope(q, cos[:, num_k - num_q:], sin[:, num_k - num_q:])
    k = ops.rope(k, cos, sin)
    slots = cache_len[:, None] + torch.arange(num_k, device=q.device)[None, :]
    rows = torch.arange(q.shape[0], device=q.device)[:, None].expand(-1, num_k)
    cache_k[rows, :, slots] = k.to(cache_k.dtype)
    cache_v[rows, :, slots] = v.to(cache_v.dtype)
    return q
