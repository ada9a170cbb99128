"""Sweep the dot linear kernel's configs at given M over Qwen3-8B layer shapes on the GPU; prints
the fastest config per (M, shape) beside the shipped table's.

Timing as in bench_kernels.py: one CUDA graph calls the op once per rotating copy of its
weights (>= 256 MB of distinct weights, so L2 cannot serve them); median over replays divided by
the calls. Kernel variants are compiled first in ``--warm`` parallel processes (Triton's disk
cache then serves the timed process).

    PYTHONPATH=. python3 examples/sweep_linear.py --m 4,16,64 --out $OUT/linear_sweep.json

``--gemv-rows`` adds the multi-row GEMV (``LinearConfig(kind="gemv", block_m=2/4/8)``) at M <= 8
(:func:`gemv_rows_candidates`) beside the dot candidates (``--dot full``: the 180 of
:func:`candidates`; ``small``: :func:`small_dot_candidates`; ``none``), and prints per (M, shape)
the fastest of all, of the dot kernel and of the multi-row GEMV. Each multi-row GEMV output is
checked against the shipped config's first (a mismatch is recorded as an error). ``--list``
prints the candidate counts per M and exits (no GPU needed). The JSON is rewritten after every
(M, shape), so a run cut short keeps what it timed. On an H200 the command below (1082 timed
configs, 160 kernel variants) took 21 s, compiling included; ``--dot full`` times ~2.5x as many.

    PYTHONPATH=. python3 examples/sweep_linear.py --m 2,4,8 --shapes qkv,o,gate_up,down \
        --gemv-rows --dot small --out $OUT/linear_sweep_rows.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import subprocess
import sys
import time

import torch

from specc.codegen.kernels import linear as L
from specc.search.calibrate import Timer

# Qwen3-8B linear shapes (N, K); --shapes picks from these (bench_steps --linear-sweep reads them too)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
ROT_BYTES = 256 << 20


def candidates(m: int) -> list[L.LinearConfig]:
    bm = max(16, L.m_bucket(m))
    out = []
    for bn, bk, split, stages, tma in itertools.product((16, 32, 64), (128, 256), (1, 2, 3, 4, 6, 8), (3, 4, 5),
                                                         (False, True)):
        if bk == 256 and stages > 4:
            continue
        out.append(L.LinearConfig("dot", block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=4,
                                  num_stages=stages, tma=tma))
    return out


def small_dot_candidates(m: int) -> list[L.LinearConfig]:
    """A 48-config subset of :func:`candidates` around the H200 winners at M = 4 .. 64 (block_n
    64, block_k 128/256, split 1/2, TMA or not; DEFAULT_CONFIGS): for runs that time the
    multi-row GEMV beside the dot kernel within a call's time limit."""
    bm = max(16, L.m_bucket(m))
    return [L.LinearConfig("dot", block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=4,
                           num_stages=stages, tma=tma)
            for bn, bk, split, stages, tma in itertools.product((32, 64), (128, 256), (1, 2, 4), (3, 4),
                                                                 (False, True))]


def gemv_rows_candidates(m: int, k: int | None = None, stages=(1,)) -> list[L.LinearConfig]:
    """Multi-row GEMV configs for M rows (M = 2 .. 8; none otherwise): block_m = the M bucket (one
    row tile) and, from 4 rows, half of it (two row tiles); block_n x block_k x num_warps where
    each thread loads 32 or 64 bytes of weight per iteration (the tuned M = 1 GEMV loads 64) and
    holds at most 128 fp32 accumulators (block_m * block_n * block_k / threads: beyond that
    registers spill); split_k 0 (automatic) and 1 (:func:`shape_candidates` drops the automatic
    one where it resolves to one split); ``stages``: num_stages, which for the multi-row GEMV
    means 1: no prefetch, >= 2: the next weight tile's loads issued before this tile's FMAs
    (Triton's own pipeliner leaves this kernel alone: it has no tl.dot). ``k``: keep block_k
    dividing K (unmasked 16-byte loads)."""
    if not 2 <= m <= L.GEMV_MAX_ROWS:
        return []
    mb = L.m_bucket(m)
    out = []
    for bm in (mb, mb // 2) if mb >= 4 else (mb,):
        for bn, bk, warps in itertools.product((2, 4, 8, 16), (256, 512, 1024), (4, 8)):
            threads = 32 * warps
            if bn * bk * 2 // threads not in (32, 64) or bm * bn * bk > 128 * threads:
                continue
            if k is not None and k % bk:
                continue
            for split, st in itertools.product((0, 1), stages):
                out.append(L.LinearConfig("gemv", block_m=bm, block_n=bn, block_k=bk, split_k=split,
                                          num_warps=warps, num_stages=st))
    return out


def shape_candidates(cands, m: int, n: int, k: int, device) -> list[L.LinearConfig]:
    """The candidates that run at (M, N, K), each launch once: multi-row GEMVs whose block_k
    divides K, and of the configs that resolve to the same split count (split_k 0 = automatic)
    only the first."""
    out, seen = [], set()
    for c in cands:
        if c.kind == "gemv" and k % c.block_k:
            continue
        key = c.replace(split_k=L._split_plan(c, m, n, k, device)[1])
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def large_dot_candidates(m: int) -> list[L.LinearConfig]:
    """GEMM tiles for batched verification's 128-512 rows, where cuBLAS reaches only 0.43-0.64
    of the H100's peak at N = 4096-6144 (docs/benchmarks/run25.md): row tiles of 64-256 (one
    weight pass when a tile holds every row), 64-256 weight rows, split-K 1-4 to fill the SMs,
    4 or 8 warps; kept where a stage's tiles fit ~200 KB of shared memory and the fp32
    accumulator ~128 registers a thread."""
    out = []
    for bm, bn, bk, split, warps, stages, tma in itertools.product(
            (64, 128, 256), (64, 128, 256), (64, 128), (1, 2, 4), (4, 8), (3, 4), (False, True)):
        if bm > max(64, 1 << (m - 1).bit_length()):
            continue
        if (bm + bn) * bk * 2 * stages > 200 * 1024 or bm * bn > 128 * warps * 32:
            continue
        out.append(L.LinearConfig("dot", block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=warps,
                                  num_stages=stages, tma=tma, swap_ab=False))
    return out


def dot_candidates(m: int, which: str) -> list[L.LinearConfig]:
    return {"full": candidates, "small": small_dot_candidates, "large": large_dot_candidates,
            "none": lambda m: []}[which](m)


def all_candidates(m: int, args) -> list[L.LinearConfig]:
    out = dot_candidates(m, args.dot)
    if args.gemv_rows:
        out += gemv_rows_candidates(m, stages=tuple(int(v) for v in args.gemv_stages.split(",")))
    return out


def time_calls(calls, reps: int = 15) -> float:
    """Median us per call of a CUDA graph running every callable once (the calibration timer)."""
    return Timer("cuda", reps=reps)(lambda: [c() for c in calls], inner=len(calls)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="16", help="comma-separated row counts")
    ap.add_argument("--shapes", default="o,down,qkv,gate_up")
    ap.add_argument("--out", default="linear_sweep.json")
    ap.add_argument("--warm", type=int, default=12, help="parallel compile processes first (0: none)")
    ap.add_argument("--gemv-rows", action="store_true",
                    help="also time the multi-row GEMV (kind=gemv, block_m 2/4/8) at M <= 8")
    ap.add_argument("--gemv-stages", default="1,2",
                    help="num_stages of the multi-row GEMV candidates (2: prefetch the next weight tile)")
    ap.add_argument("--dot", default="full", choices=("full", "small", "large", "none"),
                    help="dot candidates: the full 180, a 48-config subset, GEMM tiles for 128-512 rows "
                         "(large: each output checked, cuBLAS timed beside), or none")
    ap.add_argument("--list", action="store_true", help="print the candidate counts per M and exit (no GPU)")
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # "i/n": compile-only worker
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    cands = {m: all_candidates(m, args) for m in ms}
    shapes = [s.strip() for s in args.shapes.split(",")]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    if args.list:
        total = 0
        for m in ms:
            n_dot = sum(c.kind == "dot" for c in cands[m])
            per_shape = {s: len(shape_candidates(cands[m], m, *SHAPES[s], torch.device("cpu"))) for s in shapes}
            total += sum(per_shape.values())
            print(f"M={m}: {len(cands[m])} candidates ({n_dot} dot, {len(cands[m]) - n_dot} gemv-rows); "
                  f"timed per shape (+ the shipped config): {per_shape}")
        print(f"total: {total} timed configs, {len({c for v in cands.values() for c in v})} kernel variants to compile")
        return
    if args.shard:  # compile this share of the variants: one tiny call each
        i, n = (int(v) for v in args.shard.split("/"))
        w = torch.randn(4096, 4096, device="cuda").bfloat16()
        work = [(m, c) for m in ms for c in cands[m]]
        for m, c in work[i::n]:
            try:
                L.linear(torch.randn(m, 4096, device="cuda").bfloat16(), w, config=c)
            except Exception:  # noqa: BLE001 - the timed run records the error
                pass
        torch.cuda.synchronize()
        return
    t0 = time.time()
    if args.warm:
        flags = ["--m", args.m, "--dot", args.dot, "--gemv-stages", args.gemv_stages] + (
            ["--gemv-rows"] if args.gemv_rows else [])
        procs = [subprocess.Popen([sys.executable, __file__, *flags, "--shard", f"{i}/{args.warm}"])
                 for i in range(args.warm)]
        for p in procs:
            p.wait()
        print(f"[linear] compiled {sum(map(len, cands.values()))} variants in {time.time() - t0:.0f} s", flush=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "m": ms, "rows": [], "best": {}, "best_dot": {}, "best_gemv_rows": {}}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for m in ms:
        sweep_m(m, cands[m], shapes, res, save)
    print(f"[linear] done in {time.time() - t0:.0f} s", flush=True)


def _describe(r) -> str:
    c = r["config"]
    extra = (f"st={c['num_stages']} tma={c['tma']} bm={c['block_m']} w={c['num_warps']}" if c["kind"] == "dot" else
             f"bm={c['block_m']} w={c['num_warps']} st={c['num_stages']}")
    return (f"{r['us']:6.1f} us ({r['TBps']:.2f} TB/s) {c['kind']} bn={c['block_n']} bk={c['block_k']} "
            f"split={c['split_k']} {extra}")


def sweep_m(m: int, cands, shapes, res, save=lambda: None) -> None:
    x = torch.randn(m, 12288, device="cuda").bfloat16()
    for name in shapes:
        n, k = SHAPES[name]
        copies = max(1, math.ceil(ROT_BYTES / (n * k * 2)))
        ws = [(torch.randn(n, k, device="cuda") * 0.02).bfloat16() for _ in range(copies)]
        xs = x[:, :k].contiguous()
        nbytes = (n * k + m * k + m * n) * 2

        def t(cfg):
            return time_calls([lambda w=w: L.linear(xs, w, config=cfg) for w in ws])

        shipped = L.get_config(m, n, k)
        t_shipped = t(shipped)
        y_shipped = L.linear(xs, ws[0], config=shipped).float()
        t_cublas = time_calls([lambda w=w: torch.nn.functional.linear(xs, w) for w in ws])
        rows = []
        t1 = time.time()
        for c in shape_candidates(cands, m, n, k, xs.device):
            try:
                if c.kind == "gemv" or c.block_m > 64:  # configs new on the GPU: check the output first
                    y = L.linear(xs, ws[0], config=c).float()
                    err = ((y - y_shipped).norm() / y_shipped.norm()).item()
                    if not err < 1e-2:
                        raise AssertionError(f"output differs from the shipped config's: rel {err:.3g}")
                us = t(c)
            except Exception as e:  # noqa: BLE001
                rows.append({"m": m, "shape": name, "config": dataclasses.asdict(c),
                             "error": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            rows.append({"m": m, "shape": name, "config": dataclasses.asdict(c), "us": us, "TBps": nbytes / us / 1e6})
        ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        res["rows"] += rows + [{"m": m, "shape": name, "config": dataclasses.asdict(shipped), "us": t_shipped,
                                "shipped": True}, {"m": m, "shape": name, "cublas": True, "us": t_cublas}]
        key = f"{m}:{name}"
        res["best"][key] = ok[:5]
        res["best_dot"][key] = [r for r in ok if r["config"]["kind"] == "dot"][:5]
        res["best_gemv_rows"][key] = [r for r in ok if r["config"]["kind"] == "gemv"][:5]
        errors = sum("error" in r for r in rows)
        print(f"[linear] M={m} {name:8s}: shipped {t_shipped:6.1f} us ({nbytes / t_shipped / 1e6:.2f} TB/s); "
              f"cuBLAS {t_cublas:6.1f} us ({2 * m * n * k / t_cublas / 1e6:.0f} TFLOP/s); "
              f"{len(rows)} configs in {time.time() - t1:.0f} s" + (f", {errors} errors" if errors else ""), flush=True)
        for label, top in (("best", ok), ("dot", res["best_dot"][key]), ("gemv-rows", res["best_gemv_rows"][key])):
            if top:
                print(f"[linear]   {label:9s} {_describe(top[0])} ({2 * m * n * k / top[0]['us'] / 1e6:.0f} TFLOP/s, "
                      f"{t_cublas / top[0]['us']:.3f}x cuBLAS)", flush=True)
        save()
        ws.clear()  # (the weights of this shape: freed before the next)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
