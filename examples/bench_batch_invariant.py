#!/usr/bin/env python3
"""The batch-invariant kernel mode: what it costs, and whether a row's logits alone equal its logits in a batch.

    PYTHONPATH=. python3 examples/bench_batch_invariant.py --out $OUT/bi.json
    PYTHONPATH=. python3 examples/bench_batch_invariant.py --smoke --out /tmp/bi.json   # tiny shapes (CUDA)

``SPECC_BATCH_INVARIANT`` (``specc.codegen.kernels.batch_invariant``) launches every kernel with
one configuration whatever the rows beside a request (docs/kernels.md). For the compiled
Qwen3-8B target step (random weights, context ``--context``), in one process, default mode and
batch-invariant mode:

1. Cost: CUDA-graph medians of the step at B = 1 and ``--batch`` x Q = 1 (AR) and 16 (verify),
   and each mode's time over the default's.
2. Invariance: ``--rows`` requests (different token ids, different cache lengths) run as one batch
   and each alone (batch 1, same cache contents); per mode, whether every row's logits equal its
   logits alone bit for bit, and the largest difference. The default mode's answer is the control:
   it is expected to differ somewhere (other tiles, split-K and attention plans by row count).

One JSON line per measurement on stdout; the whole record in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_bf12 import replay_ms  # noqa: E402  (each replay's milliseconds)


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def graphed_ms(step, ids, pos, cl, reps: int) -> float:
    """Median ms of CUDA-graph replays of ``step(ids, pos, cl)``, after two eager warm-up calls."""
    for _ in range(2):
        step(ids, pos, cl)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(ids, pos, cl)
    ms = statistics.median(replay_ms(g, reps))
    del g
    return ms


def fill_caches(step, rows: int, lengths: list[int], vocab: int, dev, seed: int) -> None:
    """Give each row ``lengths[b]`` cached positions of its own (a prefill of random ids, one row
    at a time, so the cache contents do not depend on the mode's batch configs)."""
    from specc.runtime.state import slot_view

    gen = torch.Generator(device=dev).manual_seed(seed)
    step.setup_caches(rows, max(lengths) + 64)
    for b, n in enumerate(lengths):
        ids = torch.randint(0, vocab, (1, n), device=dev, generator=gen)
        with slot_view(step, b):
            step(ids, torch.arange(n, device=dev)[None], torch.zeros(1, dtype=torch.long, device=dev))


def invariance_row(step, cfg, args, dev, q: int) -> dict:
    """Row b of one batched call against the same row alone (a batch-1 call on row b's cache)."""
    rows = args.rows
    lengths = [args.context - 37 * b for b in range(rows)]  # different cache lengths per row
    gen = torch.Generator(device=dev).manual_seed(11)
    ids = torch.randint(0, cfg["vocab_size"], (rows, q), device=dev, generator=gen)
    cl = torch.tensor(lengths, device=dev)
    pos = cl[:, None] + torch.arange(q, device=dev)[None]
    from specc.runtime.state import slot_view

    with torch.inference_mode():
        fill_caches(step, rows, lengths, cfg["vocab_size"], dev, seed=3)
        batched = step(ids, pos, cl)
        batched = (batched[0] if isinstance(batched, tuple) else batched).float().clone()
        worst, equal = 0.0, True
        for b in range(rows):
            fill_caches(step, rows, lengths, cfg["vocab_size"], dev, seed=3)  # the batched call wrote past each row
            with slot_view(step, b):
                alone = step(ids[b:b + 1], pos[b:b + 1], cl[b:b + 1])
            alone = (alone[0] if isinstance(alone, tuple) else alone).float()
            equal &= bool(torch.equal(alone[0], batched[b]))
            worst = max(worst, float((alone[0] - batched[b]).abs().max()))
    return {"rows": rows, "Q": q, "lengths": lengths, "rows_equal_alone": equal, "max_abs_diff": worst}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=16, help="the batched steps' rows (default 16)")
    ap.add_argument("--rows", type=int, default=3, help="requests of the invariance check (default 3)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: checks that everything runs")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_batch_invariant.py needs a CUDA GPU")
    from specc.bench.shapes import QWEN3_8B, build_causal, tiny
    from specc.codegen.build import build_steps
    from specc.codegen.kernels.batch_invariant import batch_invariant
    from specc.codegen.kernels.pdl import launch_mode
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate

    dev = torch.device("cuda")
    cfg = tiny(QWEN3_8B) if args.smoke else QWEN3_8B
    if args.smoke:
        args.context = 128
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "launch": launch_mode(dev), "argv": sys.argv[1:]}
    emit(info)
    t0 = time.time()
    target = build_causal(cfg, torch.bfloat16, dev, seed=1)
    target.setup_caches(1, 16)
    step = instantiate(build_steps(target, None, DEFAULT_PIPELINE).emitted["target"])
    gen = torch.Generator(device=dev).manual_seed(5)
    record = {"info": info, "steps": [], "invariance": []}
    for invariant in (False, True):
        with batch_invariant(invariant), torch.inference_mode():
            for bsz in sorted({1, args.batch}):
                step.setup_caches(bsz, args.context + 128)
                for q in (1, 16):
                    ids = torch.randint(0, cfg["vocab_size"], (bsz, q), device=dev, generator=gen)
                    pos = torch.arange(args.context, args.context + q, device=dev)[None].expand(bsz, q).contiguous()
                    cl = torch.full((bsz,), args.context, device=dev)
                    rec = {"kind": "step", "batch_invariant": invariant, "B": bsz, "Q": q, "context": args.context,
                           "ms": graphed_ms(step, ids, pos, cl, args.reps)}
                    record["steps"].append(rec)
                    emit(rec)
        with batch_invariant(invariant):
            for q in (1, 16):
                rec = {"kind": "invariance", "batch_invariant": invariant,
                       **invariance_row(step, cfg, args, dev, q)}
                record["invariance"].append(rec)
                emit(rec)
    base = {(r["B"], r["Q"]): r["ms"] for r in record["steps"] if not r["batch_invariant"]}
    for r in record["steps"]:
        r["over_default"] = r["ms"] / base[r["B"], r["Q"]]
    record["wall_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print("\nsteps (ms, median of graph replays):")
    for r in record["steps"]:
        print(f"  B={r['B']:2d} Q={r['Q']:2d} {'invariant' if r['batch_invariant'] else 'default  '}: "
              f"{r['ms']:.3f} ms  x{r['over_default']:.3f}")
    for r in record["invariance"]:
        print(f"  {'invariant' if r['batch_invariant'] else 'default  '} Q={r['Q']:2d}: rows alone == in the batch: "
              f"{r['rows_equal_alone']} (max |diff| {r['max_abs_diff']:.3g})")


if __name__ == "__main__":
    main()
