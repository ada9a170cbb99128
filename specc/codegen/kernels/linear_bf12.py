"""Fused decode + GEMV/GEMM on lossless 12-bit weights: ``y = x @ W^T (+ bias)``.

W is a :class:`specc.formats.bf12.Packed12` of an ``[N, K]`` bf16 weight (``nn.Linear`` layout);
its module docstring describes the layout this kernel was designed around (layout version 1).
:func:`linear_bf12` is the entry point for both layouts: it checks the inputs and hands
version-2 weights to :mod:`specc.codegen.kernels.linear_bf12_v2`. One Triton kernel,
two inner loops chosen by the config:

* ``kind="fma"`` (M = 1 .. 4: a decode-bound GEMV on CUDA cores). Each program owns
  ``BLOCK_N`` rows and a range of 16-weight words (all of K, or a split-K share); per iteration
  it loads three int64 ``[BLOCK_N, BLOCK_J]`` tiles (two sign|mantissa planes and the code
  plane: 24 bytes per word, all contiguous along K and in one register layout), decodes each
  pair of weights into a bf16x2 word with ~4 integer ops (prmt + shift + 2 lop3; ``use_asm``
  emits exactly that, else the same in Triton ops), widens to fp32 (one shift / one and) and
  FMAs into one fp32 ``[BLOCK_N, BLOCK_J]`` accumulator per row of x, reduced once at the end.
  x is read as ``[1, BLOCK_J]`` slices broadcast along rows (bf16 x: as int32 pairs, one load
  and shift/and per pair), so one x value serves every row a thread holds. ``prefetch`` issues
  the next tile's loads before decoding the current one (software pipelining in registers;
  Triton's own pipeliner only handles loops that feed a dot).
* ``kind="dot"`` (M = 2 .. 64: tensor cores). The same decode gives 8 bf16x2 tiles per
  iteration; a tree of ``tl.join`` puts them back in natural K order as one bf16
  ``[BLOCK_N, 16 * BLOCK_J]`` tile (the order of the joins is the bit order of the weight's
  index in its word, so the final reshape is free in registers), and one ``tl.dot`` with the
  contiguous x tile ``[BLOCK_M, 16 * BLOCK_J]`` accumulates in fp32. Triton pipelines the raw
  int64 tiles and x through shared memory (cp.async, ``num_stages``). ``swap_ab`` computes
  ``W @ x^T`` instead (decoded tile as MMA operand A, the small M as the MMA's N).

Batch-invariant mode (:mod:`specc.codegen.kernels.batch_invariant`): :func:`get_config` returns
:data:`BATCH_INVARIANT_CONFIG` (the dot kernel, one split) at every M, so a row's bits do not
depend on the rows beside it; an explicit ``config`` is honoured as given.

Exactness. The kernel never branches on escapes: the planes store an escaped weight as the
finite stand-in ``2**(base - 127)`` (see the format). After the main loop each program walks
the escape table's entries for its rows (CSR over the sorted table, usually 0 - 3 entries per
row at realistic rates) and adds ``x[m, k] * w_true - x[m, k] * w_standin`` to its fp32
outputs, before the single rounding to the output dtype. Both products are exact in fp32 for
bf16 x, so this is the ordinary bf16 matmul with fp32 accumulation on the *exact* weights
(the same contract as cuBLAS, up to summation order). Doing it in-kernel costs one extra
short loop per program and no extra launch -- at M = 1 a 4096 x 4096 layer takes ~6 us, so a
second kernel (3 - 5 us of launch and tail) would have eaten the gain; inf/NaN weights also
propagate exactly as in the reference (``0 * inf = nan``).

Codes decode to the *constant* exponent ``0x70 + c``, i.e. to ``W * 2**(112 - base)``; the
power of two is multiplied back once per output (exact), so the inner loop has no per-row
value in it.

Split-K (``split_k > 1``): partial sums go to an fp32 workspace with atomics; the last program
of an output tile (a ticket counter) reads the workspace (an atomic add of 0) and zeroes it, adds
the bias, rounds and stores, and resets the counter, so there is no memset or epilogue launch
and the workspace is clean for the next call. The workspace is per device: do not run two
split-K launches of the same device concurrently on different streams.

CPU. Under the Triton interpreter (``TRITON_INTERPRET=1`` set before triton is first imported;
Triton fixes the mode for its own library functions at import) the integer decode is the same,
the bf16 bits are widened to fp32 exactly (``bits << 16``), and dots run in fp32 (``ieee``):
the interpreter cannot do bf16 arithmetic. Use fp32 (or fp16) activations there.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specc.codegen.kernels._common import ConfigTable
from specc.codegen.kernels.bf12_epilogue import add_escapes, scale_by_base, store_tile
from specc.codegen.kernels.bf12_launch import M_BUCKETS, check_config, escape_meta, m_bucket, split_k_workspace
from specc.codegen.kernels.pdl import pdl_launch, pdl_mode, pdl_wait
from specc.formats.bf12 import Packed12

__all__ = [
    "Bf12Config",
    "linear_bf12",
    "linear_bf12_reference",
    "get_config",
    "set_config",
    "clear_configs",
    "m_bucket",
    "M_BUCKETS",
    "DEFAULT_CONFIGS",
    "BATCH_INVARIANT_CONFIG",
    "INTERPRETED",
]



# ------------------------------------------------------------------------------------------
# the kernel
# ------------------------------------------------------------------------------------------
@triton.jit
def _decode_pair(sw, c32, P: tl.constexpr, USE_ASM: tl.constexpr):
    """Weights (8h + 2P, 8h + 2P + 1) of a word as one bf16x2 (uint32, low half first), with
    exponent 0x70 + code, i.e. scaled by 2**(112 - base). ``sw``: the 4 sm bytes of pairs
    (P & ~1, P | 1) of half h; ``c32``: the 8 codes of half h (see the format docstring)."""
    # codes of the pair -> bits 7..10 and 23..26
    if P == 0:
        ec = c32 << 7
    elif P == 1:
        ec = c32 << 3
    elif P == 2:
        ec = c32 >> 1
    else:
        ec = c32 >> 5
    if USE_ASM:
        if P % 2 == 0:
            wp = tl.inline_asm_elementwise(
                "{ .reg .b32 t, u; prmt.b32 t, $1, $1, 0x1100; "
                "lop3.b32 u, $2, 0x07800780, 0x38003800, 0xEA; "
                "lop3.b32 $0, t, 0x807F807F, u, 0xEA; }",
                "=r,r,r", [sw, ec], dtype=tl.uint32, is_pure=True, pack=1)
        else:
            wp = tl.inline_asm_elementwise(
                "{ .reg .b32 t, u; prmt.b32 t, $1, $1, 0x3322; "
                "lop3.b32 u, $2, 0x07800780, 0x38003800, 0xEA; "
                "lop3.b32 $0, t, 0x807F807F, u, 0xEA; }",
                "=r,r,r", [sw, ec], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        if P % 2 == 0:
            smp = (sw & 0x7F) | ((sw << 8) & 0x7F8000) | ((sw << 16) & 0x80000000)
        else:
            smp = ((sw >> 16) & 0x7F) | ((sw >> 8) & 0x7F8000) | (sw & 0x80000000)
        wp = smp | ((ec & 0x07800780) | 0x38003800)
    return wp


@triton.jit
def _fma_pair(acc, wp, xp, k_e, xmask, K, X_PAIRS: tl.constexpr):
    """acc += w[k_e] * x[k_e] + w[k_e + 1] * x[k_e + 1] in fp32 (weights from bf16x2 ``wp``).
    ``xp``: the x row (int32 pairs of bf16 if X_PAIRS, else elements); ``k_e``: [1, BLOCK_J]."""
    f_e = (wp << 16).to(tl.float32, bitcast=True)
    f_o = (wp & 0xFFFF0000).to(tl.float32, bitcast=True)
    if X_PAIRS:
        x2 = tl.load(xp + (k_e >> 1), mask=xmask & (k_e < K), other=0)
        x_e = (x2 << 16).to(tl.float32, bitcast=True)
        x_o = (x2 & -65536).to(tl.float32, bitcast=True)
    else:
        x_e = tl.load(xp + k_e, mask=xmask & (k_e < K), other=0.0).to(tl.float32)
        x_o = tl.load(xp + k_e + 1, mask=xmask & (k_e + 1 < K), other=0.0).to(tl.float32)
    acc += f_e * x_e
    acc += f_o * x_o
    return acc


@triton.jit
def _halves(wp, DOT_BF16: tl.constexpr):
    if DOT_BF16:
        lo = wp.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = (wp >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        lo = (wp << 16).to(tl.float32, bitcast=True)
        hi = (wp & 0xFFFF0000).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _bf12_linear_kernel(
    x_ptr, sm_ptr, ex_ptr, base_ptr, y_ptr, bias_ptr,
    rowptr_ptr, erow_ptr, ecol_ptr, etrue_ptr, efake_ptr,
    ws_ptr, cnt_ptr,
    M, N, K, K16, J_PER_SPLIT,
    stride_xm, stride_ym, stride_base,
    USE_DOT: tl.constexpr, SWAP_AB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ESC: tl.constexpr,
    ESC_BLOCK: tl.constexpr, DOT_BF16: tl.constexpr, USE_ASM: tl.constexpr,
    X_PAIRS: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    j_start = pid_k * J_PER_SPLIT
    j_end = tl.minimum(j_start + J_PER_SPLIT, K16)
    rows64 = offs_n.to(tl.int64)
    sm_rows = sm_ptr + rows64[:, None] * (2 * K16)  # int64 words; plane h at + h * K16
    ex_rows = ex_ptr + rows64[:, None] * K16
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1] (escape loop)

    if USE_DOT:
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_lim = tl.minimum(K, 16 * j_end)
    else:
        # One [BLOCK_N, BLOCK_J] fp32 accumulator per row of x (BLOCK_M <= 4), in the layout of
        # the weight tiles; the x slices are [1, BLOCK_J] and broadcast along rows.
        x0 = x_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_xm
        acc0 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
        if BLOCK_M > 1:
            acc1 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
        if BLOCK_M > 2:
            acc2 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
            acc3 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
        if PREFETCH:  # software pipelining in registers: next tile's loads fly during decode
            offs_p = j_start + tl.arange(0, BLOCK_J)
            pmask = mask_n[:, None] & (offs_p < j_end)[None, :]
            nx_a = tl.load(sm_rows + offs_p[None, :], mask=pmask, other=0)
            nx_b = tl.load(sm_rows + K16 + offs_p[None, :], mask=pmask, other=0)
            nx_c = tl.load(ex_rows + offs_p[None, :], mask=pmask, other=0)
    # weights only above (the fma path's first tile with PREFETCH): nothing an earlier kernel writes
    pdl_wait(PDL)

    for j0 in range(j_start, j_end, BLOCK_J):
        offs_j = j0 + tl.arange(0, BLOCK_J)
        mask_j = offs_j < j_end
        if PREFETCH and not USE_DOT:
            s_a = nx_a
            s_b = nx_b
            cw = nx_c
            offs_p = offs_j + BLOCK_J
            pmask = mask_n[:, None] & (offs_p < j_end)[None, :]
            nx_a = tl.load(sm_rows + offs_p[None, :], mask=pmask, other=0)
            nx_b = tl.load(sm_rows + K16 + offs_p[None, :], mask=pmask, other=0)
            nx_c = tl.load(ex_rows + offs_p[None, :], mask=pmask, other=0)
        else:
            wmask = mask_n[:, None] & mask_j[None, :]
            s_a = tl.load(sm_rows + offs_j[None, :], mask=wmask, other=0)
            s_b = tl.load(sm_rows + K16 + offs_j[None, :], mask=wmask, other=0)
            cw = tl.load(ex_rows + offs_j[None, :], mask=wmask, other=0)
        c0 = cw.to(tl.uint32)
        c1 = (cw >> 32).to(tl.uint32)
        a_lo = s_a.to(tl.uint32)
        a_hi = (s_a >> 32).to(tl.uint32)
        b_lo = s_b.to(tl.uint32)
        b_hi = (s_b >> 32).to(tl.uint32)
        # w{h}{p}: weights 16 j + 8 h + 2 p (+1)
        w00 = _decode_pair(a_lo, c0, 0, USE_ASM)
        w01 = _decode_pair(a_lo, c0, 1, USE_ASM)
        w02 = _decode_pair(a_hi, c0, 2, USE_ASM)
        w03 = _decode_pair(a_hi, c0, 3, USE_ASM)
        w10 = _decode_pair(b_lo, c1, 0, USE_ASM)
        w11 = _decode_pair(b_lo, c1, 1, USE_ASM)
        w12 = _decode_pair(b_hi, c1, 2, USE_ASM)
        w13 = _decode_pair(b_hi, c1, 3, USE_ASM)
        if USE_DOT:
            # [BLOCK_N, 16 * BLOCK_J] in natural K order: joins from the slowest index of
            # q = 8h + 4p1 + 2p0 + parity to the fastest (join appends the fastest dim)
            l00, h00 = _halves(w00, DOT_BF16)
            l01, h01 = _halves(w01, DOT_BF16)
            l02, h02 = _halves(w02, DOT_BF16)
            l03, h03 = _halves(w03, DOT_BF16)
            l10, h10 = _halves(w10, DOT_BF16)
            l11, h11 = _halves(w11, DOT_BF16)
            l12, h12 = _halves(w12, DOT_BF16)
            l13, h13 = _halves(w13, DOT_BF16)
            # over h
            t0l = tl.join(l00, l10)
            t0h = tl.join(h00, h10)
            t1l = tl.join(l01, l11)
            t1h = tl.join(h01, h11)
            t2l = tl.join(l02, l12)
            t2h = tl.join(h02, h12)
            t3l = tl.join(l03, l13)
            t3h = tl.join(h03, h13)
            # over p1 (p = 2 p1 + p0)
            u0l = tl.join(t0l, t2l)
            u0h = tl.join(t0h, t2h)
            u1l = tl.join(t1l, t3l)
            u1h = tl.join(t1h, t3h)
            # over p0, then parity
            vl = tl.join(u0l, u1l)
            vh = tl.join(u0h, u1h)
            wt = tl.reshape(tl.join(vl, vh), (BLOCK_N, 16 * BLOCK_J))
            offs_k = 16 * j0 + tl.arange(0, 16 * BLOCK_J)
            xt = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & (offs_k < k_lim)[None, :],
                         other=0.0)
            if DOT_BF16:
                xt = xt.to(tl.bfloat16)
                if SWAP_AB:
                    acc = tl.dot(wt, tl.trans(xt), acc)
                else:
                    acc = tl.dot(xt, tl.trans(wt), acc)
            else:
                xt = xt.to(tl.float32)
                if SWAP_AB:
                    acc = tl.dot(wt, tl.trans(xt), acc, input_precision="ieee")
                else:
                    acc = tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
        else:
            kb = 16 * offs_j[None, :]  # [1, BLOCK_J]
            for m in tl.static_range(BLOCK_M):
                xp = x0 + m * stride_xm
                m_ok = (pid_m * BLOCK_M + m + tl.zeros((1, 1), dtype=tl.int32)) < M
                xmask = mask_j[None, :] & m_ok
                if m == 0:
                    a = acc0
                elif m == 1:
                    a = acc1
                elif m == 2:
                    a = acc2
                else:
                    a = acc3
                # (with X_PAIRS, K is even: a pair is all in range or all out)
                a = _fma_pair(a, w00, xp, kb, xmask, K, X_PAIRS)
                a = _fma_pair(a, w01, xp, kb + 2, xmask, K, X_PAIRS)
                a = _fma_pair(a, w02, xp, kb + 4, xmask, K, X_PAIRS)
                a = _fma_pair(a, w03, xp, kb + 6, xmask, K, X_PAIRS)
                a = _fma_pair(a, w10, xp, kb + 8, xmask, K, X_PAIRS)
                a = _fma_pair(a, w11, xp, kb + 10, xmask, K, X_PAIRS)
                a = _fma_pair(a, w12, xp, kb + 12, xmask, K, X_PAIRS)
                a = _fma_pair(a, w13, xp, kb + 14, xmask, K, X_PAIRS)
                if m == 0:
                    acc0 = a
                elif m == 1:
                    acc1 = a
                elif m == 2:
                    acc2 = a
                else:
                    acc3 = a

    if USE_DOT:
        if SWAP_AB:
            out = tl.trans(acc)
        else:
            out = acc
    else:
        s0 = tl.sum(acc0, axis=1)
        if BLOCK_M == 1:
            out = s0[None, :]
        elif BLOCK_M == 2:
            out = tl.trans(tl.join(s0, tl.sum(acc1, axis=1)))
        else:
            s02 = tl.join(s0, tl.sum(acc2, axis=1))
            s13 = tl.join(tl.sum(acc1, axis=1), tl.sum(acc3, axis=1))
            out = tl.trans(tl.reshape(tl.join(s02, s13), (BLOCK_N, 4)))
    # undo the constant-exponent decode: * 2**(base - 112), exact
    out = scale_by_base(out, base_ptr, offs_n, mask_n, stride_base)

    if HAS_ESC:  # exact sparse fix-up of the escaped weights of this program's rows and K range
        n_lo = pid_n * BLOCK_N
        out = add_escapes(out, x_rows, rowptr_ptr, erow_ptr, ecol_ptr, etrue_ptr, efake_ptr, offs_n, mask_m, n_lo,
                          tl.minimum(n_lo + BLOCK_N, N), 16 * j_start, 16 * j_end, SPLIT_K, X_PAIRS, ESC_BLOCK)

    store_tile(out, y_ptr, bias_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, mask_m, mask_n, stride_ym, N, pid_m, pid_n,
               HAS_BIAS, SPLIT_K)


_kernel = _bf12_linear_kernel
# Triton's interpreter replaces its own library functions (tl.zeros, tl.sum, ...) when it is
# imported with TRITON_INTERPRET=1, so the mode is fixed process-wide at triton's import.
INTERPRETED = type(_kernel).__name__ == "InterpretedFunction"


# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Bf12Config:
    """Launch parameters. ``block_j`` counts 16-weight words, so one iteration covers
    ``16 * block_j`` weights of K per row (the dot's K tile). ``kind="dot"`` needs ``block_m,
    block_n >= 16``; ``kind="fma"`` takes ``block_m`` in (1, 2, 4). ``prefetch`` (fma) loads
    the next tile into registers while the current one is decoded."""

    kind: str = "fma"
    block_m: int = 1
    block_n: int = 16
    block_j: int = 32
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    swap_ab: bool = False
    use_asm: bool = True
    prefetch: bool = True
    esc_block: int = 16

    def __post_init__(self):
        check_config(self, ("block_m", "block_n", "block_j", "esc_block", "num_warps"))

    def replace(self, **kw) -> "Bf12Config":
        return dataclasses.replace(self, **kw)


def _heuristic(mb: int, n: int, k: int) -> Bf12Config:
    # shapes not in the table: the configs that were near the best on every Qwen3-8B shape
    if mb == 1:
        return Bf12Config("fma", block_m=1, block_n=16, block_j=64, num_stages=1, prefetch=False)
    if mb <= 4:
        return Bf12Config("fma", block_m=mb, block_n=16, block_j=32, num_stages=1)
    bm = max(16, mb)
    return Bf12Config("dot", block_m=bm, block_n=16 if bm == 16 else 32, block_j=8, num_stages=3)


# (m_bucket, N, K) -> the fastest config of the sweep in examples/bench_bf12.py on an H200
# (2026-12-02, triton 3.6; docs/benchmarks/bf12-kernels.md), with its speed relative to cuBLAS
# bf16 in that run. Where it is below 1x, bf16 weights are faster at that M: the choice of
# format per layer and batch belongs to the cost model / search. set_config() overrides.
DEFAULT_CONFIGS: dict[tuple[int, int, int], Bf12Config] = {
    (1, 6144, 4096): Bf12Config('fma', block_m=1, block_n=16, block_j=64, num_stages=1, prefetch=False),  # 1.04x cuBLAS
    (2, 6144, 4096): Bf12Config('fma', block_m=2, block_n=16, block_j=32, num_stages=1),  # 0.74x cuBLAS
    (4, 6144, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.44x cuBLAS
    (8, 6144, 4096): Bf12Config('dot', block_m=16, block_n=16, block_j=8, num_stages=3),  # 0.47x cuBLAS
    (16, 6144, 4096): Bf12Config('dot', block_m=16, block_n=16, block_j=8, num_stages=3),  # 0.47x cuBLAS
    (32, 6144, 4096): Bf12Config('dot', block_m=32, block_n=32, block_j=8, num_stages=3),  # 0.34x cuBLAS
    (64, 6144, 4096): Bf12Config('dot', block_m=64, block_n=32, block_j=8, num_stages=3),  # 0.27x cuBLAS
    (1, 4096, 4096): Bf12Config('fma', block_m=1, block_n=32, block_j=32, split_k=2, num_stages=1),  # 1.05x cuBLAS
    (2, 4096, 4096): Bf12Config('fma', block_m=2, block_n=16, block_j=64, num_stages=1),  # 0.79x cuBLAS
    (4, 4096, 4096): Bf12Config('fma', block_m=4, block_n=16, block_j=32, num_stages=1),  # 0.53x cuBLAS
    (8, 4096, 4096): Bf12Config('dot', block_m=16, block_n=16, block_j=8, num_stages=3),  # 0.50x cuBLAS
    (16, 4096, 4096): Bf12Config('dot', block_m=16, block_n=16, block_j=8, num_stages=3),  # 0.50x cuBLAS
    (32, 4096, 4096): Bf12Config('dot', block_m=32, block_n=32, block_j=8, num_stages=3),  # 0.38x cuBLAS
    (64, 4096, 4096): Bf12Config('dot', block_m=64, block_n=32, block_j=8, num_stages=3),  # 0.27x cuBLAS
    (1, 24576, 4096): Bf12Config('fma', block_m=1, block_n=32, block_j=16, num_stages=1),  # 1.18x cuBLAS
    (2, 24576, 4096): Bf12Config('fma', block_m=2, block_n=16, block_j=32, num_stages=1),  # 0.73x cuBLAS
    (4, 24576, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.60x cuBLAS
    (8, 24576, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.65x cuBLAS
    (16, 24576, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.60x cuBLAS
    (32, 24576, 4096): Bf12Config('dot', block_m=32, block_n=64, block_j=4, num_stages=3, swap_ab=True),  # 0.47x cuBLAS
    (64, 24576, 4096): Bf12Config('dot', block_m=64, block_n=32, block_j=8, num_stages=3),  # 0.34x cuBLAS
    (1, 4096, 12288): Bf12Config('fma', block_m=1, block_n=32, block_j=32, split_k=2, num_stages=1),  # 1.12x cuBLAS
    (2, 4096, 12288): Bf12Config('fma', block_m=2, block_n=16, block_j=64, num_stages=1),  # 0.80x cuBLAS
    (4, 4096, 12288): Bf12Config('fma', block_m=4, block_n=16, block_j=32, num_stages=1),  # 0.48x cuBLAS
    (8, 4096, 12288): Bf12Config('dot', block_m=16, block_n=16, block_j=8, num_stages=3),  # 0.46x cuBLAS
    (16, 4096, 12288): Bf12Config('dot', block_m=16, block_n=16, block_j=8, num_stages=3),  # 0.43x cuBLAS
    (32, 4096, 12288): Bf12Config('dot', block_m=32, block_n=32, block_j=8, num_stages=3),  # 0.37x cuBLAS
    (64, 4096, 12288): Bf12Config('dot', block_m=64, block_n=32, block_j=8, num_stages=3),  # 0.33x cuBLAS
    (1, 151936, 4096): Bf12Config('fma', block_m=1, block_n=16, block_j=32, num_stages=1),  # 1.22x cuBLAS
    (2, 151936, 4096): Bf12Config('fma', block_m=2, block_n=16, block_j=32, num_stages=1),  # 0.78x cuBLAS
    (4, 151936, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.67x cuBLAS
    (8, 151936, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.67x cuBLAS
    (16, 151936, 4096): Bf12Config('dot', block_m=16, block_n=64, block_j=8, num_stages=3),  # 0.68x cuBLAS
    (32, 151936, 4096): Bf12Config('dot', block_m=32, block_n=64, block_j=4, num_stages=3, swap_ab=True),  # 0.55x cuBLAS
    (64, 151936, 4096): Bf12Config('dot', block_m=64, block_n=64, block_j=4, num_stages=3, swap_ab=True),  # 0.38x cuBLAS
}
# The batch-invariant mode's one config for every M (specc.codegen.kernels.batch_invariant): the
# table's 16-row tensor-core tile, one split (split-K sums its partials with float atomics, in
# no fixed order)
BATCH_INVARIANT_CONFIG = Bf12Config("dot", block_m=16, block_n=16, block_j=8, split_k=1, num_stages=3)
_TABLE = ConfigTable(Bf12Config, DEFAULT_CONFIGS, _heuristic, m_bucket, invariant=BATCH_INVARIANT_CONFIG)
get_config = _TABLE.get  # (m, n, k) -> config: the mode's one config, else override, else DEFAULT_CONFIGS, else heuristic
set_config = _TABLE.set  # (m, n, k, config | mapping | None): a deployment's override
clear_configs = _TABLE.clear
_as_config = _TABLE.coerce


# ------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------
def _kernel_meta(packed: Packed12) -> dict:
    """The escape metadata (shared with layout 2) plus this kernel's int64 views of the planes."""
    return {**escape_meta(packed), "sm": packed.sm.view(torch.int64), "ex": packed.ex.view(torch.int64)}


_workspace = split_k_workspace


_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def launchable(device: torch.device) -> bool:
    """Whether a launch on ``device`` can run: CUDA, or anything under the interpreter."""
    return device.type == "cuda" or INTERPRETED


def linear_bf12(x: torch.Tensor, packed: Packed12, bias: torch.Tensor | None = None,
                config: Bf12Config | Mapping | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` with W given as a Packed12 of an ``[N, K]`` bf16 weight.

    x: ``[..., K]`` bf16 (GPU), or fp32/fp16 (any device; on the CPU the Triton interpreter
    runs it). Returns ``[..., N]`` in x's dtype; accumulation is fp32. ``config`` overrides
    the table lookup (:func:`get_config`) for this call; ``out`` (contiguous ``[..., N]``,
    x's dtype) receives the result (static buffers for CUDA graphs).
    """
    if not isinstance(packed, Packed12):
        raise TypeError(f"linear_bf12 expects a Packed12 weight, got {type(packed).__name__}")
    if len(packed.shape) != 2:
        raise ValueError(f"linear_bf12 needs a 2-D [N, K] weight, got shape {packed.shape}")
    n, k = packed.shape
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise TypeError("linear_bf12 expects x as a tensor of shape [..., K]")
    if x.shape[-1] != k:
        raise ValueError(f"linear_bf12: x has {x.shape[-1]} features, the weight [N={n}, K={k}] "
                         f"expects {k}")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"linear_bf12: x dtype {x.dtype} not supported (use one of {_X_DTYPES})")
    if x.device != packed.device:
        raise ValueError(f"linear_bf12: x is on {x.device}, the weight on {packed.device}")
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise ValueError(f"linear_bf12: bias must have shape ({n},), got {tuple(bias.shape)}")
        if bias.device != x.device:
            raise ValueError(f"linear_bf12: bias is on {bias.device}, x on {x.device}")
        bias = bias.contiguous()
    interpret = INTERPRETED
    # (an explicit tensor-core config needs no Triton: where that kernel cannot run it says why below)
    from specc.codegen.kernels.linear_bf12_mma import Bf12MmaConfig

    if not launchable(x.device) and not isinstance(config, Bf12MmaConfig):
        raise RuntimeError("linear_bf12 on a CPU tensor needs the Triton interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if out is None:
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        if (tuple(out.shape) != (*lead, n) or out.dtype != x.dtype or out.device != x.device
                or not out.is_contiguous()):
            raise ValueError(f"linear_bf12: out must be a contiguous {x.dtype} tensor of shape "
                             f"{(*lead, n)} on {x.device}, got {out.dtype} {tuple(out.shape)}")
        y = out.view(m, n)
    if m == 0:
        return y.reshape(*lead, n)
    if packed.version != 1:  # layout 2 (inputs checked above): the tensor-core kernel where it runs, else Triton
        from specc.codegen.kernels.linear_bf12_mma import linear_bf12_mma, unsupported_reason
        from specc.codegen.kernels.linear_bf12_v2 import linear_bf12_v2

        if config is None or isinstance(config, Bf12MmaConfig):
            got = linear_bf12_mma(x2, packed, bias, config, out=y)
            if got is not None:
                return got.reshape(*lead, n)
            if config is not None:
                why = unsupported_reason(x2, packed, bias) or "its extension could not be built"
                raise ValueError(f"linear_bf12: a Bf12MmaConfig was given but the tensor-core kernel cannot run: {why}")

        return linear_bf12_v2(x2, packed, bias, config, out=y).reshape(*lead, n)
    if config is not None and not isinstance(config, (Bf12Config, Mapping)):
        raise TypeError(f"a version-1 bf12 weight takes a Bf12Config, got {type(config).__name__}")
    cfg = _as_config(config) if config is not None else get_config(m, n, k)
    if interpret and x.dtype == torch.bfloat16 and cfg.kind == "dot":
        # (the fma path is integer decode + fp32 FMAs, which the interpreter can run)
        raise TypeError("linear_bf12 under the Triton interpreter cannot do bf16 dots; pass fp32 "
                        "(or fp16) activations or use a kind='fma' config (the batch-invariant mode "
                        "picks the dot kernel at every M)")
    meta = _kernel_meta(packed)
    k16 = packed.k16
    bj = cfg.block_j
    j_per = triton.cdiv(triton.cdiv(k16, cfg.split_k), bj) * bj
    split = triton.cdiv(k16, j_per)
    grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m))
    if split > 1:
        ws, cnt = _workspace(x.device, m * n, grid[0] * grid[2])
    else:
        ws, cnt = y, meta["rowptr"]  # unused
    kern = _kernel
    dummy = meta["rowptr"]
    # the dot path measured slower with PDL (docs/benchmarks/h200-run12.md): plain launches
    pdl = pdl_mode(x2, "bf12") if cfg.kind == "fma" else 0
    # fma path, bf16 x: load x as int32 pairs (one load + shift/and per pair of weights)
    x_pairs = (cfg.kind == "fma" and x2.dtype == torch.bfloat16 and k % 2 == 0
               and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0)
    xk = x2.view(torch.int32) if x_pairs else x2
    stride_xm = x2.stride(0) // 2 if x_pairs else x2.stride(0)
    kern[grid](
        xk, meta["sm"], meta["ex"], meta["base"], y, bias if bias is not None else dummy,
        meta["rowptr"], meta["erow"], meta["ecol"], meta["etrue"], meta["efake"],
        ws, cnt,
        m, n, k, k16, j_per,
        stride_xm, y.stride(0), meta["stride_base"],
        USE_DOT=cfg.kind == "dot", SWAP_AB=cfg.swap_ab,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_J=bj,
        SPLIT_K=split, HAS_BIAS=bias is not None, HAS_ESC=meta["num_esc"] > 0,
        ESC_BLOCK=cfg.esc_block, DOT_BF16=x.dtype == torch.bfloat16,
        USE_ASM=cfg.use_asm and not interpret, X_PAIRS=x_pairs, PREFETCH=cfg.prefetch,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, PDL=pdl, **pdl_launch(pdl),
    )
    return y.reshape(*lead, n)


def linear_bf12_reference(x: torch.Tensor, packed: Packed12,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, packed.unpack(), bias)`` in x's dtype (the weights are exact in fp32)."""
    w = packed.unpack().to(x.dtype)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
