"""Would a per-kernel floor fix the cost model's launch-bound regime? Predicted vs measured step
times for a range of floors, from the JSON of ``examples/bench_cost_model.py --nodes`` (every
node's launches and memory / compute / launch terms as the cost model prices them).

    PYTHONPATH=. python3 examples/fit_kernel_floor.py --measure --out kernel-floor.json   # CUDA: the microbenchmark
    python3 examples/fit_kernel_floor.py cm-specc-tiny.json cm-qwen3-8b.json --floors 0,2e-6,4e-6
    python3 examples/fit_kernel_floor.py cm-*.json --floor-from kernel-floor.json   # the microbenchmark's floor

The rule tried: a node's time with floor f is max(t_memory, t_compute, launches x f) + t_launch.
On the H200 no single f brings specc-tiny (26M), its v1 shapes (8M), Qwen3-0.6B and Qwen3-8B
steps within 15% together (docs/benchmarks/cost-model-small-h200.md), so the cost model has no
such term yet.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def measure_kernel_floor(device: str, n: int, timer, shapes=((256, 256), (512, 1536), (1024, 1024))
                         ) -> dict[str, Any]:
    """The shortest time of a kernel that reads real weights (``kernel_floor_s``): n dependent
    GEMVs ``x = W @ x`` of a small weight in one CUDA graph, per kernel, minus the graph node
    overhead of ``specc.search.calibrate.measure_launch``'s near-empty kernels; the median over
    small shapes (their bytes take well under a microsecond at HBM speed: what is left is the
    floor). CPU: 0."""
    import torch

    from specc.search.calibrate import measure_launch

    if device != "cuda":
        return {"kernel_floor_s": 0.0, "per_shape": []}
    launch = measure_launch(device, n, timer)
    rows = []
    for rows_n, cols in shapes:
        w = torch.randn(rows_n, cols, device=device, dtype=torch.bfloat16) * 0.01
        w2 = torch.randn(cols, rows_n, device=device, dtype=torch.bfloat16) * 0.01
        x = torch.randn(cols, device=device, dtype=torch.bfloat16)

        def chain():
            y = x
            for _ in range(n // 2):
                y = torch.mv(w2, torch.mv(w, y))
            return y

        per_kernel = timer(chain, inner=2 * (n // 2))
        nbytes = 2 * rows_n * cols
        rows.append({"shape": [rows_n, cols], "per_kernel_s": per_kernel, "bytes": nbytes})
    floor = max(0.0, statistics.median(r["per_kernel_s"] for r in rows) - launch["graph_node_overhead_s"])
    return {"kernel_floor_s": floor, "graph_node_overhead_s": launch["graph_node_overhead_s"], "per_shape": rows}


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
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--measure", action="store_true", help="run the kernel-floor microbenchmark (CUDA) and write --out")
    ap.add_argument("--out", type=Path, default=Path("kernel-floor.json"))
    ap.add_argument("--floors", default="0,1e-6,2e-6,3e-6,4e-6,5e-6,6e-6")
    ap.add_argument("--floor-from", type=Path, help="a measure_kernel_floor JSON: its kernel_floor_s is tried too")
    args = ap.parse_args(argv)
    if args.measure:
        from specc.search.calibrate import Timer

        result = measure_kernel_floor("cuda", 200, Timer("cuda", reps=20))
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
        return
    if not args.files:
        ap.error("give bench_cost_model.py --nodes JSON files, or --measure")
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
