"""Fused decode + GEMV/GEMM on bf12 layout-2 (and layout-3) weights: ``y = x @ W^T (+ bias)``.

W is a :class:`specc.formats.bf12.Packed12` with ``version == 2`` (the format's module docstring
describes the layout; ``version == 3``, the same bytes in 16-row x 64-weight tiles, is read
through the same tiles by their tiled addresses): a natural-order sign|mantissa byte plane
``sm [N, Kp]`` and a code plane ``ex [N, Kp / 2]`` whose 32-weight groups hold 16 code bytes,
the low nibble of byte ``i`` for weight ``32 g + i`` and the high nibble for weight
``32 g + 16 + i``. The layout exists for this kernel's loads and decode:

* **Wide loads, one register layout.** An iteration covers ``BLOCK_K`` weights of K per row
  (``BLOCK_K / 32`` groups) as three ``[BLOCK_N, BLOCK_K / 2]`` uint8 tiles: the low halves of
  the groups' sm bytes, the high halves, and the code bytes. Each is made of 16-byte runs
  contiguous in memory (offset hints tell Triton so), so a thread loads 16 sm bytes + 16 sm
  bytes + 16 code bytes with three 128-bit loads for 32 weights, and all three tiles share one
  layout: the decode is element-wise, with no shuffles, joins or layout conversions.
* **Integer decode.** A weight is ``(sm & 0x80) << 8 | (0x70 + code) << 7 | (sm & 0x7F)`` as
  bf16 bits: the constant exponent ``0x70 + code`` decodes ``W * 2**(112 - base)`` (a power of
  two per row, multiplied back once per output, exact), so no per-row value enters the loop.
  On the GPU (``use_asm``) four weights decode with ``tl.inline_asm_elementwise(pack=4)``: per
  pair of weights two ``prmt`` byte permutes (sm bytes and code bytes into bf16x2 position),
  one shift (7 for low nibbles, 3 for high), two ``lop3``. The pure-Triton expression of the
  same bits is the fallback and what the Triton interpreter runs.
* ``kind="fma"`` (M = 1 .. 4): decoded weights widen to fp32 (exact) and FMA into an fp32
  accumulator in the tile's layout (``[BLOCK_N, BLOCK_K / 2]``, or ``[BLOCK_M, BLOCK_N,
  BLOCK_K / 2]`` for M > 1), reduced once after the loop. ``split_k`` splits K over programs
  so that small-N layers still put every SM to work.
* ``kind="dot"`` (M = 2 .. 64, tensor cores): the decoded low and high half tiles are each one
  ``tl.dot`` operand (``[BLOCK_N, BLOCK_K / 2]`` bf16) against the x columns of the same K
  positions (loaded with the same offsets): the decode runs once per weight tile and serves all
  ``BLOCK_M`` rows; Triton stages the decoded tile through shared memory into the MMA operand
  layout. ``swap_ab`` computes ``W @ x^T`` (the small M as the MMA's N).

Escapes (weights outside the row's 16-exponent window; ~1e-4 of them) are never looked at in
the loop: the planes hold the finite stand-in ``2**(base - 127)`` there. After the loop each
program walks the escape table's entries of its rows (CSR over the sorted table) and adds
``x * w_true - x * w_standin`` to its fp32 outputs before the single rounding: both products
are exact in fp32 for bf16 x, so the result is the bf16 matmul with fp32 accumulation on the
exact weights (up to summation order, as with cuBLAS), and inf/NaN weights propagate. Split-K
partials go to a per-device fp32 workspace; the last program of a tile (a ticket counter) adds
them up, stores and cleans the workspace (no memset, no epilogue launch), as in
:mod:`specc.codegen.kernels.linear_bf12` (the two share :mod:`specc.codegen.kernels.bf12_launch` and the epilogue in :mod:`specc.codegen.kernels.bf12_epilogue`).

Batch-invariant mode (:mod:`specc.codegen.kernels.batch_invariant`): :func:`get_config` returns
:data:`BATCH_INVARIANT_CONFIG` (the dot kernel, one split) at every M.

CPU: the Triton interpreter runs the integer decode and fp32 math (it has no bf16 arithmetic):
use fp32/fp16 activations there; the outputs equal ``F.linear`` on the unpacked weights in fp32.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import ConfigTable
from specc.codegen.kernels.bf12_epilogue import add_escapes, scale_by_base, store_tile
from specc.codegen.kernels.bf12_launch import M_BUCKETS, check_config, escape_meta, m_bucket, split_k_workspace
from specc.formats.bf12 import GROUP, HALF, WIDE_LAYOUTS, Packed12

__all__ = ["Bf12v2Config", "linear_bf12_v2", "get_config", "set_config", "clear_configs",
           "DEFAULT_CONFIGS", "M_BUCKETS", "DECODE_ASM", "BATCH_INVARIANT_CONFIG"]


# Four weights per call: $2 = 4 sm bytes, $3 = 4 code bytes (element i in byte i), outputs
# $0 = bf16x2 of weights (0, 1), $1 = (2, 3). prmt 0x1100 / 0x3322 put byte 0/2 into both low
# bytes and byte 1/3 into both high bytes of a word; the code nibble then sits at bits 7..10 and
# 23..26 after a shift by SHIFT (7: low nibble, 3: high nibble), the exponent fields of a bf16x2.
_DECODE4 = ("{{ .reg .b32 t, u; "
            "prmt.b32 t, $2, $2, 0x1100; prmt.b32 u, $3, $3, 0x1100; shl.b32 u, u, {s}; "
            "lop3.b32 u, u, 0x07800780, 0x38003800, 0xEA; lop3.b32 $0, t, 0x807F807F, u, 0xEA; "
            "prmt.b32 t, $2, $2, 0x3322; prmt.b32 u, $3, $3, 0x3322; shl.b32 u, u, {s}; "
            "lop3.b32 u, u, 0x07800780, 0x38003800, 0xEA; lop3.b32 $1, t, 0x807F807F, u, 0xEA; }}")
DECODE_ASM = {False: _DECODE4.format(s=7), True: _DECODE4.format(s=3)}  # high nibble? -> PTX
_ASM_LO = tl.constexpr(DECODE_ASM[False])
_ASM_HI = tl.constexpr(DECODE_ASM[True])


# ------------------------------------------------------------------------------------------
# the kernel
# ------------------------------------------------------------------------------------------
@triton.jit
def _decode(s, e, HI: tl.constexpr, USE_ASM: tl.constexpr, OUT_BF16: tl.constexpr):
    """uint8 sm bytes ``s`` and code bytes ``e`` (same shape) -> weights with exponent
    0x70 + code (nibble: high if HI), as bf16 (OUT_BF16) or exact fp32."""
    if USE_ASM:
        if HI:
            w = tl.inline_asm_elementwise(_ASM_HI, "=r,=r,r,r", [s, e], dtype=tl.bfloat16,
                                          is_pure=True, pack=4)
        else:
            w = tl.inline_asm_elementwise(_ASM_LO, "=r,=r,r,r", [s, e], dtype=tl.bfloat16,
                                          is_pure=True, pack=4)
        if not OUT_BF16:
            w = w.to(tl.float32)
    else:
        si = s.to(tl.int32)
        if HI:
            c = (e >> 4).to(tl.int32)
        else:
            c = (e & 15).to(tl.int32)
        bits = ((si & 0x80) << 8) | ((c + 0x70) << 7) | (si & 0x7F)
        if OUT_BF16:
            w = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            w = (bits << 16).to(tl.float32, bitcast=True)
    return w


@triton.jit
def _bf12v2_linear_kernel(
    x_ptr, sm_ptr, ex_ptr, base_ptr, y_ptr, bias_ptr,
    rowptr_ptr, erow_ptr, ecol_ptr, etrue_ptr, efake_ptr,
    ws_ptr, cnt_ptr,
    M, N, K, KP, KP2, G_PER_SPLIT,
    stride_xm, stride_ym, stride_base,
    USE_DOT: tl.constexpr, SWAP_AB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ESC: tl.constexpr,
    ESC_BLOCK: tl.constexpr, DOT_BF16: tl.constexpr, USE_ASM: tl.constexpr,
    DEC_BF16: tl.constexpr, TILED: tl.constexpr,
):
    KH: tl.constexpr = BLOCK_K // 2
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    kh_start = pid_k * G_PER_SPLIT * 16  # in code bytes (half a weight each): divisible by 16
    k_start = 2 * kh_start
    k_stop = tl.minimum(k_start + G_PER_SPLIT * 32, KP)  # a multiple of 32 (a group boundary)
    rows64 = offs_n.to(tl.int64)
    if TILED:  # layout 3: 16-row blocks stored as 16 x 64-weight tiles (specc.formats.bf12.plane_strides)
        sm_rows = sm_ptr + ((rows64 // 16) * 16 * KP + (rows64 % 16) * 64)[:, None]
        ex_rows = ex_ptr + ((rows64 // 16) * 16 * KP2 + (rows64 % 16) * 32)[:, None]
    else:
        sm_rows = sm_ptr + rows64[:, None] * KP
        ex_rows = ex_ptr + rows64[:, None] * KP2  # KP2 = KP // 2, passed so Triton sees it % 16 == 0
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    # tile position i (0 .. KH) -> K offset of the low-half weight: group i // 16, lane i % 16
    i = tl.arange(0, KH)
    off_lo = tl.max_contiguous(tl.multiple_of((i // 16) * 32 + (i % 16), 16), 16)
    off_ex = tl.max_contiguous(tl.multiple_of(i, 16), 16)

    if USE_DOT:
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, KH), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, KH), dtype=tl.float32)

    for kh0 in range(kh_start, k_stop // 2, KH):
        k0 = 2 * kh0
        k_lo = k0 + off_lo  # [KH]
        k_hi = k_lo + 16
        wmask = mask_n[:, None] & (k_lo < k_stop)[None, :]  # constant over each 16-byte run
        if TILED:  # a row's 64-weight super-group S sits at S * 1024 (sm) / S * 512 (ex) in its block
            c_lo = tl.max_contiguous(tl.multiple_of((k_lo // 64) * 1024 + k_lo % 64, 16), 16)
            c_hi = tl.max_contiguous(tl.multiple_of((k_hi // 64) * 1024 + k_hi % 64, 16), 16)
            kh = kh0 + off_ex
            c_ex = tl.max_contiguous(tl.multiple_of((kh // 32) * 512 + kh % 32, 16), 16)
        else:
            c_lo, c_hi, c_ex = k_lo, k_hi, kh0 + off_ex
        s_lo = tl.load(sm_rows + c_lo[None, :], mask=wmask, other=0)
        s_hi = tl.load(sm_rows + c_hi[None, :], mask=wmask, other=0)
        e = tl.load(ex_rows + c_ex[None, :], mask=wmask, other=0)
        w_lo = _decode(s_lo, e, False, USE_ASM, DEC_BF16)
        w_hi = _decode(s_hi, e, True, USE_ASM, DEC_BF16)
        if USE_DOT:
            xm = mask_m[:, None]
            x_lo = tl.load(x_rows + k_lo[None, :], mask=xm & (k_lo < K)[None, :], other=0.0)
            x_hi = tl.load(x_rows + k_hi[None, :], mask=xm & (k_hi < K)[None, :], other=0.0)
            if DOT_BF16:
                x_lo = x_lo.to(tl.bfloat16)
                x_hi = x_hi.to(tl.bfloat16)
                if SWAP_AB:
                    acc = tl.dot(w_lo, tl.trans(x_lo), acc)
                    acc = tl.dot(w_hi, tl.trans(x_hi), acc)
                else:
                    acc = tl.dot(x_lo, tl.trans(w_lo), acc)
                    acc = tl.dot(x_hi, tl.trans(w_hi), acc)
            else:
                x_lo = x_lo.to(tl.float32)
                x_hi = x_hi.to(tl.float32)
                if SWAP_AB:
                    acc = tl.dot(w_lo, tl.trans(x_lo), acc, input_precision="ieee")
                    acc = tl.dot(w_hi, tl.trans(x_hi), acc, input_precision="ieee")
                else:
                    acc = tl.dot(x_lo, tl.trans(w_lo), acc, input_precision="ieee")
                    acc = tl.dot(x_hi, tl.trans(w_hi), acc, input_precision="ieee")
        elif BLOCK_M == 1:
            # x as [KH] vectors broadcast along the rows. (Loaded as [1, KH], the x load's
            # layout would win and the decoded weight tiles would be converted to it.)
            x0 = x_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_xm
            x_lo = tl.load(x0 + k_lo, mask=k_lo < K, other=0.0).to(tl.float32)
            x_hi = tl.load(x0 + k_hi, mask=k_hi < K, other=0.0).to(tl.float32)
            acc += w_lo * x_lo[None, :]
            acc += w_hi * x_hi[None, :]
        else:
            xm = mask_m[:, None]
            x_lo = tl.load(x_rows + k_lo[None, :], mask=xm & (k_lo < K)[None, :], other=0.0).to(tl.float32)
            x_hi = tl.load(x_rows + k_hi[None, :], mask=xm & (k_hi < K)[None, :], other=0.0).to(tl.float32)
            acc += w_lo[None, :, :] * x_lo[:, None, :]
            acc += w_hi[None, :, :] * x_hi[:, None, :]

    if USE_DOT:
        if SWAP_AB:
            out = tl.trans(acc)
        else:
            out = acc
    elif BLOCK_M == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.sum(acc, axis=2)
    # undo the constant-exponent decode: * 2**(base - 112), exact
    out = scale_by_base(out, base_ptr, offs_n, mask_n, stride_base)

    if HAS_ESC:  # exact sparse fix-up of the escaped weights of this program's rows and K range
        n_lo = pid_n * BLOCK_N
        out = add_escapes(out, x_rows, rowptr_ptr, erow_ptr, ecol_ptr, etrue_ptr, efake_ptr, offs_n, mask_m, n_lo,
                          tl.minimum(n_lo + BLOCK_N, N), k_start, k_stop, SPLIT_K, False, ESC_BLOCK)

    store_tile(out, y_ptr, bias_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, mask_m, mask_n, stride_ym, N, pid_m, pid_n,
               HAS_BIAS, SPLIT_K)


_kernel = _bf12v2_linear_kernel
INTERPRETED = type(_kernel).__name__ == "InterpretedFunction"


# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Bf12v2Config:
    """Launch parameters. ``block_k`` counts weights of K per iteration (a power of two >= 32:
    ``block_k / 32`` code groups, two ``[block_n, block_k / 2]`` decoded half tiles).
    ``kind="fma"`` takes ``block_m`` in (1, 2, 4); ``kind="dot"`` needs ``block_m, block_n >=
    16``. ``use_asm`` decodes with the PRMT inline asm on the GPU (ignored by the interpreter)."""

    kind: str = "fma"
    block_m: int = 1
    block_n: int = 16
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    swap_ab: bool = False
    use_asm: bool = True
    esc_block: int = 16

    def __post_init__(self):
        check_config(self, ("block_m", "block_n", "block_k", "esc_block", "num_warps"))
        if self.block_k < GROUP:
            raise ValueError(f"Bf12v2Config.block_k must be >= {GROUP} (one code group), got {self.block_k}")

    def replace(self, **kw) -> "Bf12v2Config":
        return dataclasses.replace(self, **kw)


def _heuristic(mb: int, n: int, k: int) -> Bf12v2Config:
    # Not measured yet (examples/bench_bf12.py --layouts v2 sweeps and prints a table): one
    # 16-byte load per plane per thread at M = 1 (16 rows x 128 bytes per half tile, 4 warps),
    # split-K where N alone gives fewer than ~2 programs per SM of an H100/H200.
    if mb <= 4:
        split = 2 if n <= 4096 and k >= 4096 else 1
        return Bf12v2Config("fma", block_m=mb, block_n=16, block_k=256, split_k=split, num_stages=1)
    bm = max(16, mb)
    return Bf12v2Config("dot", block_m=bm, block_n=64 if bm <= 32 else 32, block_k=64, num_stages=3)


# (m_bucket, N, K) -> config, filled from an H200 sweep of examples/bench_bf12.py (none yet).
DEFAULT_CONFIGS: dict[tuple[int, int, int], Bf12v2Config] = {}
# The batch-invariant mode's one config for every M (specc.codegen.kernels.batch_invariant): the
# heuristic's 16-row tensor-core tile, one split (split-K sums with float atomics, in no fixed order)
BATCH_INVARIANT_CONFIG = Bf12v2Config("dot", block_m=16, block_n=64, block_k=64, split_k=1, num_stages=3)
_TABLE = ConfigTable(Bf12v2Config, DEFAULT_CONFIGS, _heuristic, m_bucket, invariant=BATCH_INVARIANT_CONFIG)
get_config = _TABLE.get  # (m, n, k) -> config: the mode's one config, else override, else DEFAULT_CONFIGS, else heuristic
set_config = _TABLE.set  # (m, n, k, config | mapping | None): a deployment's override
clear_configs = _TABLE.clear
_as_config = _TABLE.coerce


# ------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------
def launchable(device: torch.device) -> bool:
    """Whether a launch on ``device`` can run: CUDA, or anything under the interpreter."""
    return device.type == "cuda" or INTERPRETED


def linear_bf12_v2(x: torch.Tensor, packed: Packed12, bias: torch.Tensor | None = None,
                   config: Bf12v2Config | Mapping | None = None,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` with W a layout-2 Packed12 of an ``[N, K]`` bf16 weight (checked
    inputs: :func:`specc.codegen.kernels.linear_bf12.linear_bf12` validates and dispatches
    here). Returns ``[..., N]`` in x's dtype, fp32 accumulation."""
    if packed.version not in WIDE_LAYOUTS:
        raise ValueError(f"linear_bf12_v2 needs a version-2 or -3 bf12 weight, got version {packed.version}")
    n, k = packed.shape
    if not launchable(x.device):
        raise RuntimeError("linear_bf12 on a CPU tensor needs the Triton interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported")
    if config is not None and not isinstance(config, (Bf12v2Config, Mapping)):
        raise TypeError(f"a version-2 bf12 weight takes a Bf12v2Config, got {type(config).__name__}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out.view(m, n)
    if m == 0:
        return y.reshape(*lead, n)
    cfg = _as_config(config) if config is not None else get_config(m, n, k)
    if INTERPRETED and x.dtype == torch.bfloat16:
        raise TypeError("linear_bf12 under the Triton interpreter cannot do bf16 arithmetic; pass fp32 "
                        "(or fp16) activations")
    meta = escape_meta(packed)
    kp = packed.padded_cols
    groups = kp // GROUP
    gk = cfg.block_k // GROUP  # groups per iteration
    g_per = triton.cdiv(triton.cdiv(groups, cfg.split_k), gk) * gk
    split = triton.cdiv(groups, g_per)
    grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m))
    if split > 1:
        ws, cnt = split_k_workspace(x.device, m * n, grid[0] * grid[2])
    else:
        ws, cnt = y, meta["rowptr"]  # unused
    dummy = meta["rowptr"]
    _kernel[grid](
        x2, packed.sm, packed.ex, meta["base"], y, bias if bias is not None else dummy,
        meta["rowptr"], meta["erow"], meta["ecol"], meta["etrue"], meta["efake"],
        ws, cnt,
        m, n, k, kp, kp // 2, g_per,
        x2.stride(0), y.stride(0), meta["stride_base"],
        USE_DOT=cfg.kind == "dot", SWAP_AB=cfg.swap_ab,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SPLIT_K=split, HAS_BIAS=bias is not None, HAS_ESC=meta["num_esc"] > 0,
        ESC_BLOCK=cfg.esc_block, DOT_BF16=x.dtype == torch.bfloat16,
        USE_ASM=cfg.use_asm and not INTERPRETED,
        DEC_BF16=cfg.kind == "dot" and x.dtype == torch.bfloat16, TILED=packed.version == 3,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y.reshape(*lead, n)


assert HALF == 16 and GROUP == 32  # the kernel's offsets (i // 16, i % 16) assume these
