"""The compiled batched loop's packed (ragged) verify against its dense verify at the same k.

Why: the batching choice prices per-request k as a packed verify of sum_b (k_b + 1) tokens and
the goodput rule's one k as a dense [B, k + 1] verify. When every row gets the same k the two do
the same work but for the packing (gathers, scatters, the ragged attention, the CUDA-graph
bucket's padding tokens), so timing both at one k isolates what the packing costs, which is what
decides whether per-request k can ever pay (run 23: k = 9 for 32 rows, packed, took 16.1 ms
where the model priced 11.2 ms).

Builds one pair as ``examples/bench_batching.py`` does (``--shapes`` target + DFlash-b16 drafter
shapes, random weights, DFlash's GSM8K acceptance replayed, the deployment's linear choice),
then for each k of ``--ks`` drives ``--batch`` requests through a ``BatchScheduler`` with a
draft-length rule that gives every row that k, once verified dense (a rule without
``ragged_seconds``) and once packed (with one): mean decode step (ms) and tokens per step.
For the ks of ``--profile``, one more pass of each under ``torch.profiler`` gives the decode
steps' kernels by name (``specc.bench.gaps.kernels_in_ranges``).

    PYTHONPATH=. python3 examples/bench_packed_step.py --shapes tiny-qwen3 --batch 4 --ks 3,7 --tokens 16 \\
        --profile 3 --deployment cpu
    PYTHONPATH=. python3 examples/bench_packed_step.py --batch 32 --ks 9,11,15 --profile 9,11 \\
        --deployment h100-bs1 --out $OUT/packed32.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specc.bench.batched import run_batch
from specc.runtime.adaptive import GoodputDraftLength


def batching_example():
    """examples/bench_batching.py as a module (its pair builders)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_batching

    return bench_batching


class SameK(GoodputDraftLength):
    """A draft-length rule that gives every row ``k``: dense (``packed=False``: no
    ``ragged_seconds``, so the scheduler asks one k for the batch) or packed."""

    def __init__(self, k: int, k_max: int, packed: bool):
        super().__init__(lambda rows, kk: 1.0, k_max, ragged_seconds=(lambda rows, t: 1.0) if packed else None)
        self.k = int(k)

    def choose(self, alphas, caps, rows):
        return self.k

    def choose_rows(self, alphas, caps, rows):
        return [self.k] * len(alphas)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-8b", help="target shapes (specc.bench.shapes)")
    ap.add_argument("--batch", type=int, default=32, help="requests decoded together")
    ap.add_argument("--ks", default="9,11,15", help="drafts per row, comma separated")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per request")
    ap.add_argument("--deployment", default="h200-bs1", help="whose linear choice the steps are built with")
    ap.add_argument("--profile", default="", help="the ks whose passes are also profiled by kernel")
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    bb = batching_example()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    opts = bb.pair_options(a.shapes, a.batch, a.tokens, a.deployment)
    t0 = time.perf_counter()
    pair = bb.shaped_pairs(opts, dev)[0]
    print(f"built in {time.perf_counter() - t0:.1f} s; linears: {bb.linears_used(opts, dev)}", flush=True)
    loop, prompts = pair.loop, pair.prompts[: a.batch]
    profiled = {int(k) for k in a.profile.split(",") if k.strip()}
    rows = []
    for k in [int(x) for x in a.ks.split(",")]:
        for packed in (False, True):
            rule = SameK(k, pair.k, packed)
            run, _, _ = run_batch(loop, prompts, a.tokens, dev, rule)
            steps = sum(r.stats.steps for r in run.results)
            row = {"k": k, "packed": packed, "batch": a.batch, "steps": run.decode_steps,
                   "step_ms": 1e3 * run.decode_seconds / max(run.decode_steps, 1),
                   "tokens_per_step": sum(len(r.tokens) - 1 for r in run.results) / max(steps, 1)}
            what = "packed" if packed else "dense"
            if k in profiled:
                kp = bb.kernel_profile(loop, prompts, a.tokens, dev, rule)
                kp.pop("gaps_with_stacks", None)
                row["kernels"] = kp
                print(f"  k={k} {what}: {kp['what']}s {kp['kernel_us'] / 1e3:.2f} ms in {kp['range_ms']:.2f} ms, "
                      f"{kp['launches']:.0f} launches; " + ", ".join(
                          f"{r['kernel'][:60]} {r['us_per_range']:.0f} us" for r in kp["top"][:14]), flush=True)
            print(f"k={k} {what}: {row['step_ms']:.3f} ms/step, {row['tokens_per_step']:.2f} tokens/step", flush=True)
            rows.append(row)
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "shapes": a.shapes, "deployment": a.deployment, "tokens": a.tokens, "rows": rows,
              "graphs": loop.graph_stats()}
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
