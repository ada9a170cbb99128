"""Judge linear configs in the whole step: a compiled target step timed with the shipped configs
and with others, alternated round by round in one process.

The step is built once; each timing captures a new CUDA graph and the linear launcher reads its
config at call time, so the alternatives differ only in the configs they set. Alternating in one
process keeps the spread between processes (1-2% on the H200, larger than many config changes)
out of the comparison. Run 32 judged run 31's 16-row o / down tiles this way:

    PYTHONPATH=. python3 examples/ab_linear_configs.py --q 16 --context 1024 --out ab.json \\
        --alt '16,4096,4096={"kind": "dot", "block_m": 16, "block_n": 64, "block_k": 128, "split_k": 2, "num_stages": 5}' \\
        --alt '16,4096,12288={"kind": "dot", "block_m": 16, "block_n": 64, "block_k": 256, "split_k": 2, "num_stages": 4}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from examples.bench_steps import QWEN3_8B, time_graph, tiny
from examples.profile_step import build_step, step_args


def parse_alt(text: str) -> tuple[tuple[int, int, int], dict]:
    """'M,N,K={json}' -> ((M, N, K), config fields)."""
    key, sep, body = text.partition("=")
    try:
        m, n, k = (int(v) for v in key.split(","))
        fields = json.loads(body)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--alt wants M,N,K={{json}}, got {text!r} ({exc})") from None
    if not sep or not isinstance(fields, dict):
        raise argparse.ArgumentTypeError(f"--alt wants M,N,K={{json}}, got {text!r}")
    return (m, n, k), fields


def main(argv=None) -> dict:
    from specc.codegen.kernels import linear as L

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--q", type=int, default=16, help="new tokens of the step judged")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--alt", type=parse_alt, action="append", required=True, metavar="M,N,K=JSON",
                    help="a config for the (M, N, K) linear (LinearConfig fields as JSON); repeatable")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen3 shapes (smoke test)")
    ap.add_argument("--out", default="ab_linear_configs.json")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    cfg = tiny(QWEN3_8B) if args.tiny else QWEN3_8B
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    step, _, shapes = build_step(cfg, dtype, dev, args.context + 128)
    shipped = {key: L.get_config(*key) for key, _ in args.alt}
    alternative = {key: L._as_config(fields) for key, fields in args.alt}
    a_q, a_1 = step_args(cfg, dev, args.q, args.context), step_args(cfg, dev, 1, args.context)
    times: dict[str, list[float]] = {"shipped": [], "alternative": [], "q1": []}
    try:
        for rnd in range(args.rounds):
            for name, table in (("shipped", shipped), ("alternative", alternative)):
                for key, c in table.items():
                    L.set_config(*key, c)
                times[name].append(time_graph(step, a_q, args.reps))
            times["q1"].append(time_graph(step, a_1, args.reps))
            print(f"round {rnd}: shipped {times['shipped'][-1]:.4f} ms, alternative {times['alternative'][-1]:.4f} ms, "
                  f"Q=1 {times['q1'][-1]:.4f} ms", flush=True)
    finally:
        for key in shipped:
            L.set_config(*key, None)  # back to the table
    med = {name: statistics.median(v) for name, v in times.items()}
    res = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "q": args.q, "context": args.context, "reps": args.reps,
           "linear_shapes": shapes,
           "configs": [{"m_n_k": list(key), "shipped": dataclasses.asdict(shipped[key]),
                        "alternative": dataclasses.asdict(alternative[key])} for key in shipped],
           "ms": times, "median_ms": med, "shipped_over_alternative": med["shipped"] / med["alternative"],
           "q_over_q1_shipped": med["shipped"] / med["q1"]}
    print(f"shipped {med['shipped']:.4f} ms, alternative {med['alternative']:.4f} ms: "
          f"{res['shipped_over_alternative']:.4f}x; Q={args.q} / Q=1 {res['q_over_q1_shipped']:.3f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
