"""Ragged (packed) causal attention: rows with their own token counts, cache lengths and slots.

Semantics are exactly those of ``specc.models.ops.ragged_attention``: q ``[1, T, Hq, D]`` and
k/v ``[1, T, Hkv, D]`` hold R rows back to back (row r's tokens are
``t in [row_starts[r], row_starts[r + 1])``, possibly none); token ``t = row_starts[r] + j``
writes its K/V at ``cache[row_slots[r], :, cache_len[r] + j]`` and attends causally to
``cache[row_slots[r], :, : cache_len[r] + j + 1]``. Why: a batched verify where requests verify
different numbers of drafts (per-request draft length; the second level of two-level
verification, where only some rows take part) computes only the tokens it needs, with no
padding rows in the linears and no wasted attention tiles.

Two launches (plus a merge when the cache is split):

* ``_ragged_write_kernel``: one program per (row, KV head) copies the row's new K/V into its
  slot (a loop over the row's tokens: a row with no tokens does nothing).
* ``_ragged_split_kernel``: the flash-decoding tiling of :mod:`.attention` with the row read
  from the descriptor on the device: a program per (row, KV head, KV split, query tile). GQA is
  packed into the tile rows (``(token, head-in-group)`` pairs), so each K/V tile is loaded once
  for all the query heads of its KV head and all the row tile's tokens; fp32 online softmax
  (``attention._attn_tile``, the same tile step as the dense kernel); the row's KV range
  ``[0, cache_len + n)`` is cut into ``num_splits`` parts in the kernel from the row's actual
  length. The grid's query-tile axis is sized for the mean row (``ceil(T / R)`` tokens); a
  longer row's extra tiles are taken by the same programs in a strided loop, so the grid stays
  small whatever the mix, and a row with no tokens costs a few loads. With more than one split,
  ``attention._attn_merge_kernel`` merges the splits per (token, head).

Everything is read on the device (no host sync; CUDA-graph safe for a fixed (T, R)). Contract
beyond the reference's: ``row_starts[0] == 0`` and ``row_starts[R] == T`` (the offsets are
cumulative counts, so every token belongs to a row; with splits, a token outside every row
would get an undefined output instead of the reference's zeros), and the slots are distinct.
Numerics as :mod:`.attention`: fp32 scores and statistics, probabilities rounded to V's dtype
for the PV dot (fp32 under the interpreter), fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import (
    FLOAT_DTYPES,
    INTERPRETED,
    check_same_device,
    check_tensor,
    next_pow2,
    round_to,
    use_triton,
)
from specc.codegen.kernels.attention import _attn_merge_kernel, _attn_tile, launch_plan
from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled
from specc.codegen.kernels.pdl import pdl_args, pdl_wait
from specc.models import ops

__all__ = ["ragged_attention", "ragged_write_kv", "ragged_launch_plan"]

_LOG2E = 1.4426950408889634


@triton.jit
def _ragged_write_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, len_ptr, slot_ptr, start_ptr,
                         HKV, D,
                         stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_cks, stride_ckh, stride_ckl,
                         stride_cvs, stride_cvh, stride_cvl,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    r = pid // HKV
    hk = pid % HKV
    lo = tl.load(start_ptr + r).to(tl.int32)
    n = tl.load(start_ptr + r + 1).to(tl.int32) - lo
    clen = tl.load(len_ptr + r)
    slot = tl.load(slot_ptr + r)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    ck_base = ck_ptr + slot.to(tl.int64) * stride_cks + hk.to(tl.int64) * stride_ckh
    cv_base = cv_ptr + slot.to(tl.int64) * stride_cvs + hk.to(tl.int64) * stride_cvh
    for j0 in range(0, n, BLOCK_T):
        j = j0 + tl.arange(0, BLOCK_T)
        m = (j < n)[:, None] & mask_d[None, :]
        t = (lo + j).to(tl.int64)
        kt = tl.load(k_ptr + t[:, None] * stride_kt + hk * stride_kh + offs_d[None, :], mask=m, other=0.0)
        vt = tl.load(v_ptr + t[:, None] * stride_vt + hk * stride_vh + offs_d[None, :], mask=m, other=0.0)
        pos = (clen + j).to(tl.int64)
        tl.store(ck_base + pos[:, None] * stride_ckl + offs_d[None, :],
                 round_to(kt.to(tl.float32), ck_ptr.dtype.element_ty), mask=m)
        tl.store(cv_base + pos[:, None] * stride_cvl + offs_d[None, :],
                 round_to(vt.to(tl.float32), cv_ptr.dtype.element_ty), mask=m)


@triton.jit
def _ragged_split_kernel(
    q_ptr, ck_ptr, cv_ptr, len_ptr, slot_ptr, start_ptr, o_ptr, part_ptr, lse_ptr,
    G, HKV, ROW_BLOCKS, scale_log2,
    stride_qt, stride_qh,
    stride_cks, stride_ckh, stride_ckl,
    stride_cvs, stride_cvh, stride_cvl,
    stride_ot,
    D, NUM_SPLITS,
    DIRECT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_wait(PDL)
    pid_rh = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    r = pid_rh // HKV
    hk = pid_rh % HKV
    lo = tl.load(start_ptr + r).to(tl.int32)
    qn = tl.load(start_ptr + r + 1).to(tl.int32) - lo  # the row's tokens
    clen = tl.load(len_ptr + r).to(tl.int32)
    slot = tl.load(slot_ptr + r)
    kv_end = clen + qn
    q0 = clen  # cache position of the row's first token
    split_len = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
    s_start = pid_s * split_len
    s_end = tl.minimum(s_start + split_len, kv_end)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    k_base = ck_ptr + slot.to(tl.int64) * stride_cks + hk.to(tl.int64) * stride_ckh
    v_base = cv_ptr + slot.to(tl.int64) * stride_cvs + hk.to(tl.int64) * stride_cvh
    n_rows = qn * G
    # query tiles of this row: pid_m, pid_m + ROW_BLOCKS, ... (none when the row has no tokens)
    for m0 in range(pid_m * BLOCK_M, n_rows, ROW_BLOCKS * BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        mask_r = rows < n_rows
        qi = rows // G
        h = hk * G + rows % G
        tok = (lo + qi).to(tl.int64)
        q = tl.load(q_ptr + tok[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_r[:, None] & mask_d[None, :], other=0.0)
        if DOT_F32:
            qd = q.to(tl.float32)
        else:
            qd = q
        last_q = tl.minimum(m0 + BLOCK_M - 1, n_rows - 1) // G
        end = tl.minimum(s_end, q0 + last_q + 1)  # causal: no key after the tile's last token
        mid = tl.minimum(s_start + (tl.maximum(q0 - s_start, 0) // BLOCK_N) * BLOCK_N, end)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        # key tiles wholly in the committed cache need no causal test
        for n0 in range(s_start, mid, BLOCK_N):
            m_i, l_i, acc = _attn_tile(qd, m_i, l_i, acc, k_base, v_base, n0, end, q0, qi, mask_r, offs_d,
                                       mask_d, stride_ckl, stride_cvl, scale_log2, k_base,
                                       MASK=1, BLOCK_N=BLOCK_N, DOT_F32=DOT_F32)
        for n0 in range(mid, end, BLOCK_N):
            m_i, l_i, acc = _attn_tile(qd, m_i, l_i, acc, k_base, v_base, n0, end, q0, qi, mask_r, offs_d,
                                       mask_d, stride_ckl, stride_cvl, scale_log2, k_base,
                                       MASK=0, BLOCK_N=BLOCK_N, DOT_F32=DOT_F32)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        if DIRECT:
            tl.store(o_ptr + tok[:, None] * stride_ot + h[:, None] * D + offs_d[None, :],
                     round_to(out, o_ptr.dtype.element_ty), mask=mask_r[:, None] & mask_d[None, :])
        else:
            # partials [T, Hq, NUM_SPLITS, D] fp32 and lse [T, Hq, NUM_SPLITS] (base 2): the layout
            # of the dense kernel at B = 1, so its merge kernel merges them
            prow = (tok * (HKV * G) + h) * NUM_SPLITS + pid_s
            tl.store(part_ptr + prow[:, None] * D + offs_d[None, :], out,
                     mask=mask_r[:, None] & mask_d[None, :])
            lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
            tl.store(lse_ptr + prow, lse, mask=mask_r)


def ragged_launch_plan(total: int, num_rows: int, num_heads: int, num_kv_heads: int, head_dim: int,
                       max_kv_len: int, device: torch.device, block_n: int | None = None,
                       block_m: int | None = None) -> dict:
    """Tiles and KV splits of :func:`ragged_attention`: the dense :func:`.attention.launch_plan`
    for R rows of the mean row length ``ceil(T / R)`` (the grid's query-tile axis,
    ``row_blocks``, covers that many tokens per row; longer rows loop).

    Batch-invariant mode (:mod:`.batch_invariant`): the mean row, and so the tiles and splits,
    depend on the other rows of the launch; the mode plans the tiles, splits and stages as for one
    row of one token instead (a function of the heads, head size and ``max_kv_len`` only) and
    keeps the mean row for ``row_blocks`` alone, which only deals the same tiles to programs."""
    mean = max(1, triton.cdiv(total, max(num_rows, 1)))
    if batch_invariant_enabled():
        plan = launch_plan(1, 1, num_heads, num_kv_heads, head_dim, max_kv_len, device, block_n, block_m)
        plan["row_blocks"] = triton.cdiv(mean * (num_heads // num_kv_heads), plan["block_m"])
        plan["fused_merge"] = False
        return plan
    plan = launch_plan(max(num_rows, 1), mean, num_heads, num_kv_heads, head_dim, max_kv_len, device,
                       block_n, block_m)
    plan["fused_merge"] = False  # the split kernel has no in-kernel merge here
    return plan


def _check(q, k, v, cache_k, cache_v, cache_len, row_slots, row_starts, op):
    check_tensor("q", q, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("k", k, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("v", v, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_k", cache_k, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_v", cache_v, op, ndim=4, dtypes=FLOAT_DTYPES)
    ints = (torch.int64, torch.int32)
    check_tensor("cache_len", cache_len, op, ndim=1, dtypes=ints)
    check_tensor("row_slots", row_slots, op, ndim=1, dtypes=ints)
    check_tensor("row_starts", row_starts, op, ndim=1, dtypes=ints)
    one, total, hq, d = q.shape
    if one != 1:
        raise ValueError(f"{op}: q must be one packed row [1, T, Hq, D], got {tuple(q.shape)}")
    if k.shape != v.shape or k.shape[0] != 1 or k.shape[1] != total or k.shape[3] != d:
        raise ValueError(f"{op}: k/v must be [1, {total}, Hkv, {d}], got {tuple(k.shape)} / {tuple(v.shape)}")
    hkv = k.shape[2]
    if tuple(cache_k.shape) != tuple(cache_v.shape):
        raise ValueError(f"{op}: cache_v shape {tuple(cache_v.shape)} != cache_k shape {tuple(cache_k.shape)}")
    if cache_k.shape[1] != hkv or cache_k.shape[3] != d:
        raise ValueError(f"{op}: caches {tuple(cache_k.shape)} do not hold [S, {hkv}, L, {d}] keys")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"{op}: {hq} query heads are not a multiple of {hkv} KV heads")
    rows = row_slots.shape[0]
    if cache_len.shape[0] != rows or row_starts.shape[0] != rows + 1:
        raise ValueError(f"{op}: {rows} row slots need cache_len [{rows}] and row_starts [{rows + 1}], got "
                         f"{tuple(cache_len.shape)} and {tuple(row_starts.shape)}")
    if rows > cache_k.shape[0]:
        raise ValueError(f"{op}: {rows} rows exceed the cache's {cache_k.shape[0]} slots")
    check_same_device(op, q=q, k=k, v=v, cache_k=cache_k, cache_v=cache_v, cache_len=cache_len,
                      row_slots=row_slots, row_starts=row_starts)


def _unit_inner(op, **tensors):
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} needs unit stride along the head dim")


def ragged_write_kv(k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                    cache_len: torch.Tensor, row_slots: torch.Tensor, row_starts: torch.Tensor) -> None:
    """Write row r's new K/V ``k[0, row_starts[r] + j]`` at ``cache[row_slots[r], :, cache_len[r] + j]``
    (one Triton launch; slots not named and rows with no tokens are untouched)."""
    rows, hkv, d = row_slots.shape[0], k.shape[2], k.shape[3]
    if rows == 0 or k.shape[1] == 0:
        return
    _unit_inner("ragged_write_kv", k=k, v=v, cache_k=cache_k, cache_v=cache_v)
    _ragged_write_kernel[(rows * hkv,)](
        k, v, cache_k, cache_v, cache_len, row_slots, row_starts,
        hkv, d,
        k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        BLOCK_T=16, BLOCK_D=max(16, next_pow2(d)), num_warps=4, **pdl_args(k, "ragged_attention"),
    )


def ragged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                     cache_v: torch.Tensor, cache_len: torch.Tensor, row_slots: torch.Tensor,
                     row_starts: torch.Tensor, scale: float, *, num_splits: int | None = None,
                     max_kv_len: int | None = None, out: torch.Tensor | None = None,
                     block_n: int | None = None, block_m: int | None = None, num_warps: int = 4,
                     num_stages: int | None = None) -> torch.Tensor:
    """``ops.ragged_attention`` (cache write included) as Triton kernels; returns ``[1, T, Hq*D]``
    in q's dtype (into ``out`` if given, a contiguous tensor of that shape).

    num_splits: KV splits per row (default from ``max_kv_len``, the longest expected
    ``cache_len + n`` of a row, default the cache length L); block_n / block_m / num_warps /
    num_stages: tuning knobs of the split kernel (defaults: :func:`ragged_launch_plan`). A CPU
    tensor outside the Triton interpreter runs the reference (which syncs on the descriptor)."""
    op = "ragged_attention"
    _check(q, k, v, cache_k, cache_v, cache_len, row_slots, row_starts, op)
    _, total, hq, d = q.shape
    hkv, cap = k.shape[2], cache_k.shape[2]
    rows = row_slots.shape[0]
    if out is None:
        out = torch.empty(1, total, hq * d, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (1, total, hq * d) or not out.is_contiguous() or out.dtype != q.dtype:
        raise ValueError(f"{op}: out must be a contiguous {q.dtype} tensor of shape {(1, total, hq * d)}")
    if not use_triton(q):
        out.copy_(ops.ragged_attention(q, k, v, cache_k, cache_v, cache_len, row_slots, row_starts, scale))
        return out
    if total == 0 or rows == 0:
        return out
    _unit_inner(op, q=q, cache_k=cache_k, cache_v=cache_v)
    ragged_write_kv(k, v, cache_k, cache_v, cache_len, row_slots, row_starts)
    g = hq // hkv
    kv_hint = min(cap, max_kv_len) if max_kv_len is not None else cap
    plan = ragged_launch_plan(total, rows, hq, hkv, d, kv_hint, q.device, block_n, block_m)
    block_m, block_n, block_d = plan["block_m"], plan["block_n"], plan["block_d"]
    num_splits = int(max(1, plan["num_splits"] if num_splits is None else num_splits))
    num_stages = plan["num_stages"] if num_stages is None else num_stages
    # the query-tile axis: the mean row's tiles, never more than the whole block's
    row_blocks = min(plan["row_blocks"], triton.cdiv(total * g, block_m))
    if num_splits > 1:
        part = torch.empty(total * hq * num_splits * d, dtype=torch.float32, device=q.device)
        lse = torch.empty(total * hq * num_splits, dtype=torch.float32, device=q.device)
    else:
        part = lse = out
    dot_f32 = INTERPRETED or q.dtype == torch.float32 or cache_v.dtype == torch.float32 \
        or q.dtype != cache_k.dtype
    _ragged_split_kernel[(rows * hkv, num_splits, row_blocks)](
        q, cache_k, cache_v, cache_len, row_slots, row_starts, out, part, lse,
        g, hkv, row_blocks, float(scale) * _LOG2E,
        q.stride(1), q.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        out.stride(1),
        d, num_splits,
        DIRECT=num_splits == 1,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DOT_F32=dot_f32,
        num_warps=num_warps, num_stages=num_stages, **pdl_args(q, "ragged_attention"),
    )
    if num_splits > 1:
        _attn_merge_kernel[(total * hq,)](
            part, lse, out, total, hq, d, out.stride(0), out.stride(1), num_splits,
            BLOCK_S=max(2, next_pow2(num_splits)), BLOCK_D=block_d, num_warps=4,
            **pdl_args(q, "ragged_attention"),
        )
    return out
