"""Experiment: a hand-written tensor-core GEMM for 1 .. 16 rows that loads weights like the GEMV.

Why: at 2 .. 64 rows (a verify block, a DFlash draft block) specc's Triton tensor-core linear
streams the 4096-wide Qwen3-8B weights at 0.62-0.70 of the H200's HBM bandwidth (qkv and o,
docs/benchmarks/h200-run12.md) while its one-row GEMV reaches 0.80-0.89. That gap is most of
the verify step's 12% over the AR step, and the same shapes make up the drafter's layers, so it
bounds the speculative ratio at batch 1 (#15) and the small-M goals of #21. The Triton kernel
stages every weight tile through shared memory for the MMA; the GEMV loads 16-byte vectors
straight into registers with many loads in flight. This kernel does the latter and feeds the
registers to ``mma.sync.m16n8k16`` directly.

The trick: an MMA sums over k, so the k order inside it is free as long as both operands use the
same one. Thread (g = lane / 4, t = lane % 4) of a warp loads 8 consecutive k of weight rows g
and g + 8 as one 16-byte vector each (``W[n0 + g, k0 + 32u + 8t : +8]``), and the same 8 k of x
rows g and g + 8. Of those, k0 + 32u + 8t + 4j + {0, 1} and {2, 3} (j = 0, 1) are what the MMA
fragment layout calls columns 2t, 2t + 1 and 2t + 8, 2t + 9 of A (and rows of B): the 16-byte
vectors become fragments without a shuffle or shared memory. A warp covers 16 weight rows
(the MMA's M side: the weights are A, x^T is B, "swap AB") and 1 or 2 eight-row tiles of x.
Warps of a CTA split the CTA's K range (chunks of 32 x U, interleaved), CTAs split K further
(``splits``); the CTA's warps add up in shared memory in warp order, the CTAs of one row block
through an fp32 workspace, summed in split order by the last to finish (a ticket, as specc's
split-K): deterministic. fp32 accumulation, one rounding to bf16.

Status: an experiment; its bf12 form became a lowering. ``main`` (GPU) compiles the kernel with
``torch.utils.cpp_extension.load_inline`` (its device helpers are specc's
``specc/codegen/kernels/cuda/skinny_mma.cuh``), checks every configuration against an fp32
reference, and times it beside specc's Triton linear and cuBLAS in CUDA graphs that rotate weight
copies past L2. On bf16 weights (docs/benchmarks/h100-run16.md) it is within 1-10% of the
Triton linear and cuBLAS at 4-16 rows, so shared-memory staging is not what holds the small-M
bf16 linears back, and it is not a lowering. On bf12 layout-2 planes decoded straight into the
fragments (docs/benchmarks/h100-run17.md) it took 0.84-0.94x the best bf16 kernel's time where
the Triton bf12 kernels took 1.0-2.9x: that kernel is now
:mod:`specc.codegen.kernels.linear_bf12_mma`, and ``--bf12`` times it here beside the bf16 one.
``pdl`` launches with programmatic dependent launch; with ``prefetch`` the first chunk's weights
load before ``griddepcontrol.wait`` (no consistent gain in isolation on the H100). On the CPU,
:func:`emulate` replays the bf16 kernel's index mapping in torch
(tests/test_skinny_mma_script.py) and :func:`compile_check` compiles the CUDA source for sm_90
with NVRTC when it is installed.

    PYTHONPATH=. python3 examples/skinny_mma.py --bf12 --out $OUT/skinny.json      # GPU, ~3-4 min
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
ROWS_PER_CTA = 16  # weight rows per CTA: the MMA's M side

CUDA_SOURCE = r"""
#include "skinny_mma.cuh"  // specc/codegen/kernels/cuda: loads, the MMA, the CTA reduction

// y[M, N] = x[M, K] @ W[N, K]^T; M <= 8 * MT; K % (32 * U * splits) == 0 handled by the host;
// grid (N / 16, splits), WARPS warps; PREFETCH: double-buffer the weight registers across chunks.
// Thread (g, t) loads 8 consecutive k of weight rows g and g + 8 (W[n0 + g, k0 + 32u + 8t : +8])
// and the same k of x rows g and g + 8; of those, k + {0, 1} and {2, 3} (+ 4j) are what the MMA
// fragment layout calls columns 2t, 2t + 1 and 2t + 8, 2t + 9.
template <int MT, int U, int WARPS, bool PREFETCH>
__global__ void __launch_bounds__(WARPS * 32)
skinny_mma(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ y,
           float* __restrict__ ws, unsigned* __restrict__ tickets, int M, int N, int K, int k_split,
           long stride_x, long stride_y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16, split = blockIdx.y;
  const int chunks = k_split / (32 * U);
  const bf16_t* wa = w + (long)(n0 + g) * K + split * k_split + 8 * t;
  const bf16_t* wb = wa + 8L * K;
  const bf16_t* xa = x + (long)(g < M ? g : 0) * stride_x + split * k_split + 8 * t;  // rows past M:
  const bf16_t* xb = x + (long)(g + 8 < M ? g + 8 : 0) * stride_x + split * k_split + 8 * t;  // never stored
  float c[MT][4] = {};  // c[j]: x tile j
  V4 ra[U], rb[U];  // PREFETCH: the chunk's weights, loaded during the previous chunk's MMAs
  if (PREFETCH && warp < chunks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ra[u] = load_weights(wa + warp * 32 * U + 32 * u);
      rb[u] = load_weights(wb + warp * 32 * U + 32 * u);
    }
  }
  // the weights (which no kernel writes) may load before the previous kernel has finished
  pdl_wait_then_release();
  for (int c = warp; c < chunks; c += WARPS) {
    const int k0 = c * 32 * U;
    V4 xa_[U], xb_[U], na[U], nb[U];
    if (PREFETCH) {
      const int k1 = (c + WARPS < chunks ? c + WARPS : c) * 32 * U;  // the last chunk reloads itself
#pragma unroll
      for (int u = 0; u < U; ++u) {
        na[u] = load_weights(wa + k1 + 32 * u);
        nb[u] = load_weights(wb + k1 + 32 * u);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        ra[u] = load_weights(wa + k0 + 32 * u);
        rb[u] = load_weights(wb + k0 + 32 * u);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      xa_[u] = load_x(xa + k0 + 32 * u);
      if (MT == 2) xb_[u] = load_x(xb + k0 + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        mma16816(c[0], ra[u].w[2 * j], rb[u].w[2 * j], ra[u].w[2 * j + 1], rb[u].w[2 * j + 1],
                 xa_[u].w[2 * j], xa_[u].w[2 * j + 1]);
        if (MT == 2)
          mma16816(c[MT - 1], ra[u].w[2 * j], rb[u].w[2 * j], ra[u].w[2 * j + 1], rb[u].w[2 * j + 1],
                   xb_[u].w[2 * j], xb_[u].w[2 * j + 1]);
      }
    }
    if (PREFETCH) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        ra[u] = na[u];
        rb[u] = nb[u];
      }
    }
  }
  float s[4 * MT];
  if (reduce_cta<WARPS, MT>(c, s, ws, tickets)) store_lane(s, y, stride_y, M, n0, g, t);
}
"""

HOST_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define LAUNCH(MT, U, WARPS)                                                                   \
  if (prefetch) LAUNCH_P(MT, U, WARPS, true); else LAUNCH_P(MT, U, WARPS, false)
#define LAUNCH_P(MT, U, WARPS, P)                                                              \
  C10_CUDA_CHECK(launch_maybe_pdl(skinny_mma<MT, U, WARPS, P>, grid, WARPS * 32, 0, stream, pdl,  \
      (const bf16_t*)x.data_ptr(), (const bf16_t*)w.data_ptr(), (bf16_t*)y.data_ptr(),         \
      ws.data_ptr<float>(), (unsigned*)tickets.data_ptr<int>(), M, N, K, (int)(K / splits),    \
      (long)x.stride(0), (long)y.stride(0)))

void skinny_mma_out(torch::Tensor x, torch::Tensor w, torch::Tensor y, torch::Tensor ws, torch::Tensor tickets,
                    int64_t splits, int64_t unroll, int64_t warps, bool prefetch, bool pdl) {
  const int M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= 16, "1 .. 16 rows");
  TORCH_CHECK(N % 16 == 0 && K % (32 * unroll * splits) == 0, "N % 16, K % (32 * unroll * splits)");
  dim3 grid(N / 16, splits);
  auto stream = at::cuda::getCurrentCUDAStream();
  const int mt = M > 8 ? 2 : 1;
  const int key = mt * 100 + unroll * 10 + warps / 4;
  switch (key) {
    case 121: LAUNCH(1, 2, 4); break;
    case 122: LAUNCH(1, 2, 8); break;
    case 141: LAUNCH(1, 4, 4); break;
    case 142: LAUNCH(1, 4, 8); break;
    case 181: LAUNCH(1, 8, 4); break;
    case 182: LAUNCH(1, 8, 8); break;
    case 221: LAUNCH(2, 2, 4); break;
    case 222: LAUNCH(2, 2, 8); break;
    case 241: LAUNCH(2, 4, 4); break;
    case 242: LAUNCH(2, 4, 8); break;
    case 281: LAUNCH(2, 8, 4); break;
    case 282: LAUNCH(2, 8, 8); break;
    default: TORCH_CHECK(false, "unroll in {2, 4, 8}, warps in {4, 8}");
  }
}
"""

UNROLLS, WARPS, SPLITS, PREFETCH, PDL = (2, 4, 8), (4, 8), (1, 2), (False, True), (False, True)


def build():
    """The extension (GPU machine: nvcc and torch's headers)."""
    from torch.utils.cpp_extension import load_inline

    from specc.codegen.kernels.linear_bf12_mma import CUDA_DIR

    declaration = ("void skinny_mma_out(torch::Tensor x, torch::Tensor w, torch::Tensor y, torch::Tensor ws, "
                   "torch::Tensor tickets, int64_t splits, int64_t unroll, int64_t warps, bool prefetch, bool pdl);")
    return load_inline("specc_skinny_mma", cpp_sources=declaration, cuda_sources=CUDA_SOURCE + HOST_SOURCE,
                       functions=["skinny_mma_out"], extra_include_paths=[str(CUDA_DIR)],
                       extra_cuda_cflags=["-O3", "-arch=sm_90"], verbose=False)


def compile_check(arch: str = "compute_90") -> str:
    """PTX of :data:`CUDA_SOURCE` (every template instance) from NVRTC, for checking the kernel
    compiles on a machine without a GPU (``pip install nvidia-cuda-nvrtc-cu12``). Raises with
    NVRTC's log on an error."""
    from specc.codegen.kernels.linear_bf12_mma import CUDA_DIR, nvrtc_ptx

    instances = "".join(f"template __global__ void skinny_mma<{mt}, {u}, {w}, {str(p).lower()}>(const bf16_t*, "
                        f"const bf16_t*, bf16_t*, float*, unsigned*, int, int, int, int, long, long);\n"
                        for mt, u, w, p in itertools.product((1, 2), UNROLLS, WARPS, PREFETCH))
    return nvrtc_ptx(CUDA_SOURCE + instances, "skinny_mma.cu", [str(CUDA_DIR)], arch)


def emulate(x: torch.Tensor, w: torch.Tensor, unroll: int = 4, warps: int = 4, splits: int = 1) -> torch.Tensor:
    """The kernel's index mapping replayed with torch (fp32): which k each lane's fragments hold,
    how a fragment's virtual columns map to them, and which output each accumulator is. Equal
    to ``x @ w.T`` up to fp32 summation order exactly when the mapping is right."""
    m_rows, k_dim = x.shape
    n_dim = w.shape[0]
    assert m_rows <= 16 and n_dim % 16 == 0 and k_dim % (32 * unroll * splits) == 0
    xf, wf = x.float(), w.float()
    xp = torch.zeros(16, k_dim)
    xp[:m_rows] = xf  # (rows past M: any row; never stored)
    y = torch.zeros(m_rows, n_dim)
    k_split = k_dim // splits
    for n0 in range(0, n_dim, 16):
        total = torch.zeros(32, 8)
        for split in range(splits):
            red = torch.zeros(warps, 32, 8)
            for warp in range(warps):
                for c in range(warp, k_split // (32 * unroll), warps):
                    for u in range(unroll):
                        for j in range(2):
                            base = split * k_split + c * 32 * unroll + 32 * u + 4 * j
                            # fragments as the MMA sees them: A [16 rows, 16 virtual cols], B [16, 8] per x tile
                            a = torch.zeros(16, 16)
                            b = [torch.zeros(16, 8), torch.zeros(16, 8)]
                            for lane in range(32):
                                g, t = lane // 4, lane % 4
                                k = base + 8 * t  # this lane's 4 consecutive k: word 2j and 2j + 1 of its vector
                                for e in range(2):
                                    for row, wrow in ((g, n0 + g), (g + 8, n0 + g + 8)):
                                        a[row, 2 * t + e] = wf[wrow, k + e]
                                        a[row, 2 * t + 8 + e] = wf[wrow, k + 2 + e]
                                    for tile in range(2):
                                        b[tile][2 * t + e, g] = xp[8 * tile + g, k + e]
                                        b[tile][2 * t + 8 + e, g] = xp[8 * tile + g, k + 2 + e]
                            d = [a @ b[0], a @ b[1]]  # [16 weight rows, 8 x rows] each
                            for lane in range(32):
                                g, t = lane // 4, lane % 4
                                for i in range(8):
                                    tile, r = i // 4, g + (8 if i % 4 >= 2 else 0)
                                    red[warp, lane, i] += d[tile][r, 2 * t + i % 2]
            total += red.sum(0)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for i in range(8):
                m = 2 * t + i % 2 + (8 if i >= 4 else 0)
                n = n0 + g + (8 if i % 4 >= 2 else 0)
                if m < m_rows:
                    y[m, n] = total[lane, i]
    return y


def _bf12_rows(timer, name, n, k, m, x, weights, best16, dev, triton_bf12) -> dict:
    """specc's bf12 tensor-core kernel (:mod:`specc.codegen.kernels.linear_bf12_mma`, the lowering
    this experiment became) at one (shape, M), over its configurations: error against the fp32
    reference on the exact weights (escapes included) and time per call beside the bf16 kernel's
    best and specc's Triton bf12 linear."""
    from specc.codegen.kernels.linear_bf12_mma import UNROLLS as UNROLLS_BF12
    from specc.codegen.kernels.linear_bf12_mma import Bf12MmaConfig, linear_bf12_mma
    from specc.formats.bf12 import pack_bf16_12bit

    packed = [pack_bf16_12bit(w, version=2) for w in weights]
    want = x.float() @ weights[0].float().T
    y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    copies = len(packed)
    out = {"shape": name, "M": m, "packed_bytes": packed[0].nbytes, "configs": [], "failures": []}
    out["triton_bf12_s"] = timer(lambda: [triton_bf12(x, p) for p in packed], inner=copies)
    tol = max(2 * float((triton_bf12(x, packed[0]).float() - want).abs().max()), 1e-2)
    for u, wp, sp, pf in itertools.product(UNROLLS_BF12, WARPS, SPLITS, PREFETCH):
        if k % (64 * u * sp):
            continue
        cfg = Bf12MmaConfig(unroll=u, warps=wp, splits=sp, prefetch=pf)
        rec = {"unroll": u, "warps": wp, "splits": sp, "prefetch": pf}
        try:
            linear_bf12_mma(x, packed[0], config=cfg, out=y)
            torch.cuda.synchronize()
            err = float((y.float() - want).abs().max())
            seconds = timer(lambda: [linear_bf12_mma(x, p, config=cfg, out=y) for p in packed], inner=copies)
        except Exception as exc:  # noqa: BLE001 - an experiment: record and go on
            out["failures"].append({**rec, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        ok = err <= tol
        out["configs"].append({**rec, "seconds": seconds, "max_err": err, "ok": ok})
        if not ok:
            out["failures"].append({**rec, "error": f"max err {err:.3g} (tolerance {tol:.3g})"})
    best = min((c for c in out["configs"] if c["ok"]), key=lambda c: c["seconds"], default=None)
    out["best"] = best
    if best is not None and best16 is not None:
        out["vs_bf16_kernel"] = best["seconds"] / best16["seconds"]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="1,4,8,16", help="comma-separated row counts (1 .. 16)")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head")
    ap.add_argument("--out", default="skinny_mma.json")
    ap.add_argument("--bf12", action="store_true",
                    help="also specc's bf12 tensor-core kernel (layout 2) beside the bf16 one")
    args = ap.parse_args(argv)
    from specc.codegen.kernels.linear import linear as triton_linear
    from specc.search.calibrate import Timer, copies_past_cache

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    t0 = time.perf_counter()
    ext = build()
    print(f"[skinny] built in {time.perf_counter() - t0:.1f} s on {torch.cuda.get_device_name(dev)}", flush=True)
    timer = Timer("cuda", reps=20, warmup=2)
    rows, failures = [], []
    tickets = torch.zeros(max(n for n, _ in SHAPES.values()) // 16, dtype=torch.int32, device=dev)
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        copies = copies_past_cache(n * k * 2, l2)
        weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            want = (x.float() @ weights[0].float().T)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            nbytes = n * k * 2 + (m * k + m * n) * 2
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes, "configs": []}
            row["triton_s"] = timer(lambda: [triton_linear(x, w) for w in weights], inner=copies)
            row["cublas_s"] = timer(lambda: [torch.nn.functional.linear(x, w) for w in weights], inner=copies)
            got_t = triton_linear(x, weights[0]).float()
            row["triton_max_err"] = float((got_t - want).abs().max())
            for u, wp, sp, pf, pdl in itertools.product(UNROLLS, WARPS, SPLITS, PREFETCH, PDL):
                if k % (32 * u * sp):
                    continue
                ws = torch.empty(sp * (n // 16) * 32 * 8, device=dev, dtype=torch.float32)
                cfg = {"unroll": u, "warps": wp, "splits": sp, "prefetch": pf, "pdl": pdl}
                try:
                    ext.skinny_mma_out(x, weights[0], y, ws, tickets, sp, u, wp, pf, pdl)
                    torch.cuda.synchronize()
                    err = float((y.float() - want).abs().max())
                    # the same bits twice (deterministic split-K) and within bf16 rounding of fp32
                    again = y.clone()
                    ext.skinny_mma_out(x, weights[0], y, ws, tickets, sp, u, wp, pf, pdl)
                    ok = bool(torch.equal(again, y)) and err <= max(2 * row["triton_max_err"], 1e-2)
                    seconds = timer(lambda: [ext.skinny_mma_out(x, w, y, ws, tickets, sp, u, wp, pf, pdl)
                                             for w in weights], inner=copies)
                except Exception as exc:  # noqa: BLE001 - an experiment: record and go on
                    failures.append({**cfg, "shape": name, "M": m, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    continue
                row["configs"].append({**cfg, "seconds": seconds, "max_err": err, "ok": ok})
                if not ok:
                    failures.append({**cfg, "shape": name, "M": m, "error": f"max err {err:.3g}"})
            best = min((c for c in row["configs"] if c["ok"]), key=lambda c: c["seconds"], default=None)
            row["best"] = best
            hbm = 4.8e12
            fmt = lambda s: f"{s * 1e6:7.1f} us {nbytes / s / hbm:.2f}" if s else "   -"  # noqa: E731
            chosen = "" if best is None else " ".join(f"{key}={best[key]}" for key in ("unroll", "warps", "splits",
                                                                                     "prefetch", "pdl"))
            print(f"[skinny] {name:8s} M={m:2d}  triton {fmt(row['triton_s'])}  cublas {fmt(row['cublas_s'])}  "
                  f"mma {fmt(best['seconds'] if best else None)} {chosen}", flush=True)
            if args.bf12:
                from specc.codegen.kernels.linear_bf12 import linear_bf12

                row["bf12"] = _bf12_rows(timer, name, n, k, m, x, weights, best, dev, linear_bf12)
                failures += [{**f, "shape": name, "M": m, "bf12": True} for f in row["bf12"]["failures"]]
                b12 = row["bf12"]["best"]
                print(f"[skinny]   bf12   M={m:2d}  triton {row['bf12']['triton_bf12_s'] * 1e6:7.1f} us  mma "
                      f"{(b12['seconds'] * 1e6 if b12 else float('nan')):7.1f} us "
                      f"({row['bf12'].get('vs_bf16_kernel', float('nan')):.2f}x the bf16 kernel, Triton bf16 "
                      f"{(b12['seconds'] / row['triton_s']) if b12 else float('nan'):.2f}x)", flush=True)
            rows.append(row)
        weights = []
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": rows,
              "failures": failures, "hbm_reference": 4.8e12}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"[skinny] {len(failures)} failing configs; wrote {args.out}", flush=True)
    return report


if __name__ == "__main__":
    main()
