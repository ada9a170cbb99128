#!/usr/bin/env python3
"""Fused bf12 decode + GEMV/GEMM against cuBLAS bf16 on Qwen3-8B shapes (one GPU run).

    PYTHONPATH=. python3 examples/bench_bf12.py --out $OUT/bf12.json

For each weight shape (qkv 4096->6144, o 4096->4096, gate_up 4096->24576, down 12288->4096,
lm_head 4096->151936) and M in 1, 2, 4, 8, 16, 32, 64:

* packs a random N(0, 0.02) bf16 weight (a realistic exponent spread; the *timing* does not
  depend on the values, the escape rate does) and checks unpack() is bit-exact;
* checks every kernel config in bf16 against x.float() @ W.float().T (relative error, beside
  cuBLAS's own);
* times cuBLAS (F.linear, bf16) and each config as the median of CUDA-graph replays, each graph
  a sequence of calls rotating over enough weight copies that the 50 MB L2 cannot serve them;
* prints a table (best config per shape and M), the per-layer sums (qkv + o + gate_up + down)
  at M = 1 and M = 16, and a DEFAULT_CONFIGS table to paste into linear_bf12.py; writes JSON.

Kernels are compiled first in parallel worker processes (they fill Triton's on-disk cache).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 24576), ("down", 12288, 4096),
          ("lm_head", 4096, 151936)]  # (name, K, N)
LAYER = ("qkv", "o", "gate_up", "down")
MS = (1, 2, 4, 8, 16, 32, 64)
ROTATE_BYTES = 320 << 20  # weight bytes per rotation, >> 50 MB of L2 (also for the packed copies)
MIN_CALLS = 48  # kernel calls per graph replay
REPLAYS = 15


def candidates(m: int, quick: bool = False):
    from specc.codegen.kernels.linear_bf12 import Bf12Config as C

    def fma(bm, bn, bj, split=1, warps=4, asm=True, pf=True):
        return C("fma", block_m=bm, block_n=bn, block_j=bj, split_k=split, num_warps=warps,
                 num_stages=1, use_asm=asm, prefetch=pf)

    def dot(bm, bn, bj, split=1, warps=4, stages=3, swap=False):
        return C("dot", block_m=bm, block_n=bn, block_j=bj, split_k=split, num_warps=warps,
                 num_stages=stages, swap_ab=swap)

    if m == 1:
        c = [fma(1, 16, 64), fma(1, 16, 32), fma(1, 32, 32), fma(1, 8, 64), fma(1, 16, 128, warps=8),
             fma(1, 32, 64, warps=8), fma(1, 16, 64, pf=False),
             fma(1, 16, 64, split=2), fma(1, 32, 32, split=2), fma(1, 16, 64, asm=False), fma(1, 8, 32),
             fma(1, 32, 16)]
    elif m in (2, 4):
        c = [fma(m, 16, 64), fma(m, 16, 32), fma(m, 8, 64), dot(16, 32, 4), dot(16, 64, 4), dot(16, 64, 8)]
    elif m in (8, 16):
        c = [dot(16, 32, 4), dot(16, 64, 4), dot(16, 64, 8), dot(16, 128, 4, warps=8), dot(16, 64, 4, swap=True),
             dot(16, 32, 8), dot(16, 64, 4, split=2), dot(16, 64, 4, stages=4), dot(16, 128, 8, warps=8, swap=True),
             dot(16, 16, 8), dot(16, 32, 4, split=2)]
    else:
        c = [dot(m, 32, 4), dot(m, 64, 4), dot(m, 64, 8, warps=8), dot(m, 64, 4, swap=True),
             dot(m, 64, 4, split=2), dot(m, 32, 8)]
        if m == 32:
            c += [dot(m, 128, 4, warps=8), dot(m, 128, 4, warps=8, swap=True)]
        else:
            c += [dot(m, 64, 8, warps=8, swap=True)]
    return c[:3] if quick else c


def _compile_worker(jobs):
    """Compile (and run once, small) each (m, k, config): fills Triton's on-disk cache."""
    import torch

    from specc.codegen.kernels.linear_bf12 import linear_bf12
    from specc.formats import pack_bf16_12bit

    torch.cuda.init()
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = {}
    for m, k, cfg in jobs:
        if k not in cache:
            w = (torch.randn(256, k, device="cuda", generator=g) * 0.02).bfloat16()
            cache[k] = pack_bf16_12bit(w)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        try:
            linear_bf12(x, cache[k], config=cfg)
        except Exception as e:  # reported again (with traceback) by the main process
            print(f"compile failed: m={m} {cfg}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    torch.cuda.synchronize()
    return len(jobs)


def precompile(ms, ks, quick, workers):
    jobs = [(m, k, c) for m in ms for k in sorted(set(ks)) for c in candidates(m, quick)]
    # K only matters through divisibility (all Qwen3-8B K are multiples of 256): one K suffices,
    # except that split-K's effective split depends on K; compile for each distinct K anyway.
    workers = max(1, min(workers, len(jobs)))
    chunks = [jobs[i::workers] for i in range(workers)]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        n = sum(pool.map(_compile_worker, chunks))
    print(f"precompiled {n} kernel variants in {time.time() - t0:.1f} s with {workers} processes",
          flush=True)


def graph_time_us(calls) -> float:
    """Median time of one call (us) over CUDA-graph replays of ``calls`` repeated."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    reps = max(1, math.ceil(MIN_CALLS / len(calls)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for c in calls:
                c()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(REPLAYS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / (reps * len(calls)))
    del g
    return statistics.median(ts)


def wall_time_us(calls) -> float:
    t0 = time.perf_counter()
    for c in calls:
        c()
    return (time.perf_counter() - t0) * 1e6 / len(calls)


def rel_err(y, ref) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


def cfg_str(c) -> str:
    s = f"{c.kind} m{c.block_m} n{c.block_n} j{c.block_j}"
    if c.split_k > 1:
        s += f" sk{c.split_k}"
    s += f" w{c.num_warps} s{c.num_stages}"
    if c.swap_ab:
        s += " swap"
    if not c.use_asm:
        s += " noasm"
    if c.kind == "fma" and not c.prefetch:
        s += " nopf"
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bf12.json")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--quick", action="store_true", help="3 configs per M")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script's logic on the CPU (Triton interpreter, tiny shapes, fp32)")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    if smoke:  # tiny shapes, Triton interpreter, fp32 activations, wall-clock "timing"
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import triton

    from specc.codegen.kernels import linear_bf12 as L
    from specc.formats import Packed12, pack_bf16_12bit

    global ROTATE_BYTES, MIN_CALLS, REPLAYS
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    if smoke:
        dev, act = torch.device("cpu"), torch.float32
        shapes = [(nm, 16 * (k // 1024) + 32, n // 1024 + 8) for nm, k, n in shapes]
        ROTATE_BYTES, MIN_CALLS, REPLAYS = 2000, 2, 1
        timer, sync, gpu_name, sms = wall_time_us, (lambda: None), "cpu-smoke", 0
        args.no_precompile = True
    else:
        assert torch.cuda.is_available(), "needs a CUDA GPU"
        dev, act, timer, sync = torch.device("cuda"), torch.bfloat16, graph_time_us, torch.cuda.synchronize
        props = torch.cuda.get_device_properties(dev)
        gpu_name, sms = props.name, props.multi_processor_count
    info = {"gpu": gpu_name, "sms": sms, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv,
            "weights": "random normal(0, 0.02) bf16 (realistic exponent spread; not a checkpoint)",
            "timing": f"median of {REPLAYS} CUDA-graph replays, >= {MIN_CALLS} calls each, "
                      f"rotating over weight copies of >= {ROTATE_BYTES >> 20} MB"}
    print(json.dumps(info, indent=1), flush=True)
    if not args.no_precompile:
        precompile(ms, [4096], args.quick, args.workers)  # K matters only via divisibility
    # one workspace big enough for every split-K call (allocated outside graph capture)
    L._workspace(dev, 64 * max(n for _, _, n in shapes), 1 << 16)

    results = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, k, n in shapes:
        w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).bfloat16()
        t0 = time.time()
        p = pack_bf16_12bit(w)
        sync()
        t_pack = time.time() - t0
        assert torch.equal(p.unpack().view(torch.int16), w.view(torch.int16)), "unpack not bit-exact"
        copies = max(1, math.ceil(ROTATE_BYTES / p.nbytes))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        ps = [p] + [Packed12(sm=p.sm.clone(), ex=p.ex.clone(), base=p.base.clone(),
                             esc_idx=p.esc_idx.clone(), esc_val=p.esc_val.clone(), shape=p.shape,
                             base_mode=p.base_mode) for _ in range(copies - 1)]
        wf = w.float()
        print(f"\n{name}: [{n}, {k}] packed {p.nbytes / 1e6:.1f} MB ({p.bits_per_weight:.3f} bits/w), "
              f"escape rate {p.escape_rate:.2e}, pack {t_pack:.2f} s, {copies} copies", flush=True)
        for m in ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(act)
            ref = x.float() @ wf.T
            ys = [torch.empty(m, n, device=dev, dtype=act) for _ in range(copies)]
            e_cub = rel_err(F.linear(x, w.to(act)), ref)
            t_cub = timer([lambda i=i: F.linear(x, ws[i].to(act)) for i in range(copies)])
            row = {"shape": name, "N": n, "K": k, "M": m, "cublas_us": t_cub, "cublas_rel_err": e_cub,
                   "bf16_TBps": 2 * n * k / t_cub / 1e6, "packed_bytes": p.nbytes,
                   "escape_rate": p.escape_rate, "configs": []}
            for cfg in candidates(m, args.quick):
                rec = {"config": cfg_str(cfg), "params": cfg.__dict__.copy()}
                try:
                    out = torch.full((m, n), float("nan"), device=dev, dtype=act)
                    L.linear_bf12(x, p, config=cfg, out=out)  # poisoned output: all must be written
                    err = rel_err(out, ref)
                    rec["rel_err"] = err
                    ok = math.isfinite(err) and err < max(4 * e_cub, 1e-2 if not smoke else 1e-5)
                    rec["ok"] = ok
                    if ok:
                        rec["us"] = timer([lambda i=i: L.linear_bf12(x, ps[i], config=cfg, out=ys[i])
                                                   for i in range(copies)])
                except Exception as e:  # noqa: BLE001 - report and go on with the sweep
                    rec["ok"] = False
                    rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                row["configs"].append(rec)
            good = [c for c in row["configs"] if c.get("ok")]
            if good:
                b = min(good, key=lambda c: c["us"])
                row.update(best_config=b["config"], best_params=b["params"], bf12_us=b["us"],
                           bf12_rel_err=b["rel_err"], speedup=t_cub / b["us"],
                           packed_TBps=p.nbytes / b["us"] / 1e6,
                           bf16_equiv_TBps=2 * n * k / b["us"] / 1e6)
            results.append(row)
            cs = "  ".join(f"{c['config']}: " + (f"{c['us']:.1f}" if c.get("ok") else
                                                  f"FAIL({c.get('error', c.get('rel_err'))})")
                           for c in row["configs"])
            print(f"  M={m:2d} cuBLAS {t_cub:8.1f} us | {cs}", flush=True)
        ws = ps = w = wf = None  # free this shape's copies
        if not smoke:
            torch.cuda.empty_cache()

    # ---- summary -------------------------------------------------------------------------
    lines = ["| shape | N x K | M | cuBLAS us | bf12 us | speedup | packed TB/s | bf16 TB/s (cuBLAS) "
             "| bf12 as bf16-equiv TB/s | rel err bf12 / cuBLAS | best config |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "bf12_us" not in r:
            lines.append(f"| {r['shape']} | {r['N']}x{r['K']} | {r['M']} | {r['cublas_us']:.1f} | FAIL | | | | | | |")
            continue
        lines.append(f"| {r['shape']} | {r['N']}x{r['K']} | {r['M']} | {r['cublas_us']:.1f} | {r['bf12_us']:.1f} "
                     f"| {r['speedup']:.3f}x | {r['packed_TBps']:.2f} | {r['bf16_TBps']:.2f} "
                     f"| {r['bf16_equiv_TBps']:.2f} | {r['bf12_rel_err']:.1e} / {r['cublas_rel_err']:.1e} "
                     f"| {r['best_config']} |")
    sums = {}
    for m in ms:
        for group, names in (("layer", LAYER), ("layer+lm_head", LAYER + ("lm_head",))):
            rs = [r for r in results if r["M"] == m and r["shape"] in names and "bf12_us" in r]
            if len(rs) == len(names):
                c, b = sum(r["cublas_us"] for r in rs), sum(r["bf12_us"] for r in rs)
                sums[f"{group}@M={m}"] = {"cublas_us": c, "bf12_us": b, "speedup": c / b}
    lines.append("")
    lines.append("| sum | cuBLAS us | bf12 us | speedup |")
    lines.append("| --- | --- | --- | --- |")
    for key, s in sums.items():
        lines.append(f"| {key} | {s['cublas_us']:.1f} | {s['bf12_us']:.1f} | {s['speedup']:.3f}x |")
    table = "\n".join(lines)
    table_cfg = ["DEFAULT_CONFIGS = {"]
    for r in results:
        if "best_params" in r:
            bp = r["best_params"]
            args_ = ", ".join(f"{k}={v!r}" for k, v in bp.items() if k != "esc_block")
            table_cfg.append(f"    ({r['M']}, {r['N']}, {r['K']}): Bf12Config({args_}),")
    table_cfg.append("}")
    print("\n" + table)
    print("\n" + "\n".join(table_cfg))
    for key in ("layer@M=1", "layer@M=16"):
        if key in sums:
            print(f"{key}: cuBLAS {sums[key]['cublas_us']:.1f} us, bf12 {sums[key]['bf12_us']:.1f} us, "
                  f"speedup {sums[key]['speedup']:.3f}x")
    out = {"info": info, "results": results, "sums": sums, "table_md": table,
           "default_configs_py": "\n".join(table_cfg)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
