"""Sweep the attention kernel's launch plan (row block, KV splits, fused or separate merge) at
Qwen3-8B head shapes on the GPU, at batch 1 or more (``--batch``); prints the fastest plan per
(B, Q, cache capacity) beside what ``launch_plan`` picks today.

Each figure is the median of CUDA-graph replays of 36 calls over 36 distinct KV caches (one per
layer, as in a step: the caches do not fit in L2), divided by 36. The caches hold ``capacity -
128`` committed tokens, as the step benchmarks do (context 1024 in a 1152-slot cache).

    PYTHONPATH=. python3 examples/sweep_attention.py --out $OUT/attention_sweep.json
    PYTHONPATH=. python3 examples/sweep_attention.py --batch 16,32 --q 4,8,16 --capacity 1152 --out $OUT/attention_sweep_batched.json

Batch 1's fastest plans go to ``best`` (keyed ``Q@capacity``, what ``profile_step.py
--attention-sweep`` reads), larger batches' to ``best_batched`` (keyed ``BxQ@capacity``). At a
batch of 16 x 16 query tokens the step profile (docs/benchmarks/h200-run6.md) spent 1085 us in the
split kernel and 877 us in the separate merge per step: the plan rule (``pick_splits``, tuned at
bs1) is what this decides.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specc.codegen.kernels import attention as A
from specc.search.calibrate import Timer

HQ, HKV, D, LAYERS = 32, 8, 128, 36


BS1_SPLITS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
BATCHED_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)  # at B >= 8 the programs already fill the SMs


def candidates(num_q: int, bsz: int = 1):
    rows = num_q * HQ // HKV
    for bm in (16, 32, 64):
        if bm > max(16, A.next_pow2(rows)):
            continue
        for splits in (BS1_SPLITS if bsz == 1 else BATCHED_SPLITS):
            for fused in (False, True):
                if fused and splits == 1:
                    continue
                yield {"block_m": bm, "num_splits": splits, "fused_merge": fused}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="attention_sweep.json")
    ap.add_argument("--q", default="1,4,8,16,32,64")
    ap.add_argument("--capacity", default="1152,4224")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batch", default="1", help="batch sizes, comma separated (default 1)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop starting new points after this long (the JSON is rewritten after every point)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer = Timer("cuda", reps=args.reps)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "heads": [HQ, HKV, D], "rows": []}
    best, best_batched = {}, {}
    res["best"], res["best_batched"] = best, best_batched
    t0 = time.monotonic()

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for bsz, cap in ((int(b), int(c)) for b in args.batch.split(",") for c in args.capacity.split(",")):
        ctx = cap - 128
        caches = [(torch.randn(bsz, HKV, cap, D, device=dev).bfloat16(),
                   torch.randn(bsz, HKV, cap, D, device=dev).bfloat16()) for _ in range(LAYERS)]
        cl = torch.full((bsz,), ctx, device=dev)
        for num_q in (int(v) for v in args.q.split(",")):
            if args.max_seconds is not None and time.monotonic() - t0 > args.max_seconds:
                print(f"[attention] stopping after {time.monotonic() - t0:.0f} s (--max-seconds)", flush=True)
                break
            q = torch.randn(bsz, num_q, HQ, D, device=dev).bfloat16()
            default = A.launch_plan(bsz, num_q, HQ, HKV, D, cap, dev)

            def run(plan):
                for ck, cv in caches:
                    A.attention(q, ck, cv, cl, num_q, "causal", D ** -0.5, **plan)

            base = {"block_m": default["block_m"], "num_splits": default["num_splits"],
                    "fused_merge": default["fused_merge"]}
            t_default = timer(lambda: run(base), inner=LAYERS) * 1e6
            rows = []
            for plan in candidates(num_q, bsz):
                try:
                    us = timer(lambda: run(plan), inner=LAYERS) * 1e6
                except Exception as e:  # noqa: BLE001 - a plan that does not compile is a data point
                    rows.append({"B": bsz, "capacity": cap, "Q": num_q, **plan,
                                 "error": f"{type(e).__name__}: {str(e)[:200]}"})
                    continue
                rows.append({"B": bsz, "capacity": cap, "Q": num_q, **plan, "us": us})
            ok = [r for r in rows if "us" in r]
            top = min(ok, key=lambda r: r["us"])
            pick = {k: top[k] for k in ("block_m", "num_splits", "fused_merge", "us")}
            if bsz == 1:
                best[f"{num_q}@{cap}"] = pick
            else:
                best_batched[f"{bsz}x{num_q}@{cap}"] = {**pick, "default_us": t_default}
            res["rows"] += rows + [{"B": bsz, "capacity": cap, "Q": num_q, **base, "us": t_default, "default": True}]
            print(f"[attention] B={bsz} cap={cap} Q={num_q:3d}: default {t_default:6.2f} us {base} | best {top['us']:6.2f} us "
                  f"bm={top['block_m']} splits={top['num_splits']} fused={top['fused_merge']}", flush=True)
            save()
        del caches
        torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
