"""Batch buckets: what a step costs when fewer requests run than the loop has slots.

Why: a scheduler of C slots that stepped over all of them made a step with 3 requests cost the
C-row step. With buckets (``BatchScheduler(buckets=True)``, the default) the running requests
are moved into the first slots and the step runs over the smallest power of two that holds them
(``DeviceSpeculativeDecoder.set_width``), so its cost follows the requests running. This times
both on the compiled loop at real shapes (``examples/bench_batching.py``'s pair builder: random
weights, DFlash-b16 drafter shapes, DFlash's GSM8K acceptance replayed, the deployment's linear
choice):

- ``occupancy``: n requests (``--running``) of ``--tokens`` new tokens each in a scheduler of
  ``--capacity`` slots, buckets off then on: mean decode step (ms) and decode tokens/s;
- ``drain``: ``--capacity`` requests whose budgets spread from ``--tokens`` / 8 to ``--tokens``
  (they finish at different steps, as requests do), off then on: decode seconds and tokens/s.

``--real TARGET:DRAFTER`` (e.g. ``specc-tiny:specc-tiny-dflash``) runs the drain of a trained
pair with buckets off and on and reports whether every request's tokens are the same (the
widths differ, so the steps' kernels see other row counts: a difference is reported with its
position, not hidden).

    PYTHONPATH=. python3 examples/bench_buckets.py --shapes tiny-qwen3 --capacity 8 --running 2,4 --tokens 16 \\
        --deployment cpu
    PYTHONPATH=. python3 examples/bench_buckets.py --capacity 32 --running 2,4,8,16 --tokens 96 \\
        --deployment h100-bs1 --real specc-tiny:specc-tiny-dflash --out $OUT/buckets.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specc.bench.batched import drive, timed


def batching_example():
    """examples/bench_batching.py as a module (its pair builders)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_batching

    return bench_batching


def timed_drive(loop, prompts, budgets, capacity, buckets, dev) -> dict:
    """One untimed pass, then the timed one: decode steps, their mean time, decode tokens/s."""
    run, seconds, _ = timed(lambda: drive(loop, prompts, budgets, capacity=capacity, buckets=buckets), loop, dev)
    decode_tokens = sum(len(r.tokens) - 1 for r in run.results)
    return {"buckets": buckets, "steps": run.decode_steps, "decode_seconds": run.decode_seconds,
            "step_ms": 1e3 * run.decode_seconds / max(run.decode_steps, 1),
            "decode_tokens_per_s": decode_tokens / run.decode_seconds if run.decode_seconds > 0 else 0.0,
            "seconds": seconds, "tokens": [r.tokens for r in run.results]}


def spread(count: int, tokens: int) -> list[int]:
    """``count`` budgets from tokens / 8 to tokens, evenly spread."""
    low = max(2, tokens // 8)
    return [low + (tokens - low) * i // max(count - 1, 1) for i in range(count)]


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[dict]:
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            pos = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            out.append({"request": i, "position": pos, "off": x[pos:pos + 1], "on": y[pos:pos + 1]})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-8b", help="target shapes (specc.bench.shapes)")
    ap.add_argument("--capacity", type=int, default=32, help="slots of the scheduler")
    ap.add_argument("--running", default="2,4,8,16", help="requests running in the occupancy rows, comma separated")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per request (the drain's largest budget)")
    ap.add_argument("--deployment", default="h200-bs1", help="whose linear choice the steps are built with")
    ap.add_argument("--real", default="", help="TARGET:DRAFTER of a trained pair: drain off and on, tokens compared")
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    bb = batching_example()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    opts = bb.pair_options(a.shapes, a.capacity, a.tokens, a.deployment, [a.real] if a.real else [])
    t0 = time.perf_counter()
    pair = bb.shaped_pairs(opts, dev)[0]
    print(f"built in {time.perf_counter() - t0:.1f} s; linears: {bb.linears_used(opts, dev)}", flush=True)
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "shapes": a.shapes, "deployment": a.deployment, "capacity": a.capacity, "tokens": a.tokens,
              "occupancy": [], "drain": [], "real": None}
    for n in [int(x) for x in a.running.split(",") if x.strip()]:
        for buckets in (False, True):
            row = timed_drive(pair.loop, pair.prompts[:n], a.tokens, a.capacity, buckets, dev)
            row.pop("tokens")
            row["running"] = n
            report["occupancy"].append(row)
            print(f"occupancy {n}/{a.capacity} buckets {'on ' if buckets else 'off'}: {row['step_ms']:.3f} ms/step, "
                  f"{row['decode_tokens_per_s']:.1f} decode tok/s", flush=True)
    budgets = spread(a.capacity, a.tokens)
    for buckets in (False, True):
        row = timed_drive(pair.loop, pair.prompts[:a.capacity], budgets, a.capacity, buckets, dev)
        row.pop("tokens")
        report["drain"].append(row)
        print(f"drain of {a.capacity} buckets {'on ' if buckets else 'off'}: {row['decode_seconds']:.3f} s decode, "
              f"{row['steps']} steps, {row['decode_tokens_per_s']:.1f} decode tok/s", flush=True)
    if a.real:
        real = bb.real_pairs(opts, dev)[0]
        budgets = spread(a.capacity, a.tokens)
        rows = [timed_drive(real.loop, real.prompts[:a.capacity], budgets, a.capacity, b, dev) for b in (False, True)]
        diffs = first_difference(rows[0]["tokens"], rows[1]["tokens"])
        report["real"] = {"pair": a.real, "budgets": budgets, "differences": diffs,
                          "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows]}
        print(f"real {a.real} drain: off {rows[0]['decode_tokens_per_s']:.1f}, on {rows[1]['decode_tokens_per_s']:.1f} "
              f"decode tok/s; requests with other tokens: {len(diffs)} {diffs[:3]}", flush=True)
    report["graphs"] = pair.loop.graph_stats()
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
