"""Predicted vs measured step times for a range of ``kernel_floor_s`` values, from the JSON of
``examples/bench_cost_model.py --nodes`` (every node's launches and memory / compute / launch
terms, predicted with the floor at 0): how the deployment's kernel floor moves each step's error.

    python3 examples/fit_kernel_floor.py cm-specc-tiny.json cm-qwen3-8b.json --floors 0,2e-6,4e-6
    python3 examples/fit_kernel_floor.py cm-*.json --floor-from kernel-floor.json   # the microbenchmark's floor

A node's time with floor f is max(t_memory, t_compute, launches x f) + t_launch (the cost model's
rule, specc.search.cost_model); rows were predicted at f = 0, so t_launch holds no top-up yet.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def step_time(nodes, floor: float) -> float:
    return sum(max(t_mem, t_comp, launches * floor) + t_launch for _, launches, t_mem, t_comp, t_launch in nodes)


def errors(files: list[Path], floor: float) -> list[dict]:
    out = []
    for f in files:
        data = json.loads(f.read_text())
        for r in data["rows"]:
            if "nodes" not in r:
                raise SystemExit(f"{f}: rows without per-node terms (run bench_cost_model.py with --nodes)")
            pred = step_time(r["nodes"], floor) + (r["predicted_s"] - step_time(r["nodes"], 0.0))
            out.append({"file": f.name, "B": r["B"], "Q": r["Q"], "measured_s": r["measured_s"], "predicted_s": pred,
                        "error": pred / r["measured_s"] - 1})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--floors", default="0,1e-6,2e-6,3e-6,4e-6,5e-6,6e-6")
    ap.add_argument("--floor-from", type=Path, help="a measure_kernel_floor JSON: its kernel_floor_s is tried too")
    args = ap.parse_args(argv)
    floors = [float(x) for x in args.floors.split(",") if x]
    if args.floor_from:
        floors.append(json.loads(args.floor_from.read_text())["kernel_floor_s"])
    for floor in floors:
        rows = errors(args.files, floor)
        errs = [abs(r["error"]) for r in rows]
        print(f"kernel_floor_s {floor * 1e6:6.2f} us: median |error| {statistics.median(errs):6.1%}, max {max(errs):6.1%}")
        for r in rows:
            print(f"    {r['file']:28s} B={r['B']:<3d} Q={r['Q']:<3d} measured {r['measured_s'] * 1e3:8.3f} ms  "
                  f"predicted {r['predicted_s'] * 1e3:8.3f} ms  {r['error']:+7.1%}")


if __name__ == "__main__":
    main()
