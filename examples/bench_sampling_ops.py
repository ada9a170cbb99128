"""Per-step cost of speculative sampling's on-device work vs greedy acceptance (no models).

What a sampling step adds around the target's forward, at real vocabulary sizes: the processors
on the drafter's and the target's logits, drawing k drafts (one position at a time), the chain
rejection sampling, or the tree's per-node draws and walk; beside greedy chain / tree acceptance
on the same shapes, and a batch whose rows have different params (greedy among them). Random logits; medians of ``--iters`` timed calls after a warm-up, with a
device synchronise around each call (CUDA: includes launch overhead, no CUDA graph).

    PYTHONPATH=. python3 examples/bench_sampling_ops.py --device cuda --out $OUT/sampling_ops.json   # H200
    PYTHONPATH=. python3 examples/bench_sampling_ops.py --device cpu --vocab 4096 --iters 5           # smoke
    PYTHONPATH=. python3 examples/bench_sampling_ops.py --device cuda --batch 8 --profile --out $OUT/ops.json

``--profile``: after each timing, one chain and one tree call under torch.profiler; the ops that
took the most time (device time on CUDA, CPU time otherwise; calls, total ms) are printed and
written into the row: where a step's time goes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _time(fn, device: str, iters: int) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _profile(fn, device: str, top: int = 8) -> list[dict]:
    """The ``top`` ops of one ``fn()`` call by self time (device time on CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    return [{"op": e.key, "calls": e.count, "ms": getattr(e, key) / 1e3} for e in events]


def _mixed(rows: int) -> list:
    """Per-row params cycling greedy / T=0.7 top-p 0.9 top-k 50 / T=1 rep 1.1 (one batch)."""
    from specc.sampling import SamplingParams

    cycle = [None, SamplingParams(temperature=0.7, top_p=0.9, top_k=50),
             SamplingParams(temperature=1.0, repetition_penalty=1.1)]
    return [cycle[i % 3] for i in range(rows)] if rows > 1 else [cycle[1]]


def main() -> None:
    from specc.runtime.policy import GreedyPolicy, SamplingPolicy
    from specc.runtime.trees import build_tree
    from specc.runtime.verifiers import ChainVerifier, TreeVerifier
    from specc.sampling import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary size (default Qwen3's 151936)")
    ap.add_argument("--k", type=int, default=15, help="drafted positions (default 15: block 16)")
    ap.add_argument("--budget", type=int, default=32, help="tree nodes drafted (default 32)")
    ap.add_argument("--batch", default="1,8", help="batch sizes (default 1,8)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="sampling_ops.json")
    ap.add_argument("--profile", action="store_true", help="also profile one call of each (top ops, printed and in the JSON)")
    args = ap.parse_args()
    dev, V, k = torch.device(args.device), args.vocab, args.k
    rows = []
    for b in [int(x) for x in args.batch.split(",")]:
        g = torch.Generator(device="cpu").manual_seed(b)
        draft_logits = (torch.randn(b, k, V, generator=g) * 3).to(dev)
        target_logits = (torch.randn(b, k + 1, V, generator=g) * 3).to(dev)
        tree_logits = (torch.randn(b, args.budget + 1, V, generator=g) * 3).to(dev)
        lengths = torch.full((b,), 100, dtype=torch.long, device=dev)
        prompts = torch.randint(0, V, (b, 100), device=dev)
        seq = torch.zeros(b, 200, dtype=torch.long, device=dev)

        class _Parallel:  # a parallel drafter whose forward is already done
            supports_tree = True  # per-position logits from one forward (DFlash-like)

            def propose_logits_rows(self, seq, n, kk):
                return draft_logits[:, :kk]

            def propose_sampled_rows(self, seq, n, kk, pick):
                picked = [pick(draft_logits[:, j], j) for j in range(kk)]
                return torch.stack([t for t, _ in picked], 1), torch.stack([q for _, q in picked], 1)

            def propose_rows(self, seq, n, kk):
                return draft_logits.argmax(-1)

        for name, params in (("greedy", None), ("T=1", SamplingParams(temperature=1.0)),
                             ("T=0.7 top-p 0.9 top-k 50", SamplingParams(temperature=0.7, top_p=0.9, top_k=50)),
                             ("T=1 rep 1.1", SamplingParams(temperature=1.0, repetition_penalty=1.1)),
                             ("mixed per row", _mixed(b))):
            policy = GreedyPolicy() if params is None else SamplingPolicy(
                params, torch.arange(b, device=dev), prompts, V)

            def chain():
                drafts, q = policy.draft(_Parallel(), seq, [101] * b, k, lengths)
                return policy.verify_chain(ChainVerifier(), drafts, q, target_logits, None, lengths)

            def tree():
                t = build_tree(policy.tree_logprobs(draft_logits, lengths), seq[:, 0], args.budget)
                t.ancestor_mask(k)
                return policy.verify_tree(TreeVerifier(), t, tree_logits, None, k, lengths)

            row = {"batch": b, "mode": name, "chain_ms": _time(chain, args.device, args.iters),
                   "tree_ms": _time(tree, args.device, args.iters)}
            rows.append(row)
            print(f"B={b} {name:26s} chain accept {row['chain_ms']:8.3f} ms   tree {args.budget} {row['tree_ms']:8.3f} ms",
                  flush=True)
            if args.profile:
                for part, fn in (("chain", chain), ("tree", tree)):
                    row[f"{part}_profile"] = _profile(fn, args.device)
                    print(f"    {part}: " + ", ".join(f"{o['op']} x{o['calls']} {o['ms']:.3f} ms"
                                                     for o in row[f"{part}_profile"]), flush=True)
    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "vocab": V, "k": k, "budget": args.budget, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
