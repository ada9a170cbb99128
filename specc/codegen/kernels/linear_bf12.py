"""Fused decode + GEMV/GEMM on lossless 12-bit weights: ``y = x @ W^T (+ bias)``.

W is a :class:`specc.formats.bf12.Packed12` of an ``[N, K]`` bf16 weight (``nn.Linear`` layout);
its module docstring describes the layout this kernel was designed around. One Triton kernel,
two inner loops chosen by the config:

* ``kind="fma"`` (M = 1 .. ~4: decode-bound GEMV). Each program owns ``BLOCK_N`` rows and a
  range of K-words (split-K); per iteration it loads three int64 ``[BLOCK_N, BLOCK_J]`` tiles
  (two sign|mantissa planes, one code plane; 24 bytes per word of 16 weights, all contiguous
  along K), decodes each phase pair into a bf16x2 word with ~4 integer ops (prmt + shift +
  2 lop3; ``use_asm`` emits exactly that, else the same in Triton ops), widens to fp32 (one
  shift / one and) and FMAs into an fp32 ``[BLOCK_M, BLOCK_N, BLOCK_J]`` accumulator, reduced
  once at the end. The 16 phases of a word are 16 contiguous slices of x, so x loads are plain
  vector loads too.
* ``kind="dot"`` (M = 2 .. 64: tensor cores). The same decode yields 16 bf16 ``[BLOCK_N,
  BLOCK_J]`` phase tiles per iteration; each goes through ``tl.dot`` with the matching x slice
  (16 dots with K = BLOCK_J, fp32 accumulation). ``swap_ab`` computes ``W @ x^T`` instead, which
  puts the decoded tile in the A (register) slot and the tiny M in the MMA's N.

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
import math
from typing import Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

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
    "INTERPRETED",
]

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


# ------------------------------------------------------------------------------------------
# the kernel
# ------------------------------------------------------------------------------------------
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
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]

    if USE_DOT:
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        # one [BLOCK_N, BLOCK_J] accumulator per row of x (BLOCK_M <= 4), all in the layout of
        # the weight tiles: x slices are loaded as [BLOCK_N, BLOCK_J] broadcasts with the same
        # per-thread vector width (max_contiguous 2 = the two int64 words a thread loads), so
        # Triton needs no layout conversion (shared-memory round trip) inside the loop.
        xb = x_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_xm
        zrow = tl.zeros((BLOCK_N, 1), dtype=tl.int32)
        mrow = pid_m * BLOCK_M + tl.zeros((1, 1), dtype=tl.int32)
        acc0 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
        if BLOCK_M > 1:
            acc1 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
        if BLOCK_M > 2:
            acc2 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
            acc3 = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)

    for j0 in range(j_start, j_end, BLOCK_J):
        offs_j = j0 + tl.arange(0, BLOCK_J)
        mask_j = offs_j < j_end
        wmask = mask_n[:, None] & mask_j[None, :]
        s_a = tl.load(sm_rows + offs_j[None, :], mask=wmask, other=0)
        s_b = tl.load(sm_rows + K16 + offs_j[None, :], mask=wmask, other=0)
        cw = tl.load(ex_rows + offs_j[None, :], mask=wmask, other=0)
        for h in tl.static_range(2):
            if h == 0:
                s64 = s_a
                c32 = cw.to(tl.uint32)
            else:
                s64 = s_b
                c32 = (cw >> 32).to(tl.uint32)
            for p in tl.static_range(4):
                if p < 2:
                    sw = s64.to(tl.uint32)
                else:
                    sw = (s64 >> 32).to(tl.uint32)
                # codes of phases (8h + 2p, 8h + 2p + 1) -> bits 7..10 and 23..26
                if p == 0:
                    ec = c32 << 7
                elif p == 1:
                    ec = c32 << 3
                elif p == 2:
                    ec = c32 >> 1
                else:
                    ec = c32 >> 5
                if USE_ASM:
                    if p % 2 == 0:
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
                    if p % 2 == 0:
                        smp = (sw & 0x7F) | ((sw << 8) & 0x7F8000) | ((sw << 16) & 0x80000000)
                    else:
                        smp = ((sw >> 16) & 0x7F) | ((sw >> 8) & 0x7F8000) | (sw & 0x80000000)
                    wp = smp | ((ec & 0x07800780) | 0x38003800)
                # wp: bf16x2, low half = phase q_e, high half = phase q_e + 1
                q_e = 8 * h + 2 * p
                k_e = q_e * K16 + offs_j
                k_o = k_e + K16
                if USE_DOT and DOT_BF16:
                    w_e = wp.to(tl.uint16).to(tl.bfloat16, bitcast=True)
                    w_o = (wp >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
                else:
                    w_e = (wp << 16).to(tl.float32, bitcast=True)
                    w_o = (wp & 0xFFFF0000).to(tl.float32, bitcast=True)
                if USE_DOT:
                    xm_e = mask_m[:, None] & (mask_j & (k_e < K))[None, :]
                    xm_o = mask_m[:, None] & (mask_j & (k_o < K))[None, :]
                    x_e = tl.load(x_rows + k_e[None, :], mask=xm_e, other=0.0)
                    x_o = tl.load(x_rows + k_o[None, :], mask=xm_o, other=0.0)
                    if DOT_BF16:
                        x_e = x_e.to(tl.bfloat16)
                        x_o = x_o.to(tl.bfloat16)
                    else:
                        x_e = x_e.to(tl.float32)
                        x_o = x_o.to(tl.float32)
                    if DOT_BF16:
                        if SWAP_AB:
                            acc = tl.dot(w_e, tl.trans(x_e), acc)
                            acc = tl.dot(w_o, tl.trans(x_o), acc)
                        else:
                            acc = tl.dot(x_e, tl.trans(w_e), acc)
                            acc = tl.dot(x_o, tl.trans(w_o), acc)
                    else:
                        if SWAP_AB:
                            acc = tl.dot(w_e, tl.trans(x_e), acc, input_precision="ieee")
                            acc = tl.dot(w_o, tl.trans(x_o), acc, input_precision="ieee")
                        else:
                            acc = tl.dot(x_e, tl.trans(w_e), acc, input_precision="ieee")
                            acc = tl.dot(x_o, tl.trans(w_o), acc, input_precision="ieee")
                else:
                    xo_e = k_e[None, :]
                    xo_o = k_o[None, :]
                    xm_e = mask_j[None, :] & (xo_e < K)
                    xm_o = mask_j[None, :] & (xo_o < K)
                    x_e = tl.load(xb + xo_e, mask=xm_e & (mrow < M), other=0.0)
                    x_o = tl.load(xb + xo_o, mask=xm_o & (mrow < M), other=0.0)
                    acc0 += w_e * x_e.to(tl.float32)
                    acc0 += w_o * x_o.to(tl.float32)
                    if BLOCK_M > 1:
                        x_e = tl.load(xb + stride_xm + xo_e, mask=xm_e & (mrow + 1 < M),
                                      other=0.0)
                        x_o = tl.load(xb + stride_xm + xo_o, mask=xm_o & (mrow + 1 < M),
                                      other=0.0)
                        acc1 += w_e * x_e.to(tl.float32)
                        acc1 += w_o * x_o.to(tl.float32)
                    if BLOCK_M > 2:
                        x_e = tl.load(xb + 2 * stride_xm + xo_e,
                                      mask=xm_e & (mrow + 2 < M), other=0.0)
                        x_o = tl.load(xb + 2 * stride_xm + xo_o,
                                      mask=xm_o & (mrow + 2 < M), other=0.0)
                        acc2 += w_e * x_e.to(tl.float32)
                        acc2 += w_o * x_o.to(tl.float32)
                        x_e = tl.load(xb + 3 * stride_xm + xo_e,
                                      mask=xm_e & (mrow + 3 < M), other=0.0)
                        x_o = tl.load(xb + 3 * stride_xm + xo_o,
                                      mask=xm_o & (mrow + 3 < M), other=0.0)
                        acc3 += w_e * x_e.to(tl.float32)
                        acc3 += w_o * x_o.to(tl.float32)

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
    bse = tl.load(base_ptr + offs_n * stride_base, mask=mask_n, other=1).to(tl.int32)
    scale = ((bse + 15) << 23).to(tl.float32, bitcast=True)
    out = out * scale[None, :]

    if HAS_ESC:
        n_lo = pid_n * BLOCK_N
        n_hi = tl.minimum(n_lo + BLOCK_N, N)
        e_begin = tl.load(rowptr_ptr + n_lo)
        e_end = tl.load(rowptr_ptr + n_hi)
        for e0 in range(e_begin, e_end, ESC_BLOCK):
            offs_e = e0 + tl.arange(0, ESC_BLOCK)
            m_e = offs_e < e_end
            e_row = tl.load(erow_ptr + offs_e, mask=m_e, other=-1)
            e_col = tl.load(ecol_ptr + offs_e, mask=m_e, other=0)
            if SPLIT_K > 1:
                e_j = e_col % K16
                m_e = m_e & (e_j >= j_start) & (e_j < j_end)
            w_true = tl.load(etrue_ptr + offs_e, mask=m_e, other=0.0)
            w_fake = tl.load(efake_ptr + offs_e, mask=m_e, other=0.0)
            xv = tl.load(x_rows + e_col[None, :], mask=mask_m[:, None] & m_e[None, :],
                         other=0.0).to(tl.float32)  # [BLOCK_M, ESC_BLOCK]
            contrib = xv * w_true[None, :] - xv * w_fake[None, :]
            hit = (e_row[:, None] == offs_n[None, :]) & m_e[:, None]  # [ESC_BLOCK, BLOCK_N]
            out += tl.sum(tl.where(hit[None, :, :], contrib[:, :, None], 0.0), axis=1)

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


_kernel = triton.jit(_bf12_linear_kernel)
# Triton's interpreter replaces its own library functions (tl.zeros, tl.sum, ...) when it is
# imported with TRITON_INTERPRET=1, so the mode is fixed process-wide at triton's import.
INTERPRETED = type(_kernel).__name__ == "InterpretedFunction"


# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Bf12Config:
    """Launch parameters. ``block_j`` counts 16-weight words, so one iteration covers
    ``16 * block_j`` weights of K per row. ``kind="dot"`` needs ``block_m, block_n, block_j
    >= 16``; for ``kind="fma"`` keep ``block_m`` small (it multiplies the accumulator)."""

    kind: str = "fma"
    block_m: int = 1
    block_n: int = 16
    block_j: int = 32
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    swap_ab: bool = False
    use_asm: bool = True
    esc_block: int = 16

    def __post_init__(self):
        if self.kind not in ("fma", "dot"):
            raise ValueError(f"Bf12Config.kind must be 'fma' or 'dot', got {self.kind!r}")
        for name in ("block_m", "block_n", "block_j", "esc_block", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"Bf12Config.{name} must be a power of two, got {v}")
        if self.kind == "dot" and min(self.block_m, self.block_n, self.block_j) < 16:
            raise ValueError("Bf12Config(kind='dot') needs block_m, block_n, block_j >= 16")
        if self.kind == "fma" and self.block_m > 4:
            raise ValueError("Bf12Config(kind='fma') supports block_m in (1, 2, 4)")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError("Bf12Config.split_k and num_stages must be >= 1")

    def replace(self, **kw) -> "Bf12Config":
        return dataclasses.replace(self, **kw)


def m_bucket(m: int) -> int:
    """The config bucket of a batch of M rows: the smallest of M_BUCKETS >= M (64 above)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return M_BUCKETS[-1]


def _heuristic(mb: int, n: int, k: int) -> Bf12Config:
    if mb == 1:
        return Bf12Config("fma", block_m=1, block_n=16, block_j=32, num_warps=4, num_stages=2)
    if mb <= 4:
        return Bf12Config("fma", block_m=mb, block_n=16, block_j=16, num_warps=4, num_stages=2)
    bm = max(16, mb)
    return Bf12Config("dot", block_m=bm, block_n=32 if bm <= 16 else 64, block_j=32,
                      num_warps=4, num_stages=2)


# (m_bucket, N, K) -> config, measured on an H200 (examples/bench_bf12.py; see
# docs/benchmarks/bf12-kernels.md). A deployment can override with set_config().
DEFAULT_CONFIGS: dict[tuple[int, int, int], Bf12Config] = {}
_OVERRIDES: dict[tuple[int, int, int], Bf12Config] = {}


def get_config(m: int, n: int, k: int) -> Bf12Config:
    """Config for an ``[m, k] x [n, k]^T`` product: override, else table, else heuristic."""
    key = (m_bucket(m), int(n), int(k))
    if key in _OVERRIDES:
        return _OVERRIDES[key]
    if key in DEFAULT_CONFIGS:
        return DEFAULT_CONFIGS[key]
    return _heuristic(*key)


def set_config(m: int, n: int, k: int, config: Bf12Config | Mapping | None) -> None:
    """Override the config of (m_bucket(m), n, k); ``None`` removes the override."""
    key = (m_bucket(m), int(n), int(k))
    if config is None:
        _OVERRIDES.pop(key, None)
    else:
        _OVERRIDES[key] = _as_config(config)


def clear_configs() -> None:
    """Drop all overrides set with set_config()."""
    _OVERRIDES.clear()


def _as_config(c: Bf12Config | Mapping) -> Bf12Config:
    if isinstance(c, Bf12Config):
        return c
    if isinstance(c, Mapping):
        return Bf12Config(**c)
    raise TypeError(f"config must be a Bf12Config or a mapping, got {type(c).__name__}")


# ------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------
def _kernel_meta(packed: Packed12) -> dict:
    """Device-side views and escape metadata, derived once per Packed12 and cached on it."""
    key = ("linear_bf12", str(packed.sm.device))
    meta = packed._cache.get(key)
    if meta is not None:
        return meta
    n, k = packed.rows, packed.cols
    dev = packed.sm.device
    idx = packed.esc_idx.to(torch.int64)
    rows = idx // k
    cols = idx - rows * k
    if packed.base_mode == "row":
        base_e = packed.base.to(torch.int32)[rows]
    else:
        base_e = packed.base.to(torch.int32).expand(rows.shape[0])
    meta = {
        "sm": packed.sm.view(torch.int64),
        "ex": packed.ex.view(torch.int64),
        "base": packed.base,
        "stride_base": 1 if packed.base_mode == "row" else 0,
        "num_esc": int(idx.numel()),
        "rowptr": torch.searchsorted(rows, torch.arange(n + 1, device=dev)).to(torch.int32),
        "erow": rows.to(torch.int32),
        "ecol": cols.to(torch.int32),
        "etrue": packed.esc_val.view(torch.bfloat16).to(torch.float32),
        "efake": (base_e << 23).view(torch.float32).contiguous(),
    }
    packed._cache[key] = meta
    return meta


_WORKSPACES: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, n_out: int, n_tiles: int):
    key = str(device)
    ws, cnt = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < n_out or cnt.numel() < n_tiles:
        ws = torch.zeros(max(n_out, 1 << 16), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(n_tiles, 1 << 12), dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, cnt)
    return ws, cnt


_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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
    if x.device.type != "cuda" and not interpret:
        raise RuntimeError("linear_bf12 on a CPU tensor needs the Triton interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported")
    if interpret and x.dtype == torch.bfloat16:
        raise TypeError("linear_bf12 under the Triton interpreter cannot do bf16 arithmetic; "
                        "pass fp32 (or fp16) activations")
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
    cfg = _as_config(config) if config is not None else get_config(m, n, k)
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
    kern[grid](
        x2, meta["sm"], meta["ex"], meta["base"], y, bias if bias is not None else dummy,
        meta["rowptr"], meta["erow"], meta["ecol"], meta["etrue"], meta["efake"],
        ws, cnt,
        m, n, k, k16, j_per,
        x2.stride(0), y.stride(0), meta["stride_base"],
        USE_DOT=cfg.kind == "dot", SWAP_AB=cfg.swap_ab,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_J=bj,
        SPLIT_K=split, HAS_BIAS=bias is not None, HAS_ESC=meta["num_esc"] > 0,
        ESC_BLOCK=cfg.esc_block, DOT_BF16=x.dtype == torch.bfloat16,
        USE_ASM=cfg.use_asm and not interpret,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y.reshape(*lead, n)


def linear_bf12_reference(x: torch.Tensor, packed: Packed12,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, packed.unpack(), bias)`` in x's dtype (the weights are exact in fp32)."""
    w = packed.unpack().to(x.dtype)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
