"""``y = x @ W^T (+ bias)`` for decode/verify shapes, with an optional fused RMSNorm prologue.

W is ``[N, K]`` row-major (``nn.Linear`` layout), bf16 on the GPU. Two kinds of kernel, picked
by the config of the shape (:func:`get_config`, keyed by (M bucket, N, K)):

* ``kind="gemv"``, ``block_m=1`` (M = 1; any M works, each row of x streams W once): each
  program owns ``BLOCK_N`` rows of W and a K range (split-K), FMAs ``[BLOCK_N, BLOCK_K]``
  weight tiles with the matching slice of x into an fp32 accumulator of the same shape and
  reduces it once at the end. Rows past N are clamped for the loads (no masks in the inner
  loop), weights are loaded ``evict_first`` (streamed once), and with K a multiple of BLOCK_K
  the loads are unmasked 16-byte vectors.
* ``kind="gemv"``, ``block_m`` = 2, 4 or 8 (the multi-row GEMV, ``_gemv_rows_kernel``; meant
  for M = 2 .. 8): the same program, but for ``BLOCK_M`` rows of x at once: every weight tile
  it loads is FMA'd with the x slices of all its rows into a ``[BLOCK_M, BLOCK_N, BLOCK_K]``
  fp32 accumulator, so W is read once per row tile instead of once per row (M = 4 on the
  one-row kernel streams W four times; the tensor-core kernel at M = 4 .. 64 reached only
  ~0.62-0.70 of the H200's HBM bandwidth on 4096-wide weights where the M = 1 GEMV reaches
  ~0.86). Each weight element costs ``BLOCK_M`` fp32 FMAs (and the accumulator ``BLOCK_M``
  times the registers), so beyond 8 rows the FMA pipes, not HBM, bound it (the config refuses
  ``block_m > 8``). Rows past M are clamped for the loads and never stored; each row keeps
  the one-row kernel's accumulator, summation order and roundings (bit-identical under the
  interpreter, tests/codegen/kernels/test_linear.py; on the GPU the final K reduction follows
  the register layout Triton picks, so bits may differ). ``num_stages >= 2`` issues the next
  weight tile's loads before the current tile's FMAs. First H200 sweep (examples/sweep_linear.py
  --gemv-rows, Qwen3-8B shapes, one run): at M = 2 a 2-row tile (block_n 2, block_k 1024)
  beat the dot kernel by 3-5% on qkv / o / down and lost 9% on gate_up; at M = 4 and 8 it is
  bound by the FMA work (~2.2-2.5 and ~1.3-1.4 TB/s) and the dot kernel wins by 1.4-2.9x.
* ``kind="dot"`` (M = 2 .. 64 and beyond): tensor-core tiles through ``tl.dot`` with fp32
  accumulation, ``BLOCK_M >= 16`` (rows past M are clamped and never stored). Each row tile
  reads the whole weight (:func:`weight_passes`): a row count just past a tile (17, 33, 65 rows)
  pays a second pass or a wider tile, which is why draft trees verify 2^k rows (``BUDGETS`` in
  ``specc.search.tree_cost``). ``swap_ab``
  computes ``W_tile @ x_tile^T`` so the wide weight tile is the MMA's M side and the skinny
  activation block its N side (Hopper's wgmma wants M = 64 per warpgroup). ``tma`` loads both
  tiles with TMA bulk copies from host-built tensor descriptors (zero fill past the edges)
  instead of pointer loads; on the H200 sweep it was within noise of the pointer loads.

Split-K (``split_k > 1``, or ``0`` = automatic, see :class:`LinearConfig`) is deterministic:
each program stores its fp32 partial tile into a workspace slot of its own, then takes a ticket
(an acq_rel atomic on a per-tile counter); the last program of a tile sums the partials in split
order, adds the bias, rounds once and stores, and resets the counter. One launch, no memset, the
workspace stays valid for the next call and for CUDA graphs (do not run two split-K launches on
one device concurrently on different streams).

Fused RMSNorm prologue (``norm_weight`` given): ``y = rms_norm(x, g, eps) @ W^T`` exactly as
``specc.models.ops.rms_norm`` then ``ops.linear``: each row's fp32 inverse RMS
(``rsqrt(mean(x^2) + eps)``, over the whole row, which no K-split program sees) is computed by
every GEMV program from the whole row (the multi-row GEMV's: of each of its rows; an L2-resident
re-read; it saves a launch per norm, ~2 us on the H200), or by a tiny pre-kernel
(``rstd_in_kernel=False``, and always for the dot kernel's prologue); both run one code path
(``_rstd_of_row``). The main kernel then scales x tiles as they are loaded, rounding where the
reference rounds: ``n = (x * rstd) -> x.dtype``, ``h = (g * n) -> promote(g.dtype, x.dtype)``.
The output dtype is that of h (x.dtype when g and x share a dtype). The prologue is the default
of the gemv kernels only; for the dot kernel the launcher normalises the rows with the rms_norm kernel and
runs the plain GEMM (same roundings, same two launches; measured faster on the H200), unless
``LinearConfig.norm_prologue=True``.

Batch-invariant mode (:mod:`specc.codegen.kernels.batch_invariant`, ``SPECC_BATCH_INVARIANT=1``):
:func:`get_config` returns :data:`BATCH_INVARIANT_CONFIG` for every M (the table, the heuristic and
:func:`set_config` overrides are ignored) and automatic split-K is one split, so a row's output
has the same bits whatever rows share its launch. A ``config`` passed to :func:`linear` is still
honoured (its split count, if not automatic, does not depend on M; choosing the same config for
every M is the caller's part).

Numerics: fp32 accumulation; the output is rounded once. fp32 inputs use IEEE fp32 dots (no
tf32). Under the Triton interpreter (CPU, ``TRITON_INTERPRET=1``) dots run in fp32, so bf16
tensors work there too; without CUDA and without the interpreter the launcher runs
:func:`linear_reference`.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from specc.codegen.kernels._common import (
    ConfigTable,
    bucket_of,
    FLOAT_DTYPES,
    INTERPRETED,
    WORKSPACES,
    check_same_device,
    check_tensor,
    num_sms,
    round_to,
    rounded,
    tl_dtype,
    use_triton,
)
from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled
from specc.codegen.kernels.pdl import pdl_launch, pdl_mode, pdl_wait

__all__ = [
    "LinearConfig",
    "linear",
    "linear_reference",
    "row_rstd",
    "get_config",
    "set_config",
    "clear_configs",
    "m_bucket",
    "M_BUCKETS",
    "weight_passes",
    "DEFAULT_CONFIGS",
    "BATCH_INVARIANT_CONFIG",
]

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The tensor-core kernel is launched with PDL (specc.codegen.kernels.pdl) up to this many rows.
# H200, Qwen3-8B step (docs/benchmarks/h200-run12.md): with PDL at 16 rows the verify step
# (B = 1, Q = 16) took 1.6% less time and the B = 16 AR step 0.8% more (without it on this kernel,
# +1.6%); at 256 rows (B = 16, Q = 16) the step took 5.8% more with it and 1.2% more without.
PDL_DOT_MAX_ROWS = 64
# The multi-row GEMV's widest row tile (LinearConfig.block_m of kind="gemv"): each weight element
# costs block_m fp32 FMAs, and at 16 rows the H200's FMA rate (~33 TFMA/s) falls below what its
# HBM streams (~2.4 G bf16 weights/us x 16).
GEMV_MAX_ROWS = 8


# ------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------
@triton.jit
def _rstd_of_row(base, K, eps, BLOCK_K: tl.constexpr):
    """fp32 ``rsqrt(mean(x^2) + eps)`` of one row: the one code path for both the pre-kernel and
    the GEMV's in-kernel statistics, so both round alike."""
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(base + offs, mask=offs < K, other=0.0).to(tl.float32)
        acc += xv * xv
    return tl.rsqrt(tl.sum(acc, axis=0) / K + eps)


@triton.jit
def _row_rstd_kernel(x_ptr, rstd_ptr, K, stride_xm, eps, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    tl.store(rstd_ptr + m, _rstd_of_row(x_ptr + m.to(tl.int64) * stride_xm, K, eps, BLOCK_K))


@triton.jit
def _prologue(xf, rstd, gf, X_DTYPE: tl.constexpr, H_DTYPE: tl.constexpr):
    """rms_norm's rounding on an fp32 tile: (x * rstd) -> x dtype, then (g * n) -> h dtype."""
    n = rounded(xf * rstd, X_DTYPE)
    return rounded(gf * n, H_DTYPE)


@triton.jit
def _finish(tot, b_ptr, r_ptr, offs_n, y_offs, mask_n, y_mask, y_ptr,
            HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    """Bias, rounding and the fused residual add of a finished fp32 tile, then the store. The
    residual is added to the *rounded* product, then rounded again: exactly ``r + linear(x)``
    computed as two ops in the output dtype."""
    if HAS_BIAS:
        tot += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = round_to(tot, y_ptr.dtype.element_ty)
    if HAS_RES:
        r = tl.load(r_ptr + y_offs, mask=y_mask, other=0.0).to(tl.float32)
        y = round_to(y.to(tl.float32) + r, y_ptr.dtype.element_ty)
    tl.store(y_ptr + y_offs, y, mask=y_mask)


@triton.jit
def _epilogue(out, offs_m, offs_n, M, N, pid_m, pid_n, pid_k, y_ptr, stride_ym, b_ptr, ws_ptr,
              cnt_ptr, r_ptr, HAS_BIAS: tl.constexpr, USE_SPLIT: tl.constexpr, HAS_RES: tl.constexpr):
    """Store an fp32 [BM, BN] output tile (+ bias, + residual), directly or through the split-K
    workspace."""
    mask_m = offs_m < M
    mask_n = offs_n < N
    y_mask = mask_m[:, None] & mask_n[None, :]
    y_offs = offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    if USE_SPLIT:
        n_split = tl.num_programs(1)
        ws_offs = (pid_k * M + offs_m).to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + ws_offs, out, mask=y_mask)
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if ticket == n_split - 1:
            tot = tl.zeros_like(out)
            for s in range(0, n_split):
                part_offs = (s * M + offs_m).to(tl.int64)[:, None] * N + offs_n[None, :]
                tot += tl.load(ws_ptr + part_offs, mask=y_mask, other=0.0, cache_modifier=".cg")
            _finish(tot, b_ptr, r_ptr, offs_n, y_offs, mask_n, y_mask, y_ptr, HAS_BIAS, HAS_RES)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")
    else:
        _finish(out, b_ptr, r_ptr, offs_n, y_offs, mask_n, y_mask, y_ptr, HAS_BIAS, HAS_RES)


@triton.jit
def _gemv_tile(acc, w, k0, k_hi, x_base, g_ptr, rstd, zrow,
               BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_NORM: tl.constexpr, X_2D: tl.constexpr,
               X_DTYPE: tl.constexpr, H_DTYPE: tl.constexpr):
    """acc += the weight tile ``w`` (columns ``k0 .. k0 + BLOCK_K``) times the matching x."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if X_2D:
        xk = tl.max_contiguous(zrow + offs_k[None, :], [1, BLOCK_K])
    else:
        xk = offs_k
    if EVEN_K:
        xv = tl.load(x_base + xk).to(tl.float32)
        if HAS_NORM:
            gv = tl.load(g_ptr + xk).to(tl.float32)
    else:
        xv = tl.load(x_base + xk, mask=xk < k_hi, other=0.0).to(tl.float32)
        if HAS_NORM:
            gv = tl.load(g_ptr + xk, mask=xk < k_hi, other=0.0).to(tl.float32)
    if HAS_NORM:
        xv = _prologue(xv, rstd, gv, X_DTYPE, H_DTYPE)
    if X_2D:
        acc += w.to(tl.float32) * xv
    else:
        acc += w.to(tl.float32) * xv[None, :]
    return acc


@triton.jit
def _gemv_weights(w_base, k0, k_hi, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The ``[BLOCK_N, BLOCK_K]`` weight tile at column k0 (streamed once: evict first)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        offs_k = tl.max_contiguous(tl.multiple_of(offs_k, BLOCK_K), BLOCK_K)
        return tl.load(w_base + offs_k[None, :], eviction_policy="evict_first")
    else:
        return tl.load(w_base + offs_k[None, :], mask=(offs_k < k_hi)[None, :], other=0.0,
                       eviction_policy="evict_first")


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr, b_ptr, g_ptr, rstd_ptr, ws_ptr, cnt_ptr, r_ptr,
    M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    USE_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
    X_DTYPE: tl.constexpr, H_DTYPE: tl.constexpr, X_2D: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    # X_2D: load x as a [BLOCK_N, BLOCK_K] broadcast in the weight tile's layout (each thread
    # reads the x elements it needs, L1 hits) instead of a 1-D load that Triton redistributes
    # through shared memory (a barrier per iteration).
    zrow = tl.zeros((BLOCK_N, 1), dtype=tl.int32)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)  # clamped: loads need no row mask
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    w_base = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_base = x_ptr + m.to(tl.int64) * stride_xm
    if PDL >= 2:  # the first weight tile is in flight while the previous kernel finishes
        w_first = _gemv_weights(w_base, k_lo, k_hi, BLOCK_K, EVEN_K)
    pdl_wait(PDL)
    if HAS_NORM:
        if RSTD_BLOCK > 0:  # every program reads the whole row once (L2 hits) instead of a launch
            rstd = _rstd_of_row(x_base, K, eps, RSTD_BLOCK)
        else:
            rstd = tl.load(rstd_ptr + m)
    else:
        rstd = 1.0
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    k_start = k_lo
    if PDL >= 2:  # (every program has at least one tile)
        acc = _gemv_tile(acc, w_first, k_lo, k_hi, x_base, g_ptr, rstd, zrow, BLOCK_K, EVEN_K, HAS_NORM,
                         X_2D, X_DTYPE, H_DTYPE)
        k_start = k_lo + BLOCK_K
    for k0 in range(k_start, k_hi, BLOCK_K):
        w = _gemv_weights(w_base, k0, k_hi, BLOCK_K, EVEN_K)
        acc = _gemv_tile(acc, w, k0, k_hi, x_base, g_ptr, rstd, zrow, BLOCK_K, EVEN_K, HAS_NORM,
                         X_2D, X_DTYPE, H_DTYPE)
    out = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]
    offs_m = m + tl.arange(0, 1)
    _epilogue(out, offs_m, offs_n, M, N, m, pid_n, pid_k, y_ptr, stride_ym, b_ptr, ws_ptr,
              cnt_ptr, r_ptr, HAS_BIAS, USE_SPLIT, HAS_RES)


@triton.jit
def _gemv_rows_tile(acc, w, k0, k_hi, x_rows, g_ptr, rstd, zmid,
                    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_NORM: tl.constexpr, X_3D: tl.constexpr,
                    X_DTYPE: tl.constexpr, H_DTYPE: tl.constexpr):
    """acc[BLOCK_M, BLOCK_N, BLOCK_K] += the weight tile ``w`` [BLOCK_N, BLOCK_K] (columns
    ``k0 .. k0 + BLOCK_K``) times the matching x of every row of the tile: per row exactly
    :func:`_gemv_tile`'s products and sums."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if X_3D:  # [BLOCK_M, BLOCK_N, BLOCK_K]: a broadcast over the weight rows, in acc's layout
        kk = tl.max_contiguous(zmid + offs_k[None, None, :], [1, 1, BLOCK_K])
        xp = x_rows[:, None, None] + kk
        gk = kk
    else:  # [BLOCK_M, BLOCK_K]
        kk = offs_k[None, :]
        xp = x_rows[:, None] + kk
        gk = offs_k
    if EVEN_K:
        xv = tl.load(xp).to(tl.float32)
        if HAS_NORM:
            gv = tl.load(g_ptr + gk).to(tl.float32)
    else:
        xv = tl.load(xp, mask=kk < k_hi, other=0.0).to(tl.float32)
        if HAS_NORM:
            gv = tl.load(g_ptr + gk, mask=gk < k_hi, other=0.0).to(tl.float32)
    if HAS_NORM:
        if X_3D:
            xv = _prologue(xv, rstd[:, None, None], gv, X_DTYPE, H_DTYPE)
        else:
            xv = _prologue(xv, rstd[:, None], gv[None, :], X_DTYPE, H_DTYPE)
    if X_3D:
        acc += w.to(tl.float32)[None, :, :] * xv
    else:
        acc += w.to(tl.float32)[None, :, :] * xv[:, None, :]
    return acc


@triton.jit
def _gemv_weights_if(w_base, k0, k_hi, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """:func:`_gemv_weights` at column k0 where k0 < k_hi, else nothing loaded (zeros): the
    prefetch of a next tile that may not exist. With EVEN_K the predicate is one scalar, so the
    loads stay unmasked-width 16-byte vectors."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        offs_k = tl.max_contiguous(tl.multiple_of(offs_k, BLOCK_K), BLOCK_K)
        pred = (tl.zeros((1, BLOCK_K), dtype=tl.int32) + k0) < k_hi  # one value along K
        return tl.load(w_base + offs_k[None, :], mask=pred, other=0.0, eviction_policy="evict_first")
    else:  # (its column mask already loads nothing past k_hi)
        return _gemv_weights(w_base, k0, k_hi, BLOCK_K, EVEN_K)


@triton.jit
def _gemv_rows_kernel(
    x_ptr, w_ptr, y_ptr, b_ptr, g_ptr, rstd_ptr, ws_ptr, cnt_ptr, r_ptr,
    M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    USE_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
    X_DTYPE: tl.constexpr, H_DTYPE: tl.constexpr, X_3D: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    PREFETCH: tl.constexpr, PDL: tl.constexpr = 0,
):
    """The multi-row GEMV: :func:`_gemv_kernel` for the BLOCK_M rows ``pid_m * BLOCK_M ..`` of x
    at once, so each weight tile loaded serves every row of the tile (the weight is read once
    per row tile instead of once per row). Rows past M are clamped for the loads and never
    stored; each row's accumulator, summation order and roundings are the one-row kernel's."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    zmid = tl.zeros((1, BLOCK_N, 1), dtype=tl.int32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_m = tl.minimum(offs_m, M - 1)  # clamped: loads need no row mask
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    w_base = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + rows_m.to(tl.int64) * stride_xm
    if PDL >= 2:  # the first weight tile is in flight while the previous kernel finishes
        w_first = _gemv_weights(w_base, k_lo, k_hi, BLOCK_K, EVEN_K)
    pdl_wait(PDL)
    if HAS_NORM:
        if RSTD_BLOCK > 0:  # each row's statistics from the whole row (L2 hits), as the GEMV
            rstd = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for i in tl.static_range(BLOCK_M):
                row = tl.minimum(pid_m * BLOCK_M + i, M - 1)
                r_i = _rstd_of_row(x_ptr + row.to(tl.int64) * stride_xm, K, eps, RSTD_BLOCK)
                rstd = tl.where(tl.arange(0, BLOCK_M) == i, r_i, rstd)
        else:
            rstd = tl.load(rstd_ptr + rows_m)
    else:
        rstd = tl.full((BLOCK_M,), 1.0, tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PREFETCH:  # the next weight tile's loads are issued before this tile's FMAs
        if PDL >= 2:
            w = w_first
        else:
            w = _gemv_weights(w_base, k_lo, k_hi, BLOCK_K, EVEN_K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            w_next = _gemv_weights_if(w_base, k0 + BLOCK_K, k_hi, BLOCK_K, EVEN_K)
            acc = _gemv_rows_tile(acc, w, k0, k_hi, x_rows, g_ptr, rstd, zmid, BLOCK_K, EVEN_K,
                                  HAS_NORM, X_3D, X_DTYPE, H_DTYPE)
            w = w_next
    else:
        k_start = k_lo
        if PDL >= 2:  # (every program has at least one tile)
            acc = _gemv_rows_tile(acc, w_first, k_lo, k_hi, x_rows, g_ptr, rstd, zmid, BLOCK_K, EVEN_K,
                                  HAS_NORM, X_3D, X_DTYPE, H_DTYPE)
            k_start = k_lo + BLOCK_K
        for k0 in range(k_start, k_hi, BLOCK_K):
            w = _gemv_weights(w_base, k0, k_hi, BLOCK_K, EVEN_K)
            acc = _gemv_rows_tile(acc, w, k0, k_hi, x_rows, g_ptr, rstd, zmid, BLOCK_K, EVEN_K,
                                  HAS_NORM, X_3D, X_DTYPE, H_DTYPE)
    out = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
    _epilogue(out, offs_m, offs_n, M, N, pid_m, pid_n, pid_k, y_ptr, stride_ym, b_ptr, ws_ptr,
              cnt_ptr, r_ptr, HAS_BIAS, USE_SPLIT, HAS_RES)


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, y_ptr, b_ptr, g_ptr, rstd_ptr, ws_ptr, cnt_ptr, r_ptr, x_desc, w_desc,
    M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SWAP_AB: tl.constexpr, DOT_F32: tl.constexpr, TMA: tl.constexpr,
    USE_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
    X_DTYPE: tl.constexpr, H_DTYPE: tl.constexpr, PDL: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.minimum(offs_m, M - 1)
    rows_n = tl.minimum(offs_n, N - 1)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    x_base = x_ptr + rows_m.to(tl.int64)[:, None] * stride_xm
    w_base = w_ptr + rows_n.to(tl.int64)[:, None] * stride_wn
    pdl_wait(PDL)  # (Triton's pipeliner owns the loads: no tile is issued before the wait)
    if HAS_NORM:
        rstd = tl.load(rstd_ptr + rows_m)[:, None]
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if TMA:
            # bulk tensor copies; rows past M / N and columns past K arrive as zeros. A chunk
            # never straddles a split boundary (K_PER_SPLIT is a multiple of BLOCK_K).
            xv = x_desc.load([pid_m * BLOCK_M, k0])
            w = w_desc.load([pid_n * BLOCK_N, k0])
            if HAS_NORM:
                gv = tl.load(g_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        elif EVEN_K:
            offs_k = tl.max_contiguous(tl.multiple_of(offs_k, BLOCK_K), BLOCK_K)
            xv = tl.load(x_base + offs_k[None, :])
            w = tl.load(w_base + offs_k[None, :], eviction_policy="evict_first")
            if HAS_NORM:
                gv = tl.load(g_ptr + offs_k).to(tl.float32)
        else:
            mk = offs_k < k_hi
            xv = tl.load(x_base + offs_k[None, :], mask=mk[None, :], other=0.0)
            w = tl.load(w_base + offs_k[None, :], mask=mk[None, :], other=0.0,
                        eviction_policy="evict_first")
            if HAS_NORM:
                gv = tl.load(g_ptr + offs_k, mask=mk, other=0.0).to(tl.float32)
        if HAS_NORM:
            xv = _prologue(xv.to(tl.float32), rstd, gv[None, :], X_DTYPE, H_DTYPE)
        if DOT_F32:
            a = xv.to(tl.float32)
            b = w.to(tl.float32)
            if SWAP_AB:
                acc = tl.dot(b, tl.trans(a), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            a = xv.to(w.dtype)
            if SWAP_AB:
                acc = tl.dot(w, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(w), acc)
    if SWAP_AB:
        out = tl.trans(acc)
    else:
        out = acc
    _epilogue(out, offs_m, offs_n, M, N, pid_m, pid_n, pid_k, y_ptr, stride_ym, b_ptr, ws_ptr,
              cnt_ptr, r_ptr, HAS_BIAS, USE_SPLIT, HAS_RES)


# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LinearConfig:
    """Launch parameters of one shape.

    kind: "gemv" (FMA streaming; meant for M <= 8) or "dot" (tensor cores, needs block_m,
    block_n, block_k >= 16). block_m: rows of x per program, the row tile; None (the default)
    means the kind's default: 1 for gemv (one program row per row of x, the M = 1 kernel), 16
    for dot. A gemv with block_m = 2, 4 or 8 runs the multi-row GEMV (``_gemv_rows_kernel``:
    the weight read once per row tile, block_m FMAs per weight element; at most 8, beyond
    that the FMA pipes, not HBM, bound it: use kind="dot"). split_k: number of K splits, 0 =
    automatic (gemv: ~4 programs per SM; dot: ~1 program per SM, none from SMs/2 tiles up).
    x_2d (gemv): load x as a broadcast tile in the accumulator's layout; norm_prologue: see
    :func:`linear`."""

    kind: str = "gemv"
    block_m: int | None = None  # None: the kind's default (gemv 1, dot 16); always an int after init
    block_n: int = 16
    block_k: int = 256
    split_k: int = 0
    num_warps: int = 4
    num_stages: int = 2
    swap_ab: bool = True
    x_2d: bool | None = None  # gemv: x as a 2-D broadcast load; None = unless a norm prologue
    norm_prologue: bool | None = None  # with norm_weight: None = gemv yes, dot no (see linear)
    tma: bool = False  # dot: load tiles through TMA descriptors where supported (see _use_tma)
    rstd_in_kernel: bool | None = None  # gemv + norm: row statistics in the kernel (None = yes)

    def __post_init__(self):
        if self.kind not in ("gemv", "dot"):
            raise ValueError(f"LinearConfig.kind must be 'gemv' or 'dot', got {self.kind!r}")
        if self.block_m is None:
            object.__setattr__(self, "block_m", 1 if self.kind == "gemv" else 16)
        for name in ("block_m", "block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"LinearConfig.{name} must be a power of two, got {v}")
        if self.kind == "dot" and min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("LinearConfig(kind='dot') needs block_m, block_n, block_k >= 16")
        if self.kind == "gemv" and self.block_m > GEMV_MAX_ROWS:
            # (before the multi-row GEMV a gemv config's block_m was ignored, and recorded
            # configs carry the old default 16: refuse rather than run 16-row tiles)
            raise ValueError(f"LinearConfig(kind='gemv') takes block_m 1 .. {GEMV_MAX_ROWS} (rows "
                             f"per program; more rows are kind='dot' work), got {self.block_m}")
        if self.tma and self.kind != "dot":
            raise ValueError("LinearConfig.tma applies to kind='dot' only")
        if self.split_k < 0 or self.num_stages < 1:
            raise ValueError("LinearConfig.split_k must be >= 0 and num_stages >= 1")

    def replace(self, **kw) -> "LinearConfig":
        return dataclasses.replace(self, **kw)


def m_bucket(m: int) -> int:
    """The config bucket of M rows: the smallest of M_BUCKETS >= M (the largest above)."""
    return bucket_of(m, M_BUCKETS)


def weight_passes(m: int, n: int, k: int, config: LinearConfig | None = None) -> int:
    """How many times a linear of ``m`` rows reads its ``[n, k]`` weight from memory: one pass
    per row tile of the config (``get_config`` unless given; ``block_m`` rows, for the GEMV too:
    one row at block_m = 1, the multi-row GEMV's block_m rows otherwise), since
    the grid finishes every weight tile of one row tile before starting the next. A step whose
    row count crosses a bucket edge into a multi-tile config pays this factor on its weight
    traffic."""
    cfg = config if config is not None else get_config(m, n, k)
    return -(-m // cfg.block_m)


def _heuristic(mb: int, n: int, k: int) -> LinearConfig:
    if mb == 1:  # the H200 sweep: (4, 1024) was within 3% of the best config on every shape
        bn, bk = (4, 1024) if k % 1024 == 0 else ((8, 512) if k % 512 == 0 else (16, 256))
        return LinearConfig("gemv", block_m=1, block_n=bn, block_k=bk, split_k=0, num_warps=4,
                            num_stages=1)
    if mb <= 64:
        return LinearConfig("dot", block_m=max(16, mb), block_n=64, block_k=128, split_k=0,
                            num_warps=4, num_stages=4, swap_ab=True)
    # 65+ rows: 64-row tiles, the weight read once per tile. One 128-row tile (block_k 64, read
    # once) measured slower on the H200 at 65 rows: 14.09 ms of linears per Qwen3-8B step against
    # 11.65 ms for two 64-row tiles, where 64 rows take 5.82 ms (examples/profile_tree.py --loop,
    # docs/benchmarks/h200-run6.md): a verify should not cross 64 rows by one.
    return LinearConfig("dot", block_m=64, block_n=128, block_k=64, split_k=0, num_warps=4,
                        num_stages=4, swap_ab=False)


# (m_bucket, N, K) -> config: the fastest of an H200 sweep (2026-12-02): M = 1 and lm_head from
# examples/bench_kernels.py (docs/benchmarks/kernels.md), the rest below. Qwen3-8B shapes:
# qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288, lm_head 151936x4096. Buckets
# 2 and 8 reuse the M = 4 / 16 winners (the same BLOCK_M = 16 kernel; M = 2 and 8 were not
# timed). Anything not listed uses the heuristic; set_config() overrides.
def _table() -> dict[tuple[int, int, int], LinearConfig]:
    gemv = lambda bn, bk, **kw: LinearConfig("gemv", block_m=1, block_n=bn, block_k=bk,  # noqa: E731
                                             split_k=1, num_warps=4, num_stages=1, **kw)
    dot = lambda bm, bn, split, w=4, st=4, bk=128, tma=False: LinearConfig(  # noqa: E731
        "dot", block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=w, num_stages=st, tma=tma)
    qkv, o, gate_up, down, lm_head = (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), \
        (151936, 4096)
    t = {
        (1, *qkv): gemv(8, 512),  # 14.5 us, 3.46 TB/s
        (1, *o): gemv(4, 1024),  # 10.5 us, 3.20 TB/s
        (1, *gate_up): gemv(16, 256, x_2d=False),  # 48.7 us, 4.13 TB/s
        (1, *down): gemv(4, 1024),  # 25.7 us, 3.92 TB/s
        (1, *lm_head): gemv(16, 256, x_2d=False),  # 279.6 us, 4.45 TB/s
        # M = 4, 16 and 64 (not lm_head): the winners of examples/sweep_linear.py (180 configs
        # per shape; in brackets the previous table's config in the same run):
        # docs/benchmarks/steps-h200.md, linear-sweep-*.json
        (4, *qkv): dot(16, 64, 1, bk=256, tma=True),  # 15.4 us [19.2]
        (4, *o): dot(16, 64, 1, bk=256, tma=True),  # 11.8 us [14.3]
        (4, *gate_up): dot(16, 64, 1, st=3, tma=True),  # 51.0 us [59.4]
        (4, *down): dot(16, 64, 2, bk=256, tma=True),  # 28.7 us [34.5]
        (4, *lm_head): dot(16, 64, 1),  # 285.6 us
        (16, *qkv): dot(16, 64, 1, bk=256),  # 15.7 us [16.5]
        # o and down at 16 rows: the M = 4 tile (TMA loads, no split-K), which the H200 sweep
        # timed within 0.2% of its winners (11.96 / 29.08 us against 11.94 / 29.12 for
        # dot(16, 64, 2, st=5) / dot(16, 64, 2, bk=256)) and the H100 sweep of 2026-12-07 fastest of
        # its 180 (13.70 / 37.91 us against 14.67-14.88 / 38.42-38.52; docs/benchmarks/run31.md)
        (16, *o): dot(16, 64, 1, bk=256, tma=True),
        (16, *gate_up): dot(16, 64, 1, st=3),  # 50.9 us [57.3]
        (16, *down): dot(16, 64, 1, bk=256, tma=True),
        (16, *lm_head): dot(16, 128, 1, w=8, st=3),  # 286.5 us
        (64, *qkv): dot(64, 64, 1, st=5, tma=True),  # 16.9 us [18.3]
        (64, *o): dot(64, 64, 1, st=5, tma=True),  # 12.9 us [15.1]
        (64, *gate_up): dot(64, 64, 1, st=5, tma=True),  # 57.1 us [58.2]
        (64, *down): dot(64, 64, 2, st=5),  # 32.4 us [41.3]
        (64, *lm_head): dot(64, 128, 1, w=8, st=3),  # 306.4 us
    }
    for (mb, n, k), c in list(t.items()):
        if mb in (4, 16):
            t[(mb // 2, n, k)] = c
    # M = 2: the multi-row GEMV (2-row tile) beat the dot kernel on qkv / o / down in the H200
    # sweep of 2026-12-05 (examples/sweep_linear.py --gemv-rows --dot small; docs/benchmarks/
    # linear-sweep-rows-h200.json): 15.1 / 10.7 / 26.9 us against the shipped 16.0 / 11.2 / 27.5;
    # gate_up keeps the dot kernel (49.1 against 53.3)
    rows2 = LinearConfig("gemv", block_m=2, block_n=2, block_k=1024, split_k=0, num_warps=4, num_stages=1)
    for shape in (qkv, o, down):
        t[(2, *shape)] = rows2
    # M = 17 .. 32 (a 31-node draft tree and its root, 2 x 16 tokens): the M = 16 winners widened
    # to one 32-row tile beat the heuristic's at 32 rows on the H200 (per Qwen3-8B step's linears
    # without the LM head: qkv 22.4 / o 16.1 / gate_up 55.6 / down 35.1 us against 25.9 / 16.2 /
    # 57.0 / 36.5; examples/profile_tree.py --loop, docs/benchmarks/h200-run6.md); the LM head
    # stays on the heuristic (299.5 against 310.4 us)
    widened = {o: dot(16, 64, 2, st=5), down: dot(16, 64, 2, bk=256)}  # the 16-row tiles timed widened
    for shape in (qkv, o, gate_up, down):
        t[(32, *shape)] = widened.get(shape, t[(16, *shape)]).replace(block_m=32)
    return t


DEFAULT_CONFIGS: dict[tuple[int, int, int], LinearConfig] = _table()
# The batch-invariant mode's one config for every M: the heuristic's 16-row tensor-core tile for
# 2 .. 16 rows (pointer loads, no split-K). More rows are more row tiles of the same kernel, so a
# row's instructions never change with M.
BATCH_INVARIANT_CONFIG = LinearConfig("dot", block_m=16, block_n=64, block_k=128, split_k=1, num_warps=4,
                                      num_stages=4, swap_ab=True)
_TABLE = ConfigTable(LinearConfig, DEFAULT_CONFIGS, _heuristic, m_bucket, invariant=BATCH_INVARIANT_CONFIG)
get_config = _TABLE.get  # (m, n, k) -> config: the mode's one config, else override, else DEFAULT_CONFIGS, else heuristic
set_config = _TABLE.set  # (m, n, k, config | mapping | None): a deployment's override
clear_configs = _TABLE.clear
_as_config = _TABLE.coerce


def _split_plan(cfg: LinearConfig, m: int, n: int, k: int, device: torch.device):
    """(K per split, number of splits): K per split is a multiple of block_k."""
    bk = cfg.block_k
    chunks = triton.cdiv(k, bk)
    split = cfg.split_k
    if split == 0 and batch_invariant_enabled():  # the automatic count follows M's tiles
        split = 1
    if split == 0 and cfg.kind == "gemv":  # ~4 programs per SM
        tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m)
        split = max(1, min(triton.cdiv(4 * num_sms(device), tiles), chunks // 2))
    elif split == 0:
        # dot: a deep cp.async pipeline per program streams at nearly an SM's share of the
        # bandwidth, and short K ranges never reach steady state (H200 sweep: split-K to ~4
        # programs per SM was 25-70% slower than none on 64-384 tiles); split only to ~1 per SM
        tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m)
        sms = num_sms(device)
        split = 1 if 2 * tiles >= sms else max(1, min(triton.cdiv(sms, tiles), chunks // 4))
    split = max(1, min(split, chunks))
    k_per = triton.cdiv(chunks, split) * bk
    return k_per, triton.cdiv(k, k_per)


# ------------------------------------------------------------------------------------------
# launchers
# ------------------------------------------------------------------------------------------
def row_rstd(x2: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 ``rsqrt(mean(x^2, -1) + eps)`` per row of a 2-D ``[M, K]`` tensor (Triton)."""
    m, k = x2.shape
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    if m:
        _row_rstd_kernel[(m,)](x2, rstd, k, x2.stride(0), float(eps), BLOCK_K=_rstd_block(k),
                               num_warps=4)
    return rstd


def _rstd_block(k: int) -> int:
    return min(4096, triton.next_power_of_2(k))


def _use_tma(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether TMA descriptors can describe both operands: a Hopper-or-newer GPU (CPU tensors
    reach here only under the interpreter or an sm_90 compile check) and 16-byte aligned base
    addresses and row strides."""
    if x2.is_cuda and torch.cuda.get_device_capability(x2.device)[0] < 9:
        return False
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in (x2, weight))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
           config: LinearConfig | Mapping | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight^T (+ bias)``; with ``norm_weight``: ``rms_norm(x, norm_weight, eps) @ weight^T``;
    with ``residual`` (shape and dtype of the output): ``residual + that``, added in the epilogue
    to the rounded product and rounded again (bit-identical to the separate add).

    x: ``[..., K]`` (bf16/fp16/fp32); weight: ``[N, K]`` with unit stride along K (bf16 on the
    GPU; any float dtype); bias: ``[N]`` or None; norm_weight: ``[K]`` or None. Returns
    ``[..., N]`` in x's dtype (promote(norm_weight, x) with the prologue). ``config`` overrides
    the table lookup (:func:`get_config`) for this call.
    """
    op = "linear"
    check_tensor("x", x, op, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, op, ndim=2, dtypes=FLOAT_DTYPES)
    n, k = weight.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}, the weight [N={n}, K={k}] expects "
                         f"[..., {k}]")
    if bias is not None:
        check_tensor("bias", bias, op, ndim=1, dtypes=FLOAT_DTYPES)
        if bias.shape[0] != n:
            raise ValueError(f"{op}: bias must have shape ({n},), got {tuple(bias.shape)}")
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, op, ndim=1, dtypes=FLOAT_DTYPES)
        if norm_weight.shape[0] != k:
            raise ValueError(f"{op}: norm_weight must have shape ({k},), got "
                             f"{tuple(norm_weight.shape)}")
    check_same_device(op, x=x, weight=weight, bias=bias, norm_weight=norm_weight, residual=residual)
    out_dtype = x.dtype if norm_weight is None else torch.promote_types(norm_weight.dtype, x.dtype)
    if residual is not None and (tuple(residual.shape) != (*x.shape[:-1], n) or residual.dtype != out_dtype):
        raise ValueError(f"{op}: residual must be {out_dtype} of shape {(*x.shape[:-1], n)}, got "
                         f"{residual.dtype} {tuple(residual.shape)}")
    if not use_triton(x):
        y = linear_reference(x, weight, bias, norm_weight, eps)
        return y if residual is None else residual + y

    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError(f"{op}: weight must have unit stride along K, got strides "
                         f"{tuple(weight.stride())}")
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*lead, n)
    if k == 0:
        y.zero_()
        if bias is not None:
            y += bias.to(out_dtype)
        return (y if residual is None else residual.reshape(m, n) + y).reshape(*lead, n)
    cfg = _as_config(config) if config is not None else get_config(m, n, k)
    k_per, split = _split_plan(cfg, m, n, k, x.device)
    even_k = k % cfg.block_k == 0
    if split > 1:
        ws = WORKSPACES.get("linear.ws", x.device, split * m * n, torch.float32)
        cnt = WORKSPACES.get("linear.cnt", x.device, triton.cdiv(n, cfg.block_n)
                             * triton.cdiv(m, cfg.block_m), torch.int32)
    else:
        ws, cnt = y, y  # unused
    has_norm = norm_weight is not None
    prologue = cfg.norm_prologue if cfg.norm_prologue is not None else cfg.kind == "gemv"
    if has_norm and not prologue:
        # normalise the few rows once (the rms_norm kernel, same roundings), then a plain GEMM:
        # on the H200 the per-tile prologue cost the dot kernel 20% at M = 16 (the x operand
        # then goes through registers instead of the cp.async pipeline)
        from specc.codegen.kernels.rmsnorm import rms_norm as _rms_norm

        h = _rms_norm(x2, norm_weight, eps)
        r2 = None if residual is None else residual.reshape(m, n)
        return linear(h, weight, bias, config=cfg.replace(norm_prologue=None), residual=r2).reshape(*lead, n)
    rstd_in_kernel = has_norm and cfg.kind == "gemv" and cfg.rstd_in_kernel is not False
    if has_norm:
        rstd = y if rstd_in_kernel else row_rstd(x2, eps)
        g = norm_weight.contiguous()
    else:
        rstd, g = y, y  # unused
    b = bias.contiguous() if bias is not None else y
    r = residual.reshape(m, n).contiguous() if residual is not None else y  # y's [M, N] layout
    x_tl, h_tl = tl_dtype(x.dtype), tl_dtype(out_dtype)
    if cfg.kind == "dot":
        pdl = min(pdl_mode(x, "linear_dot"), 1) if m <= PDL_DOT_MAX_ROWS else 0
    else:
        pdl = pdl_mode(x, "linear")
    common = dict(USE_SPLIT=split > 1, HAS_BIAS=bias is not None, HAS_NORM=has_norm, HAS_RES=residual is not None,
                  X_DTYPE=x_tl, H_DTYPE=h_tl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                  PDL=pdl, **pdl_launch(pdl))
    if cfg.kind == "gemv" and cfg.block_m == 1:
        grid = (triton.cdiv(n, cfg.block_n), split, m)
        _gemv_kernel[grid](
            x2, weight, y, b, g, rstd, ws, cnt, r, m, n, k, k_per, x2.stride(0), weight.stride(0),
            y.stride(0), float(eps), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=even_k,
            X_2D=(not has_norm) if cfg.x_2d is None else bool(cfg.x_2d),
            RSTD_BLOCK=_rstd_block(k) if rstd_in_kernel else 0, **common)
    elif cfg.kind == "gemv":
        grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m))
        _gemv_rows_kernel[grid](
            x2, weight, y, b, g, rstd, ws, cnt, r, m, n, k, k_per, x2.stride(0), weight.stride(0),
            y.stride(0), float(eps), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            EVEN_K=even_k, X_3D=(not has_norm) if cfg.x_2d is None else bool(cfg.x_2d),
            RSTD_BLOCK=_rstd_block(k) if rstd_in_kernel else 0, PREFETCH=cfg.num_stages >= 2, **common)
    else:
        dot_f32 = INTERPRETED or weight.dtype == torch.float32 or out_dtype != weight.dtype
        grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m))
        tma = cfg.tma and _use_tma(x2, weight)
        x_desc = TensorDescriptor.from_tensor(x2, [cfg.block_m, cfg.block_k]) if tma else None
        w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k]) if tma else None
        _gemm_kernel[grid](
            x2, weight, y, b, g, rstd, ws, cnt, r, x_desc, w_desc, m, n, k, k_per, x2.stride(0),
            weight.stride(0), y.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, EVEN_K=even_k, SWAP_AB=cfg.swap_ab, DOT_F32=dot_f32, TMA=tma,
            **common)
    return y.reshape(*lead, n)


def _rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Pure torch: ``F.linear(rms_norm(x) if norm_weight else x, weight, bias)`` in the
    activation's dtype (the weight is cast to it; ops.rms_norm's rounding for the norm)."""
    h = x if norm_weight is None else _rms_norm_ref(x, norm_weight, eps)
    return F.linear(h, weight.to(h.dtype), None if bias is None else bias.to(h.dtype))
