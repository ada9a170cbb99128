"""The epilogue both bf12 linear kernels (layouts 1 and 2) end with, as Triton device functions:
undo the constant-exponent decode with the row's base, add the escaped weights' exact
corrections (the sparse fix-up), and store the fp32 tile (with its bias) directly or, under
split-K, through the fp32 workspace where the last program of a tile sums the partials
(``bf12_launch.split_k_workspace``: workspace and ticket counters, left zeroed)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scale_by_base(out, base_ptr, offs_n, mask_n, stride_base):
    """``out * 2**(base - 112)`` per output row (exact: a power of two)."""
    bse = tl.load(base_ptr + offs_n * stride_base, mask=mask_n, other=1).to(tl.int32)
    scale = ((bse + 15) << 23).to(tl.float32, bitcast=True)
    return out * scale[None, :]


@triton.jit
def add_escapes(out, x_rows, rowptr_ptr, erow_ptr, ecol_ptr, etrue_ptr, efake_ptr, offs_n, mask_m, n_lo, n_hi,
                k_start, k_stop, SPLIT_K: tl.constexpr, X_PAIRS: tl.constexpr, ESC_BLOCK: tl.constexpr):
    """``out`` [BLOCK_M, BLOCK_N] plus the escaped weights' corrections for output rows ``n_lo ..
    n_hi - 1`` (the escapes sorted by row, ``rowptr`` their CSR offsets): each escape (row, col)
    decoded as ``fake`` in the main loop adds ``x[:, col] * (true - fake)`` to its row, exactly in
    fp32, once, by the program whose K range [k_start, k_stop) holds col (split-K). ``x_rows``:
    [BLOCK_M, 1] row pointers into x, read as int32 pairs of bf16 when X_PAIRS (layout 1's FMA
    path) or as elements."""
    e_begin = tl.load(rowptr_ptr + n_lo)
    e_end = tl.load(rowptr_ptr + n_hi)
    for e0 in range(e_begin, e_end, ESC_BLOCK):
        offs_e = e0 + tl.arange(0, ESC_BLOCK)
        m_e = offs_e < e_end
        e_row = tl.load(erow_ptr + offs_e, mask=m_e, other=-1)
        e_col = tl.load(ecol_ptr + offs_e, mask=m_e, other=0)
        if SPLIT_K > 1:
            m_e = m_e & (e_col >= k_start) & (e_col < k_stop)
        w_true = tl.load(etrue_ptr + offs_e, mask=m_e, other=0.0)
        w_fake = tl.load(efake_ptr + offs_e, mask=m_e, other=0.0)
        if X_PAIRS:  # x is viewed as int32 pairs of bf16
            x2 = tl.load(x_rows + (e_col >> 1)[None, :], mask=mask_m[:, None] & m_e[None, :], other=0)
            x2 = tl.where((e_col & 1)[None, :] == 1, x2 & -65536, x2 << 16)
            xv = x2.to(tl.float32, bitcast=True)
        else:
            xv = tl.load(x_rows + e_col[None, :], mask=mask_m[:, None] & m_e[None, :],
                         other=0.0).to(tl.float32)  # [BLOCK_M, ESC_BLOCK]
        contrib = xv * w_true[None, :] - xv * w_fake[None, :]
        hit = (e_row[:, None] == offs_n[None, :]) & m_e[:, None]  # [ESC_BLOCK, BLOCK_N]
        out += tl.sum(tl.where(hit[None, :, :], contrib[:, :, None], 0.0), axis=1)
    return out


@triton.jit
def store_tile(out, y_ptr, bias_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, mask_m, mask_n, stride_ym, N, pid_m, pid_n,
               HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store the [BLOCK_M, BLOCK_N] fp32 tile ``out`` (+ bias) into y; with SPLIT_K > 1 add it into
    the workspace, and the tile's last program (ticket SPLIT_K - 1) stores the sum and re-zeroes
    the workspace and its counter for the next launch."""
    y_offs = offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    y_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + y_offs, out.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        ws_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.atomic_add(ws_ptr + ws_offs, out, mask=y_mask, sem="relaxed")
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            zero = tl.zeros_like(out)
            tot = tl.atomic_add(ws_ptr + ws_offs, zero, mask=y_mask, sem="relaxed")  # coherent read
            tl.store(ws_ptr + ws_offs, zero, mask=y_mask)  # every partial of the tile is in
            if HAS_BIAS:
                tot += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + y_offs, tot.to(y_ptr.dtype.element_ty), mask=y_mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")
