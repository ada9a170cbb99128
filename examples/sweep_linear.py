"""Sweep the dot linear kernel's configs at given M over Qwen3-8B layer shapes on the GPU; prints
the fastest config per (M, shape) beside the shipped table's.

Timing as in bench_kernels.py: one CUDA graph calls the op once per rotating copy of its
weights (>= 256 MB of distinct weights, so L2 cannot serve them); median over replays divided by
the calls. Kernel variants are compiled first in ``--warm`` parallel processes (Triton's disk
cache then serves the timed process).

    PYTHONPATH=. python3 examples/sweep_linear.py --m 4,16,64 --out $OUT/linear_sweep.json
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


def time_calls(calls, reps: int = 15) -> float:
    """Median us per call of a CUDA graph running every callable once (the calibration timer)."""
    return Timer("cuda", reps=reps)(lambda: [c() for c in calls], inner=len(calls)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="16", help="comma-separated row counts")
    ap.add_argument("--shapes", default="o,down,qkv,gate_up")
    ap.add_argument("--out", default="linear_sweep.json")
    ap.add_argument("--warm", type=int, default=12, help="parallel compile processes first (0: none)")
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # "i/n": compile-only worker
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    cands = {m: candidates(m) for m in ms}
    shapes = [s.strip() for s in args.shapes.split(",")]
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
        procs = [subprocess.Popen([sys.executable, __file__, "--m", args.m, "--shard", f"{i}/{args.warm}"])
                 for i in range(args.warm)]
        for p in procs:
            p.wait()
        print(f"[linear] compiled {sum(map(len, cands.values()))} variants in {time.time() - t0:.0f} s", flush=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "m": ms, "rows": [], "best": {}}
    for m in ms:
        sweep_m(m, cands[m], shapes, res)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


def sweep_m(m: int, cands, shapes, res) -> None:
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
        rows = []
        for c in cands:
            try:
                us = t(c)
            except Exception as e:  # noqa: BLE001
                rows.append({"m": m, "shape": name, "config": dataclasses.asdict(c),
                             "error": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            rows.append({"m": m, "shape": name, "config": dataclasses.asdict(c), "us": us, "TBps": nbytes / us / 1e6})
        ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        res["rows"] += rows + [{"m": m, "shape": name, "config": dataclasses.asdict(shipped), "us": t_shipped,
                                "shipped": True}]
        res["best"][f"{m}:{name}"] = ok[:5]
        b = ok[0]
        c = b["config"]
        print(f"[linear] M={m} {name:8s}: shipped {t_shipped:6.1f} us ({nbytes / t_shipped / 1e6:.2f} TB/s) | best "
              f"{b['us']:6.1f} us ({b['TBps']:.2f} TB/s) bn={c['block_n']} bk={c['block_k']} split={c['split_k']} "
              f"st={c['num_stages']} tma={c['tma']}", flush=True)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
