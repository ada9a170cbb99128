"""The epilogue both bf12 linear kernels (layouts 1 and 2) end with, as Triton device functions:
undo the constant-exponent decode with the row's base, and store the fp32 tile (with its bias)
directly or, under split-K, through the fp32 workspace where the last program of a tile sums
the partials (``bf12_launch.split_k_workspace``: workspace and ticket counters, left zeroed)."""

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
