"""bf12 layout-2/3 linear for 1 .. 32 rows: decoded in registers straight into tensor-core fragments.

Why: the AR step (one row) and the bs1 verify and draft blocks (2 .. 16 rows) are bound by the
weight bytes, and bf12 holds 0.75 of them. The Triton layout-2 kernels
(:mod:`specc.codegen.kernels.linear_bf12_v2`) do not cash that in: their FMA path decodes at
about the bf16 GEMV's speed, and their ``tl.dot`` path stages every decoded tile through shared
memory, which made the Q = 16 verify step 1.85x slower packed than unpacked on the H200. This
kernel (CUDA, ``cuda/linear_bf12_mma.cu``) loads the sign|mantissa and code planes as 16-byte
vectors, decodes a pair of weights with two byte permutes and two integer ops, and feeds the
registers to ``mma.sync.m16n8k16`` directly (weights as the MMA's A operand, the few x rows as
B: "swap AB"; ``cuda/skinny_mma.cuh`` explains the fragment trick). What its epilogue reads
(bases, escapes, bias, residual) is staged in shared memory while the main loop streams, and a
fused norm's rows are normalized into shared memory once per CTA (``cuda/linear_bf12_mma.cu``
says why). Measured (docs/benchmarks/h100-run17.md, run18.md): on the H100 alone 0.82-0.94x
the time of the best bf16 kernel at 1, 4 and 16 rows on the Qwen3-8B layer shapes, where the
Triton bf12 kernels take 1.0-2.9x, and the packed Q = 16 verify step 1.04x the unpacked one
(Triton bf12: 2.0x). Run 18 (epilogue and norm staging, a 4-op decode, the launch rule, the L2
prefetch hint) took the packed AR step to 0.930x the unpacked one and the verify to 0.940x on the
H100; on the H200, whose HBM streams 1.4x the bytes per SM cycle, the version before the decode
change and launch rule had the packed steps at 1.34-1.37x.

Exactness: fp32 accumulation of the exact decoded weights; the row's power of two is multiplied
back after the sum (exact); escapes (weights outside the row's exponent window, ~1e-4) decode to
the format's stand-in in the loop, and the lane that stores an output adds ``x * true - x *
stand-in`` for each escape of its row (both products exact in fp32; inf/NaN propagate), then
the bias, then rounds once to bf16. So the result is the bf16 matmul on the unpacked weights up
to fp32 summation order, like the Triton bf12 kernels and cuBLAS. Split-K partials go through an
fp32 workspace and are added in split order by the last CTA of a row block: the same bits on
every call.

When it runs (:func:`unsupported_reason` says why not): a CUDA device of compute capability 8.0
or newer, bf16 activations, a layout-2 or layout-3 weight (layout 3 stores each 16-row block in
16 x 64 tiles, so a warp's loads are one contiguous KB: on the H100 the packed AR step 0.889x
the unpacked one against layout 2's 0.940x, the Q = 16 verify 0.881x against 0.944x;
docs/benchmarks/run21.md) with N % 16 == 0 and K % 64 == 0, 1 .. 32 rows with
16-byte aligned rows, batch-invariant mode off, ``SPECC_BF12_MMA`` not ``0``, and the extension
built. Everything else goes to the Triton kernels. The extension is compiled once per machine by
``torch.utils.cpp_extension.load`` (nvcc and ninja; ~30-60 s) and cached by torch in
``TORCH_EXTENSIONS_DIR``; if it cannot be built the Triton kernels run and a warning says why.

CPU: :func:`emulate` replays the kernel's index mapping, decode, escape fix-up and bias with torch
(tests/codegen/kernels/test_linear_bf12_mma.py), and :func:`compile_check` compiles the CUDA
source for sm_90 with NVRTC where it is installed.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import sys
import threading
import time
import warnings

import torch

from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled
from specc.codegen.kernels.bf12_launch import escape_meta, split_k_workspace
from specc.formats.bf12 import WIDE_LAYOUTS, Packed12, plane_strides

__all__ = ["Bf12MmaConfig", "ENV", "L2_PREFETCH_ENV", "L2_PREFETCH_DEFAULT", "CUDA_DIR", "MAX_ROWS", "X_TILES",
           "x_tiles", "launches_for", "FUSED_NORM_MAX_ROWS", "FUSED_NORM_MAX_STAGED_BYTES", "fuses_norm", "UNROLLS",
           "WARPS", "get_config", "waves", "unsupported_reason", "linear_bf12_mma", "extension", "emulate",
           "decode_constant_exponent", "compile_check", "nvrtc_ptx"]

ENV = "SPECC_BF12_MMA"  # "0": never use this kernel (the Triton bf12 kernels run)
# L2 prefetch-size hint on the weight loads: 256 (the default: each miss fetches 256 bytes from
# DRAM, which the CTA's warps read about together; the packed Qwen3-8B AR step 0.955x -> 0.930x
# the unpacked one, verify 0.969x -> 0.940x, H100 run 18), 128, or 0 (none; a separately named
# extension). Read once, when the extension is first built in the process.
L2_PREFETCH_ENV = "SPECC_BF12_MMA_L2_PREFETCH"
L2_PREFETCH_DEFAULT = "256"
CUDA_DIR = pathlib.Path(__file__).resolve().parent / "cuda"
# Rows of one launch: up to four 8-row x tiles (the MMA's N side), the weight streamed once. Why
# 32 and not 16: a DFlash drafter's K/V projection covers context + block = 24 rows, a B = 2
# verify and a bs1 tree of up to 31 nodes 17 .. 32; the Triton layout-3 kernel those fell to took
# 229 us against the bf16 GEMM's 45 us over the Qwen3-8B DFlash-b16 drafter's 5 layers (H200,
# docs/benchmarks/run32.md), which made the packed draft step 1.26x the bf16 one, and one launch
# per 16-row tile would read the packed weight twice (1.5x the bf16 bytes).
MAX_ROWS = 32
X_TILES = (1, 2, 4)  # the kernel's instances: 8, 16 or 32 rows
# Rows up to which kernel_abi fuses a norm prologue (above: the rms_norm kernel runs first, as for
# the unpacked GEMM). 0, so never: every CTA reads the x rows whole for their inverse RMS, which at
# 16 rows made the Qwen3-8B Q = 16 verify step 1.6x slower (H100, run 17), and at one row, with
# layout 3, costs more than the separate kernel: the packed AR step 4.922 / 4.939 ms fused,
# 4.853 / 4.851 ms with the rms_norm kernel first (H100, two processes, docs/benchmarks/run29.md;
# gate_up ran 5.6 us a call slower in the step than alone, its 1536 CTAs each normalizing the row).
# With layout 2 (run 20) fusing at one row had been faster. The kernel keeps the prologue for
# direct callers; the H200 has not measured the choice.
FUSED_NORM_MAX_ROWS = 0
# A fused norm stages the CTA's normalized x rows in shared memory (rows x K / splits bf16):
# at most this many bytes, so that with the kernel's static shared memory it fits the 48 KB a
# launch gets without opting in.
FUSED_NORM_MAX_STAGED_BYTES = 32768
UNROLLS = (1, 2)  # 64-weight super-groups per lane and chunk
WARPS = (4, 8)


@dataclasses.dataclass(frozen=True)
class Bf12MmaConfig:
    """A launch: ``unroll`` super-groups per chunk, ``warps`` per CTA (they split the CTA's K range
    in interleaved chunks), ``splits`` CTAs per 16-row block along K, ``prefetch`` (load the next
    chunk's weights during this chunk's MMAs, and the first chunk's before the PDL wait)."""

    unroll: int = 1
    warps: int = 8
    splits: int = 1
    prefetch: bool = False

    def __post_init__(self):
        if self.unroll not in UNROLLS or self.warps not in WARPS or self.splits < 1:
            raise ValueError(f"Bf12MmaConfig: unroll in {UNROLLS}, warps in {WARPS}, splits >= 1; got {self}")


def get_config(m: int, n: int, kp: int, sms: int, fused_norm: bool = False) -> Bf12MmaConfig:
    """The launch for ``m`` rows of an ``[n, kp]`` weight on a GPU of ``sms`` SMs, by how many
    waves of 16-row blocks the layer makes (measured on the Qwen3-8B shapes, H200 run 18 and H100
    runs 17 and 29, docs/benchmarks/run18.md, run29.md):

    - every launch prefetches (the next chunk's weights load during this chunk's MMAs, the first
      before the PDL wait): without it a warp keeps 1.5 KB in flight, too little on the H200;
    - at most 2 blocks per SM (o, down: every CTA lives the whole launch): 2 super-groups per
      chunk, 8 warps; more (qkv at 2.9, gate_up, lm_head: CTAs turn over): 2 super-groups, 4
      warps. Layout 2 on the H200 had taken 1 super-group x 8 warps for 2 .. 4 blocks an SM at up
      to 8 rows (run 18); with layout 3 on the H100 2 x 4 was faster for qkv alone (15.8 against
      17.3 us at one row) and in the packed AR step (4.862 / 4.866 -> 4.821 / 4.826 ms, two
      processes, run 29);
    - 17 .. 32 rows (the four-tile instance, H100 run 34, full sweep at 24 and 32 rows): 1
      super-group x 8 warps at up to 2 waves (o 17.8 against 27.7 us for 2 x 8, down 38.1
      against 57.6), 2 x 4 at up to 4 (qkv 21.9), 1 x 4 above (gate_up 72.9 against 80.6);
    - layers with fewer blocks than SMs (small models) split K so that every SM streams.

    ``fused_norm`` does not change the launch (the norm's rows are staged once per CTA)."""
    blocks = n // 16
    splits = 1
    while blocks * splits * 2 <= sms and kp % (64 * splits * 2) == 0 and kp // (64 * splits * 2) >= 8:
        splits *= 2
    w = waves(n, splits, sms)
    if m <= 16:
        unroll, warps = (2, 8) if w <= 2 else (2, 4)
    else:  # the four-tile instance: twice the x registers; 2 super-groups a chunk only at ~3 waves
        unroll, warps = (1, 8) if w <= 2 else (2, 4) if w <= 4 else (1, 4)
    if kp % (64 * unroll * splits) or kp // (64 * unroll * splits) < warps:
        unroll = 1  # a chunk per warp at least
    return Bf12MmaConfig(unroll=unroll, warps=warps, splits=splits, prefetch=True)


def launches_for(rows: int) -> int:
    """How many launches :func:`linear_bf12_mma` makes for ``rows`` rows: 1 up to ``MAX_ROWS``, 0
    where it does not run (the Triton kernels do): what kernel_abi's launch count and the cost
    model's weight passes read."""
    return 1 if 1 <= rows <= MAX_ROWS else 0


def x_tiles(rows: int) -> int:
    """8-row x tiles of the kernel instance that runs ``rows`` rows (the host picks the same):
    the smallest of :data:`X_TILES` that covers them."""
    return next(mt for mt in X_TILES if rows <= 8 * mt)


def waves(n: int, splits: int, sms: int) -> float:
    """How many waves of CTAs a launch over an N-row weight makes: its 16-row blocks times its
    K splits per SM (what :func:`get_config` picks the launch by)."""
    return (n // 16) * splits / max(1, sms)


def fuses_norm(rows: int, k: int) -> bool:
    """Whether ``rows`` rows of a K-column linear take their RMSNorm inside this kernel (else
    kernel_abi runs the rms_norm kernel first): at most ``FUSED_NORM_MAX_ROWS`` rows (none since
    run 29), and their normalized values fit the kernel's shared-memory stage (without split-K;
    a split stages only its K range)."""
    return rows <= FUSED_NORM_MAX_ROWS and _norm_stage_fits(rows, k)


def _norm_stage_fits(rows: int, k: int) -> bool:
    """Whether ``rows`` normalized bf16 rows of K columns fit the kernel's shared-memory stage
    (half of it above 16 rows: the 32-row instance's static shared memory is ~13 KB larger)."""
    return 2 * rows * k <= (FUSED_NORM_MAX_STAGED_BYTES if rows <= 16 else FUSED_NORM_MAX_STAGED_BYTES // 2)


def _env_enabled() -> bool:
    raw = os.environ.get(ENV, "1").strip().lower()
    return raw not in ("0", "off", "no", "false")


def unsupported_reason(x2: torch.Tensor, packed: Packed12, bias: torch.Tensor | None = None,
                       norm_weight: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> str | None:
    """Why this kernel cannot compute ``[residual +] [rms_norm](x2) @ W^T [+ bias]`` (x2: ``[M,
    K]``), or None when it can (the extension may still fail to build: :func:`extension`). The
    checks that need no GPU come first, so the rules are testable on the CPU."""
    if not _env_enabled():
        return f"{ENV}=0"
    if batch_invariant_enabled():
        return "batch-invariant mode (the Triton dot kernel at every M)"
    if packed.version not in WIDE_LAYOUTS:
        return f"layout version {packed.version} (this kernel reads layouts 2 and 3)"
    n, k = packed.shape
    if n % 16 or k % 64 or packed.padded_cols != k:
        return f"shape {n} x {k} (needs N % 16 == 0 and K % 64 == 0)"
    m = x2.shape[0]
    if not 1 <= m <= MAX_ROWS:
        return f"{m} rows (1 .. {MAX_ROWS})"
    if x2.dtype != torch.bfloat16:
        return f"{x2.dtype} activations (bf16 only)"
    if bias is not None and (bias.dtype != torch.bfloat16 or not bias.is_contiguous()):
        return "bias not contiguous bf16"
    if bias is not None and bias.data_ptr() % 4:
        return "bias not 4-byte aligned (the epilogue stages it by 4-byte copies)"
    if norm_weight is not None and (norm_weight.dtype != torch.bfloat16 or not norm_weight.is_contiguous()
                                    or norm_weight.numel() != k or norm_weight.data_ptr() % 16):
        return "norm weight not a contiguous, 16-byte aligned bf16 [K]"
    if norm_weight is not None and not _norm_stage_fits(m, k):
        return f"fused norm over {m} x {k} (the shared-memory stage is too small; run rms_norm first)"
    if residual is not None and (residual.dtype != torch.bfloat16 or tuple(residual.shape) != (m, n)
                                 or residual.stride(-1) != 1):
        return "residual not a bf16 [M, N] with unit column stride"
    if residual is not None and (residual.data_ptr() % 4 or (m > 1 and residual.stride(0) % 2)):
        return "residual rows not 4-byte aligned (the epilogue stages them by 4-byte copies)"
    if x2.stride(-1) != 1 or (m > 1 and x2.stride(0) % 8) or x2.data_ptr() % 16:
        return "x rows not 16-byte aligned"
    if x2.device.type != "cuda":
        return f"device {x2.device.type}"
    if x2.device.index is not None and x2.device.index != torch.cuda.current_device():
        return f"{x2.device} is not the current device (the launch uses the current device's stream)"
    if _capability(x2.device)[0] < 8:
        return "compute capability < 8.0 (no bf16 mma.sync)"
    return None


_CAPABILITY: dict[int, tuple[int, int]] = {}


def _capability(device: torch.device) -> tuple[int, int]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index]


_LOCK = threading.Lock()
_EXTENSIONS: dict[str, object] = {}  # arch -> module, or the exception its build raised


def _arch(device: torch.device) -> str:
    major, minor = _capability(device)
    return f"{major}{minor}"


def extension(device: torch.device):
    """The compiled extension for ``device``'s architecture, built on first use (once per machine:
    torch caches it) with a note on stderr; None, with one warning, when it cannot be built."""
    arch = _arch(device)
    with _LOCK:
        if arch not in _EXTENSIONS:
            _EXTENSIONS[arch] = _build(arch)
        ext = _EXTENSIONS[arch]
    return None if isinstance(ext, BaseException) else ext


def _build(arch: str):
    from torch.utils.cpp_extension import _get_build_directory, load

    l2 = os.environ.get(L2_PREFETCH_ENV, L2_PREFETCH_DEFAULT).strip() or L2_PREFETCH_DEFAULT
    if l2 not in ("0", "128", "256"):
        raise ValueError(f"{L2_PREFETCH_ENV}={l2!r}: use 0, 128 or 256")
    name = f"specc_bf12_mma_sm{arch}" + ("" if l2 == L2_PREFETCH_DEFAULT else f"_l2pf{l2}")
    try:
        cached = any(p.suffix == ".so" for p in pathlib.Path(_get_build_directory(name, False)).glob("*.so"))
    except Exception:  # noqa: BLE001 - only decides whether to print the note
        cached = False
    t0 = time.perf_counter()
    if not cached:
        print(f"specc: compiling the bf12 tensor-core kernel for sm_{arch} (once per machine, ~1 min)",
              file=sys.stderr, flush=True)
    try:
        ext = load(name, sources=[str(CUDA_DIR / "linear_bf12_mma.cu"), str(CUDA_DIR / "linear_bf12_mma_host.cpp")],
                   extra_include_paths=[str(CUDA_DIR)],
                   extra_cuda_cflags=["-O3", f"-arch=sm_{arch}", f"-DSKINNY_L2_PREFETCH={l2}"], verbose=False)
    except Exception as exc:  # noqa: BLE001 - no nvcc / ninja / headers: the Triton kernels run instead
        warnings.warn(f"specc: the bf12 tensor-core kernel could not be built ({type(exc).__name__}: "
                      f"{str(exc)[:300]}); packed linears use the Triton kernels", RuntimeWarning, stacklevel=3)
        return exc
    if not cached:
        print(f"specc: bf12 tensor-core kernel ready ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return ext


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def linear_bf12_mma(x2: torch.Tensor, packed: Packed12, bias: torch.Tensor | None = None,
                    config: Bf12MmaConfig | None = None, out: torch.Tensor | None = None,
                    norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                    residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """``[residual +] [rms_norm](x2, norm_weight, eps) @ W^T [+ bias]`` (x2: ``[M, K]`` bf16, 1 ..
    ``MAX_ROWS`` rows; ``residual``: ``[M, N]``) into ``out`` or a new ``[M, N]`` tensor, the
    norm and the add rounded as the separate ops round, in one launch; None when the kernel
    cannot run here (:func:`unsupported_reason`, or no extension): the caller runs the Triton
    kernels instead."""
    if unsupported_reason(x2, packed, bias, norm_weight, residual) is not None:
        return None
    ext = extension(x2.device)
    if ext is None:
        return None
    n, kp = packed.rows, packed.padded_cols
    m = x2.shape[0]
    cfg = config or get_config(m, n, kp, _sms(x2.device), fused_norm=norm_weight is not None)
    if kp % (64 * cfg.unroll * cfg.splits):  # (N % 16 is unsupported_reason's)
        raise ValueError(f"{cfg} does not tile a {n} x {kp} weight")
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device) if out is None else out
    meta = escape_meta(packed)
    unused = meta["rowptr"]  # a device tensor for the arguments a launch does not read
    if cfg.splits > 1:
        # per split and 16-row block, 32 lanes x 4 floats per x tile, sized for the widest instance
        # whatever the rows: a CUDA graph captured at few rows keeps its workspace when a later
        # call at more rows would otherwise grow (reallocate) it
        ws, tickets = split_k_workspace(x2.device, cfg.splits * (n // 16) * 32 * 4 * max(X_TILES), n // 16,
                                        owner="bf12_mma")
    else:
        ws = tickets = unused
    from specc.codegen.kernels.pdl import pdl_mode

    ext.bf12_mma_out(x2, packed.sm, packed.ex, meta["base"], meta["stride_base"], meta["rowptr"],
                     meta["ecol"], meta["etrue"], meta["efake"], unused if bias is None else bias, bias is not None,
                     unused if norm_weight is None else norm_weight, norm_weight is not None, float(eps),
                     unused if residual is None else residual, residual is not None, y,
                     ws, tickets, *plane_strides(packed.version, kp), cfg.splits, cfg.unroll, cfg.warps,
                     cfg.prefetch, bool(pdl_mode(x2, "bf12")))
    return y


# --------------------------------------------------------------------------- CPU: emulation, compile check


def decode_constant_exponent(sm: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The kernel's decode of sign|mantissa bytes and 4-bit codes (uint8 tensors of one shape):
    ``W * 2**(112 - base)`` as fp32, by the same bit operations."""
    s, c = sm.to(torch.int32), codes.to(torch.int32)
    bits = ((s & 0x80) << 8) | ((0x70 + c) << 7) | (s & 0x7F)
    return (bits << 16).view(torch.float32)


def emulate(x: torch.Tensor, packed: Packed12, bias: torch.Tensor | None = None,
            config: Bf12MmaConfig = Bf12MmaConfig(unroll=1, warps=4), norm_weight: torch.Tensor | None = None,
            eps: float = 1e-6, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel replayed with torch in fp32: the rows' inverse RMS and rms_norm's roundings
    (``norm_weight``), which weights and x columns each lane's vectors hold, how they become MMA
    fragments, which output each accumulator is, the per-warp, per-CTA and split-order sums, the
    rows' power of two, the escape fix-up, the bias and the residual's two roundings. Equal to
    ``residual + rms_norm(x) @ W^T + bias`` on the unpacked weights up to fp32 summation order
    exactly when all of that is right. Returns bf16 when ``residual`` is given (its roundings are
    part of the result), else fp32."""
    sm, ex = packed.sm.cpu(), packed.ex.cpu()
    meta = {key: (v.cpu() if isinstance(v, torch.Tensor) else v) for key, v in escape_meta(packed).items()}
    n_dim, kp = sm.shape
    m_rows = x.shape[0]
    u_, warps, splits = config.unroll, config.warps, config.splits
    assert m_rows <= MAX_ROWS and n_dim % 16 == 0 and kp % (64 * u_ * splits) == 0 and packed.version in WIDE_LAYOUTS
    mt = x_tiles(m_rows)  # the instance the host launches: 4 accumulators per lane and x tile
    strides = plane_strides(packed.version, kp)  # the kernel's address arithmetic on the flat planes
    sm, ex = sm.reshape(-1), ex.reshape(-1)
    xp = torch.zeros(8 * mt, kp)
    xp[:m_rows, :x.shape[1]] = x.float()
    if norm_weight is not None:  # n = bf16(x * rstd), h = bf16(g * n), as specc.models.ops.rms_norm
        rstd = torch.rsqrt(xp[:m_rows].pow(2).sum(-1, keepdim=True) / kp + eps)
        n_ = (xp[:m_rows] * rstd).to(torch.bfloat16).float()
        xp[:m_rows] = (norm_weight.float() * n_).to(torch.bfloat16).float()
    base = meta["base"].to(torch.int32)
    y = torch.zeros(m_rows, n_dim)
    k_split = kp // splits
    for n0 in range(0, n_dim, 16):
        total = torch.zeros(32, 4 * mt)
        for split in range(splits):
            part = torch.zeros(32, 4 * mt)
            for warp in range(warps):
                acc = torch.zeros(32, 4 * mt)
                for c in range(warp, k_split // (64 * u_), warps):
                    for u in range(u_):
                        k0 = split * k_split + c * 64 * u_ + 64 * u
                        _super_group(acc, xp, sm, ex, n0, k0, kp, strides)
                part += acc
            for lane in range(32):
                g = lane // 4
                for j in range(4 * mt):
                    row = n0 + g + (8 if j % 4 >= 2 else 0)
                    part[lane, j] *= 2.0 ** (int(base[row * meta["stride_base"]]) - 112)
            total += part
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for j in range(4 * mt):
                m = 8 * (j // 4) + 2 * t + j % 2
                row = n0 + g + (8 if j % 4 >= 2 else 0)
                if m >= m_rows:
                    continue
                s = total[lane, j]
                for e in range(int(meta["rowptr"][row]), int(meta["rowptr"][row + 1])):
                    xv = xp[m, int(meta["ecol"][e])]
                    s = s + (xv * meta["etrue"][e] - xv * meta["efake"][e])
                if bias is not None:
                    s = s + bias[row].float()
                if residual is not None:
                    s = s.to(torch.bfloat16).float() + residual[m, row].float()
                y[m, row] = s
    return y if residual is None else y.to(torch.bfloat16)


def _super_group(acc: torch.Tensor, xp: torch.Tensor, sm: torch.Tensor, ex: torch.Tensor, n0: int, k0: int,
                 kp: int, strides: tuple[int, int, int, int]) -> None:
    """One 64-weight super-group of a 16-row block: each lane's 16 decoded weights per row (read
    from the flat planes ``sm``, ``ex`` at the kernel's addresses: ``strides`` as
    :func:`specc.formats.bf12.plane_strides`), then the four MMAs of every x tile (``xp``: 8 rows
    a tile), accumulated into ``acc`` [32 lanes, 4 per tile]."""
    tiles = xp.shape[0] // 8
    sm_row, sm_group, ex_row, ex_group = strides
    dec = {}
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in (g, g + 8):
            e0 = n0 * (kp // 2) + r * ex_row + (k0 // 64) * ex_group + 16 * (t // 2)
            s0 = n0 * kp + r * sm_row + (k0 // 64) * sm_group + 16 * t
            codes = ex[e0:e0 + 16]
            codes = (codes >> 4) if t % 2 else (codes & 0xF)
            dec[lane, r] = decode_constant_exponent(sm[s0:s0 + 16], codes)
    for i in range(4):
        a = torch.zeros(16, 16)
        b = [torch.zeros(16, 8) for _ in range(tiles)]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for e in range(2):
                for r in (g, g + 8):
                    a[r, 2 * t + e] = dec[lane, r][4 * i + e]
                    a[r, 2 * t + 8 + e] = dec[lane, r][4 * i + 2 + e]
                for tile in range(tiles):
                    b[tile][2 * t + e, g] = xp[8 * tile + g, k0 + 16 * t + 4 * i + e]
                    b[tile][2 * t + 8 + e, g] = xp[8 * tile + g, k0 + 16 * t + 4 * i + 2 + e]
        d = [a @ bt for bt in b]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for j in range(4 * tiles):
                acc[lane, j] += d[j // 4][g + (8 if j % 4 >= 2 else 0), 2 * t + j % 2]


def nvrtc_ptx(source: str, name: str, include_dirs=(), arch: str = "compute_90") -> str:
    """PTX of ``source`` from NVRTC (``pip install nvidia-cuda-nvrtc-cu12``), for checking a
    kernel compiles on a machine without a GPU. Raises FileNotFoundError without NVRTC and
    RuntimeError with NVRTC's log on a compile error."""
    import ctypes
    import glob
    import site

    dirs = site.getsitepackages() + [site.getusersitepackages()]
    paths = [p for d in dirs for p in glob.glob(os.path.join(d, "nvidia/cuda_nvrtc/lib/libnvrtc.so*"))
             if "alt" not in p and "builtins" not in p]
    if not paths:
        raise FileNotFoundError("libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12)")
    lib = ctypes.CDLL(paths[0])
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-DSPECC_NVRTC"]
    opts += [f"--include-path={d}".encode() for d in include_dirs]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise RuntimeError(f"NVRTC failed:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def compile_check(arch: str = "compute_90", l2_prefetch: int = int(L2_PREFETCH_DEFAULT)) -> str:
    """PTX of every kernel instance of ``cuda/linear_bf12_mma.cu`` from NVRTC (see :func:`nvrtc_ptx`),
    built as :data:`L2_PREFETCH_ENV` = ``l2_prefetch`` builds it."""
    instances = "".join(
        f"template __global__ void bf12_mma<{mt}, {u}, {w}, {str(p).lower()}>(const bf16_t*, const unsigned char*, "
        f"const unsigned char*, const unsigned char*, int, const int*, const int*, const float*, const float*, "
        f"const bf16_t*, const bf16_t*, float, const bf16_t*, long, bf16_t*, float*, unsigned*, int, int, int, long, "
        f"long, int, int, int, int);\n"
        for mt, u, w, p in itertools.product(X_TILES, UNROLLS, WARPS, (False, True)))
    source = f"#define SKINNY_L2_PREFETCH {int(l2_prefetch)}\n" + (CUDA_DIR / "linear_bf12_mma.cu").read_text() + instances
    return nvrtc_ptx(source, "linear_bf12_mma.cu", [str(CUDA_DIR)], arch)
