"""Speculative sampling acceptance on specc-tiny: held-out tokens per step at T = 0.7 and 1.0.

Held-out-style prompts (``bench_tree.heldout_prompts``: stdlib files in the training run's
held-out bucket, 64-128 tokens at random offsets), block 16 (15 drafted positions), PARD and
DFlash drafters, chain and tree (``--budgets`` drafted nodes), through the production device
loop over the model definitions in fp32. For each (method, verification, temperature): tau =
tokens committed per target step, pooled over prompts (accepted drafts + 1; the prefill token
is not a step), with seed = the prompt's index, and greedy (T = 0) for comparison. Sampling uses
``SamplingParams(temperature=T)`` only (no top-k / top-p), the distributions the drafters were
never trained to match beyond their greedy token.

    PYTHONPATH=. python3 examples/bench_sampling.py --out docs/benchmarks/sampling_cpu.json
    PYTHONPATH=. python3 examples/bench_sampling.py --prompts 2 --new-tokens 16 --out /tmp/s.json   # smoke
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from bench_tree import K, METHODS, heldout_prompts  # noqa: E402


def _loop(method: str, drafter: str, budget: int, max_len: int):
    from specc.pairing import resolve_pair
    from specc.runtime.device_loop import DeviceSpeculativeDecoder
    from specc.runtime.eager import build_eager

    eager = build_eager(resolve_pair("specc-tiny", drafter, method), K, max_len, torch.float32, "cpu")
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, K, max_len, tree_budget=budget)


def measure(prompts, new_tokens: int, budgets, temperatures) -> list[dict]:
    from specc.sampling import SamplingParams

    rows = []
    max_len = max(map(len, prompts)) + new_tokens + 2
    for method, drafter in METHODS:
        for budget in (0, *budgets):
            loop = _loop(method, drafter, budget, max_len)
            for t in temperatures:
                lengths, t0 = [], time.perf_counter()
                for i, p in enumerate(prompts):
                    params = SamplingParams(temperature=t, seed=i) if t else None
                    lengths += loop.generate(p, new_tokens, (), params).stats.accepted_lengths
                row = {"method": method, "verification": "chain" if budget == 0 else f"tree {budget}",
                       "budget": budget, "temperature": t, "tau": sum(lengths) / len(lengths), "steps": len(lengths),
                       "seconds": time.perf_counter() - t0}
                rows.append(row)
                print(f"{method:6s} {row['verification']:8s} T={t:<4} tau {row['tau']:.3f} ({row['steps']} steps, "
                      f"{row['seconds']:.0f} s)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--budgets", default="16", help="tree budgets (default 16)")
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--out", default="sampling.json")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import transformers

    from specc.models.loading import load_tokenizer
    from specc.pairing import resolve_pair

    tok = load_tokenizer(resolve_pair("specc-tiny").target.path)
    prompts = heldout_prompts(tok, args.prompts)
    temps = [float(x) for x in args.temperatures.split(",")]
    budgets = [int(x) for x in args.budgets.split(",") if x]
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} CPU, 1 torch thread",
              "python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
              "dtype": "float32", "block": K + 1, "prompts": len(prompts), "new_tokens": args.new_tokens,
              "command": "PYTHONPATH=. python3 examples/bench_sampling.py " + " ".join(sys.argv[1:]),
              "rows": measure(prompts, args.new_tokens, budgets, temps)}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
