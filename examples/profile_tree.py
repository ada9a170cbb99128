"""Where a tree verify step spends more than a chain verify step of the same size, per tree mask format.

Builds the compiled target (random weights, Qwen3-8B shapes or ``--tiny``) with its chain and tree
verify steps. At each node count of ``--q`` it profiles CUDA-graph replays of the chain step and of
the tree step once per tree mask format of ``--masks`` (``words``: the packed bit words the
generated tree step builds once per step; ``bytes``: the byte mask tile loads;
``attention.set_tree_mask_format``, a fresh graph capture each) with ``torch.profiler`` (device
time per kernel, ``examples/profile_step.kernel_profile``), and prints per step the attention
kernels' time (split + merge kernels, per step and per layer), the whole step's kernel time and the
kernels whose time differs most between the tree and the chain. The tree step's logits under each
format are compared with the first format's (max abs difference: fp rounding of the split layout,
which differs between the formats; a wide difference would be a bug).

On the CPU (``--device cpu``; with ``--tiny`` it is the script's smoke check) the kernels run
under the Triton interpreter and the times are host times of the attention launcher: they check
the script, not the kernel's speed.

    PYTHONPATH=. python3 examples/profile_tree.py --q 16,32,64,128 --out $OUT/profile_tree.json
    PYTHONPATH=. python3 examples/profile_tree.py --device cpu --tiny --q 4,40 --context 16 --out /tmp/p.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

ATTENTION_KERNELS = ("_attn_split_kernel", "_attn_merge_kernel")


def host_profile(step, args, reps: int = 2) -> dict:
    """CPU: host time of the step and of its attention launches (interpreted kernels)."""
    from specc.codegen.kernels import attention as A

    real, spent = A.attention, [0.0, 0]

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    A.attention = timed
    try:
        with torch.inference_mode():
            step(*args)
            spent[:] = [0.0, 0]
            t0 = time.perf_counter()
            for _ in range(reps):
                step(*args)
            total = time.perf_counter() - t0
    finally:
        A.attention = real
    return {"kernels": [{"kernel": "_attn_split_kernel (host time, interpreted)", "calls_per_step": spent[1] / reps,
                         "us_per_step": spent[0] / reps * 1e6}],
            "kernel_us_per_step": total / reps * 1e6, "span_us_per_step": total / reps * 1e6,
            "launches_per_step": None}


def attention_us(prof: dict) -> tuple[float, float]:
    """(us per step, split-kernel calls per step) of the attention kernels in a profile."""
    rows = [r for r in prof["kernels"] if r["kernel"].startswith(ATTENTION_KERNELS)]
    calls = sum(r["calls_per_step"] for r in rows if r["kernel"].startswith(ATTENTION_KERNELS[0]))
    return sum(r["us_per_step"] for r in rows), calls


def by_name(prof: dict) -> dict[str, float]:
    """Kernel time per step by kernel name (launch grid dropped)."""
    out: dict[str, float] = {}
    for r in prof["kernels"]:
        name = r["kernel"].split(" grid=")[0]
        out[name] = out.get(name, 0.0) + r["us_per_step"]
    return out


def logits_of(step, args) -> torch.Tensor:
    with torch.inference_mode():
        out = step(*args)
    return (out[0] if isinstance(out, tuple) else out).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q", default="16,32,64,128", help="node counts (query rows), comma-separated")
    ap.add_argument("--masks", default="words,bytes", help="tree mask formats to profile (words, bytes)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default="profile_tree.json")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if not cuda:  # run the Triton kernels interpreted (before triton is first imported)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ["SPECC_KERNELS"] = "triton"
        torch.set_num_threads(1)

    from examples.bench_steps import QWEN3_8B, build_causal, tiny
    from examples.profile_step import kernel_profile
    from specc.codegen.build import build_steps
    from specc.codegen.kernels import attention as A
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.trees import build_tree

    sizes = [int(x) for x in args.q.split(",")]
    masks = args.masks.split(",")
    for fmt in masks:
        if fmt not in A.TREE_MASK_FORMATS:
            raise SystemExit(f"--masks: unknown format {fmt!r} (known: {', '.join(A.TREE_MASK_FORMATS)})")
    profile = kernel_profile if cuda else host_profile
    dev = torch.device(args.device)
    cfg = tiny(QWEN3_8B) if args.tiny else QWEN3_8B
    layers = cfg["num_hidden_layers"]
    dtype = torch.bfloat16 if cuda else torch.float32
    target = build_causal(cfg, dtype, dev, seed=1)
    target.setup_caches(1, 16)
    built = build_steps(target, None, DEFAULT_PIPELINE, tree=True)
    chain, tree_step = instantiate(built.emitted["target"]), instantiate(built.emitted["target_tree"])
    state = chain.setup_caches(1, args.context + max(sizes) + 8)
    state.bind(tree_step)
    c = args.context
    cache_len = torch.tensor([c], device=dev)
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu (interpreted kernels, host times)",
              "shapes": "tiny Qwen3" if args.tiny else "Qwen3-8B", "dtype": str(dtype), "context": c,
              "layers": layers, "rows": []}
    previous = A.TREE_MASK_FORMAT
    for q in sizes:
        ids = torch.randint(0, cfg["vocab_size"], (1, q), device=dev)
        pos = torch.arange(c, c + q, device=dev)[None]
        gen = torch.Generator().manual_seed(q)
        lp = torch.randn(1, 15, cfg["vocab_size"], generator=gen).mul(3).log_softmax(-1).to(dev)
        tree = build_tree(lp, ids[:, 0], q - 1)
        tree_args = (tree.tokens, tree.positions(cache_len), cache_len, tree.ancestor_mask(15))
        profs = {"chain": profile(chain, (ids, pos, cache_len))}
        logits = {}
        try:
            for fmt in masks:
                A.set_tree_mask_format(fmt)
                profs[f"tree {fmt}"] = profile(tree_step, tree_args)
                logits[fmt] = logits_of(tree_step, tree_args)
        finally:
            A.set_tree_mask_format(previous)
        row = {"q": q, "steps": {}}
        for name, p in profs.items():
            att, calls = attention_us(p)
            row["steps"][name] = {"kernel_us_per_step": p["kernel_us_per_step"], "attention_us_per_step": att,
                                  "attention_us_per_layer": att / layers, "attention_calls_per_step": calls,
                                  "kernels": p["kernels"]}
            print(f"[Q={q:4d}] {name:11s} step {p['kernel_us_per_step']:9.1f} us, attention {att:8.1f} us/step "
                  f"= {att / layers:7.2f} us/layer ({calls:.0f} calls)", flush=True)
        chain_att = row["steps"]["chain"]["attention_us_per_step"]
        for fmt in masks:
            s = row["steps"][f"tree {fmt}"]
            s["attention_over_chain"] = s["attention_us_per_step"] / chain_att if chain_att else None
            s["step_over_chain"] = s["kernel_us_per_step"] / row["steps"]["chain"]["kernel_us_per_step"]
            s["max_abs_logit_diff_vs_" + masks[0]] = float((logits[fmt] - logits[masks[0]]).abs().max())
            print(f"[Q={q:4d}] tree {fmt:6s} / chain: step x{s['step_over_chain']:.3f}, attention "
                  f"x{s['attention_over_chain'] or float('nan'):.3f}; logits vs {masks[0]}: max abs diff "
                  f"{s['max_abs_logit_diff_vs_' + masks[0]]:.3g}", flush=True)
        a, b = by_name(profs["chain"]), by_name(profs[f"tree {masks[0]}"])
        diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), reverse=True)
        print(f"[Q={q:4d}] tree {masks[0]} - chain, us per step:")
        for d, k in diff[:6]:
            print(f"    {d:+9.1f}  {k}")
        row["diff_us"] = {k: d for d, k in diff}
        result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
