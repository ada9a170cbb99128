"""KV-cache compaction: move cache entries of chosen slots to other slots, per batch row.

After tree verification the accepted path's K/V sit at scattered slots of the block; this copies
``cache[b, :, src_slots[b, p]] -> cache[b, :, dst_slots[b, p]]`` for ``p < count[b]`` (all
pairs without ``count``; pairs with a negative or out-of-range slot are skipped), for K and V,
every KV head. Truncation needs no kernel: it is just the lengths.

Each program owns one (row, KV head, D block) and loads every source entry of its pairs before
it stores any (a barrier in between), so overlapping source and destination sets (compaction
towards the front of the block) are safe. One launch per layer's cache pair (``kv_compact``), or
one launch for every layer (``kv_compact_layers``: the layers' cache addresses in a table, the
layer a grid axis), which a tree step's commit uses: 36 launches of ~1.8 us each took 65 us of
a Qwen3-8B tree step's kernel time on the H200 (docs/benchmarks/h200-run7.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import check_same_device, check_tensor, next_pow2, use_triton
from specc.codegen.kernels.pdl import pdl_args, pdl_wait

__all__ = ["kv_compact", "kv_compact_layers", "kv_compact_reference"]


@triton.jit
def _compact_tile(kb, vb, src_ptr, dst_ptr, b, limit, P, S, D, stride_ks, stride_vs, stride_src, stride_dst,
                  BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    """Move one (row, KV head)'s entries ``src -> dst`` (the first ``min(P, limit)`` pairs of row
    ``b``; invalid slots skipped) for a ``BLOCK_D`` slice of the head dim: ``kb`` / ``vb`` point at
    the row and head of K and V. Every read lands before any write (the debug barrier)."""
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = (offs_p < P) & (offs_p < limit)
    src = tl.load(src_ptr + b.to(tl.int64) * stride_src + offs_p, mask=mask_p, other=-1)
    dst = tl.load(dst_ptr + b.to(tl.int64) * stride_dst + offs_p, mask=mask_p, other=-1)
    ok = mask_p & (src >= 0) & (src < S) & (dst >= 0) & (dst < S)
    m2 = ok[:, None] & (offs_d < D)[None, :]
    src64 = src.to(tl.int64)[:, None]
    dst64 = dst.to(tl.int64)[:, None]
    kt = tl.load(kb + src64 * stride_ks + offs_d[None, :], mask=m2, other=0.0)
    vt = tl.load(vb + src64 * stride_vs + offs_d[None, :], mask=m2, other=0.0)
    tl.debug_barrier()
    tl.store(kb + dst64 * stride_ks + offs_d[None, :], kt, mask=m2)
    tl.store(vb + dst64 * stride_vs + offs_d[None, :], vt, mask=m2)


@triton.jit
def _kv_compact_kernel(ck_ptr, cv_ptr, src_ptr, dst_ptr, cnt_ptr, P, S, D, HKV,
                       stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                       stride_src, stride_dst,
                       HAS_CNT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    b = pid // HKV
    h = pid % HKV
    if HAS_CNT:
        limit = tl.load(cnt_ptr + b)
    else:
        limit = P
    kb = ck_ptr + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    vb = cv_ptr + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    _compact_tile(kb, vb, src_ptr, dst_ptr, b, limit, P, S, D, stride_ks, stride_vs, stride_src, stride_dst,
                  BLOCK_P, BLOCK_D)


@triton.jit
def _kv_compact_layers_kernel(kptrs, vptrs, src_ptr, dst_ptr, cnt_ptr, P, S, D, HKV,
                              stride_b, stride_h, stride_s, stride_src, stride_dst,
                              DTYPE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0):
    """``_kv_compact_kernel`` with the layer as grid axis 2; K and V of every layer share one
    shape and strides; their base addresses are the int64 tables ``kptrs`` / ``vptrs``."""
    pdl_wait(PDL)
    pid = tl.program_id(0)
    b = pid // HKV
    h = pid % HKV
    layer = tl.program_id(2)
    row = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    kb = tl.load(kptrs + layer).to(tl.pointer_type(DTYPE)) + row
    vb = tl.load(vptrs + layer).to(tl.pointer_type(DTYPE)) + row
    _compact_tile(kb, vb, src_ptr, dst_ptr, b, tl.load(cnt_ptr + b), P, S, D, stride_s, stride_s, stride_src,
                  stride_dst, BLOCK_P, BLOCK_D)


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
# (device, the layers' K and V addresses) -> (K table, V table) on the device. Never evicted: a
# captured CUDA graph reads its table, and a table is a few bytes per layer; a new set of caches
# at the addresses of a freed one gets that table, whose contents are those same addresses.
_TABLES: dict = {}


def _address_table(caches, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The int64 tables of K and V base addresses, made once per set of caches: later calls,
    and CUDA-graph captures of the commit, reuse the first call's tensors (no copy to record)."""
    key = (str(device), tuple((k.data_ptr(), v.data_ptr()) for k, v in caches))
    tables = _TABLES.get(key)
    if tables is None:
        tables = _TABLES[key] = tuple(torch.tensor([c.data_ptr() for c in side], dtype=torch.int64, device=device)
                                      for side in zip(*caches))
    return tables


def kv_compact_layers(caches, src_slots: torch.Tensor, dst_slots: torch.Tensor, count: torch.Tensor,
                      opt_in: bool = True) -> None:
    """``kv_compact`` over every (cache_k, cache_v) pair of ``caches`` with one launch when they
    all have one shape, dtype and strides (a uniform model's layers) and run as Triton kernels;
    otherwise one ``kv_compact`` per pair. ``count`` [B] is required (a tree commit's accepted
    lengths)."""
    caches = list(caches)
    if not caches:
        return
    k0 = caches[0][0]
    uniform = all(t.shape == k0.shape and t.dtype == k0.dtype and t.stride() == k0.stride()
                  for pair in caches for t in pair)
    if not (uniform and k0.dtype in _TL_DTYPES and use_triton(k0, opt_in=opt_in)):
        for cache_k, cache_v in caches:
            kv_compact(cache_k, cache_v, src_slots, dst_slots, count, opt_in=opt_in)
        return
    for cache_k, cache_v in caches:
        _check(cache_k, cache_v, src_slots, dst_slots, count, "kv_compact_layers")
    bsz, p = src_slots.shape
    _, hkv, s, d = k0.shape
    if bsz == 0 or p == 0:
        return
    if k0.stride(-1) != 1:
        raise ValueError("kv_compact_layers: caches need unit stride along the head dim")
    src = src_slots if src_slots.stride(-1) == 1 else src_slots.contiguous()
    dst = dst_slots if dst_slots.stride(-1) == 1 else dst_slots.contiguous()
    kptrs, vptrs = _address_table(caches, k0.device)
    block_d = min(128, max(16, next_pow2(d)))
    _kv_compact_layers_kernel[(bsz * hkv, triton.cdiv(d, block_d), len(caches))](
        kptrs, vptrs, src, dst, count, p, s, d, hkv, k0.stride(0), k0.stride(1), k0.stride(2),
        src.stride(0), dst.stride(0), DTYPE=_TL_DTYPES[k0.dtype], BLOCK_P=max(2, next_pow2(p)),
        BLOCK_D=block_d, num_warps=4, **pdl_args(kptrs, "kv_compact"))


def _check(cache_k, cache_v, src_slots, dst_slots, count, op):
    check_tensor("cache_k", cache_k, op, ndim=4)
    check_tensor("cache_v", cache_v, op, ndim=4)
    if cache_k.shape != cache_v.shape:
        raise ValueError(f"{op}: cache_k {tuple(cache_k.shape)} and cache_v "
                         f"{tuple(cache_v.shape)} differ")
    check_tensor("src_slots", src_slots, op, ndim=2, dtypes=(torch.int64, torch.int32))
    check_tensor("dst_slots", dst_slots, op, ndim=2, dtypes=(torch.int64, torch.int32))
    if src_slots.shape != dst_slots.shape:
        raise ValueError(f"{op}: src_slots {tuple(src_slots.shape)} and dst_slots "
                         f"{tuple(dst_slots.shape)} differ")
    if src_slots.shape[0] > cache_k.shape[0]:
        raise ValueError(f"{op}: {src_slots.shape[0]} rows of slots for a cache of "
                         f"{cache_k.shape[0]} rows")
    if count is not None:
        check_tensor("count", count, op, ndim=1, dtypes=(torch.int64, torch.int32))
        if count.shape[0] != src_slots.shape[0]:
            raise ValueError(f"{op}: count must be [B={src_slots.shape[0]}]")
    check_same_device(op, cache_k=cache_k, cache_v=cache_v, src_slots=src_slots,
                      dst_slots=dst_slots, count=count)


def kv_compact(cache_k: torch.Tensor, cache_v: torch.Tensor, src_slots: torch.Tensor,
               dst_slots: torch.Tensor, count: torch.Tensor | None = None, opt_in: bool = True) -> None:
    """In place: for rows b < B and pairs p (< count[b]) copy slot src_slots[b, p] to
    dst_slots[b, p] in cache_k and cache_v ``[Bmax, Hkv, S, D]`` (all heads).
    src/dst_slots: ``[B, P]`` int; count: ``[B]`` int or None."""
    op = "kv_compact"
    _check(cache_k, cache_v, src_slots, dst_slots, count, op)
    if not use_triton(cache_k, opt_in=opt_in):  # interpreter on CPU: only when opted in (slow)
        kv_compact_reference(cache_k, cache_v, src_slots, dst_slots, count)
        return
    bsz, p = src_slots.shape
    _, hkv, s, d = cache_k.shape
    if bsz == 0 or p == 0:
        return
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError(f"{op}: caches need unit stride along the head dim")
    src = src_slots if src_slots.stride(-1) == 1 else src_slots.contiguous()
    dst = dst_slots if dst_slots.stride(-1) == 1 else dst_slots.contiguous()
    block_d = min(128, max(16, next_pow2(d)))
    _kv_compact_kernel[(bsz * hkv, triton.cdiv(d, block_d))](
        cache_k, cache_v, src, dst, count if count is not None else src, p, s, d, hkv,
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        src.stride(0), dst.stride(0),
        HAS_CNT=count is not None, BLOCK_P=max(2, next_pow2(p)), BLOCK_D=block_d, num_warps=4, **pdl_args(cache_k, "kv_compact"))


def kv_compact_reference(cache_k, cache_v, src_slots, dst_slots, count=None) -> None:
    """Pure torch, in place (all sources are read before any destination is written)."""
    bsz, p = src_slots.shape
    s = cache_k.shape[2]
    for b in range(bsz):
        n = p if count is None else max(0, min(p, int(count[b])))
        src = src_slots[b, :n].to(torch.int64)
        dst = dst_slots[b, :n].to(torch.int64)
        keep = (src >= 0) & (src < s) & (dst >= 0) & (dst < s)
        src, dst = src[keep], dst[keep]
        for cache in (cache_k, cache_v):
            vals = cache[b, :, src].clone()
            cache[b, :, dst] = vals
