"""Where a tree verify step spends more than a chain verify step of the same size.

Builds the compiled target (random weights, Qwen3-8B shapes or ``--tiny``) with its chain and tree
verify steps, then profiles a few CUDA-graph replays of each at Q query rows (``torch.profiler``,
device time per kernel and launch grid, ``examples/profile_step.kernel_profile``) and prints the
kernels whose time differs most between the two.

    PYTHONPATH=. python3 examples/profile_tree.py --q 64 --out $OUT/profile_tree.json
"""

from __future__ import annotations

import argparse
import json

import torch

from examples.bench_steps import QWEN3_8B, build_causal, tiny
from examples.profile_step import kernel_profile


def main() -> None:
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.trees import build_tree

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q", type=int, default=64)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default="profile_tree.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = tiny(QWEN3_8B) if args.tiny else QWEN3_8B
    target = build_causal(cfg, torch.bfloat16, dev, seed=1)
    target.setup_caches(1, 16)
    built = build_steps(target, None, DEFAULT_PIPELINE, tree=True)
    chain, tree_step = instantiate(built.emitted["target"]), instantiate(built.emitted["target_tree"])
    state = chain.setup_caches(1, args.context + args.q + 8)
    state.bind(tree_step)
    q, c = args.q, args.context
    cache_len = torch.tensor([c], device=dev)
    ids = torch.randint(0, cfg["vocab_size"], (1, q), device=dev)
    pos = torch.arange(c, c + q, device=dev)[None]
    gen = torch.Generator().manual_seed(q)
    lp = torch.randn(1, 15, cfg["vocab_size"], generator=gen).mul(3).log_softmax(-1).to(dev)
    tree = build_tree(lp, ids[:, 0], q - 1)
    prof = {"chain": kernel_profile(chain, (ids, pos, cache_len)),
            "tree": kernel_profile(tree_step, (tree.tokens, tree.positions(cache_len), cache_len, tree.ancestor_mask(15)))}
    for name, p in prof.items():
        print(f"[{name}] kernel time {p['kernel_us_per_step']:.1f} us/step, span {p['span_us_per_step']:.1f} us, "
              f"{p['launches_per_step']:.0f} launches")
        for r in p["kernels"][:8]:
            print(f"    {r['us_per_step']:9.1f} us  x{r['calls_per_step']:4.0f}  {r['kernel']}")
    # kernels by name (grid dropped): the difference tree - chain
    def by_name(p):
        out = {}
        for r in p["kernels"]:
            name = r["kernel"].split(" grid=")[0]
            out[name] = out.get(name, 0.0) + r["us_per_step"]
        return out
    a, b = by_name(prof["chain"]), by_name(prof["tree"])
    diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), reverse=True)
    print("[diff] tree - chain, us per step:")
    for d, k in diff[:8]:
        print(f"    {d:+9.1f}  {k}")
    prof["diff_us"] = {k: d for d, k in diff}
    with open(args.out, "w") as f:
        json.dump(prof, f, indent=1)


if __name__ == "__main__":
    main()
