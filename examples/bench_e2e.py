"""End-to-end tokens/s on the embedded specc-tiny family: AR vs stock vs compiled, per method.

For each method (AR; PARD and DFlash at block 16) it times the stock system (HF transformers
eager loops) and the compiled system (the generated modules of `specc compile`, built in memory,
run by the engine's device-resident loop; CUDA-graphed on a GPU) on the built-in code prompts,
greedy, a fixed number of new tokens, no EOS stop. Each system first runs every prompt once
untimed (warm-up: Triton compiles per prefill length, CUDA-graph captures); reported tokens/s =
generated tokens / wall time of a second pass over all prompts, with tau. Every
system's tokens are compared with stock AR's (lossless): equal, "tie" (every difference starts
where stock AR's top-2 logits are within bf16 rounding: reported with the positions), or False.

    python3 examples/bench_e2e.py --device cpu --out tiny_e2e.json
    PYTHONPATH=. python3 examples/bench_e2e.py --device cuda --out $OUT/tiny_e2e.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch


def compiled_system(pair, num_draft, dtype, device, max_len):
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop

    impl = pair.impl
    loaded = impl.load(pair, dtype, device)
    target, draft_module, spec = loaded.target, loaded.draft, loaded.draft_spec
    target.setup_caches(1, 16)
    if draft_module is not None:
        draft_module.setup_caches(1, 16)
    built = build_steps(target, draft_module, DEFAULT_PIPELINE, spec)
    steps = {role: instantiate(e, spec if role == "drafter" else None) for role, e in built.emitted.items()}
    section = impl.manifest_drafter(pair, loaded) if pair.drafter is not None else {}
    return build_loop(steps, impl.strategy, num_draft, max_len, drafter_section=section)


def run(system, prompts, new_tokens, device):
    """One untimed pass over every prompt (Triton compiles for each prefill length, graph
    captures), then the timed pass: tokens/s over all prompts, warm-up excluded."""
    cuda = torch.device(device).type == "cuda"
    for p in prompts:
        system.generate(p, new_tokens, ())
    outs, lengths = [], []
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for p in prompts:
        res = system.generate(p, new_tokens, ())
        lengths += res.stats.accepted_lengths
        outs.append(res.tokens)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    n = new_tokens * len(prompts)
    return outs, {"tokens_per_s": n / elapsed, "seconds": elapsed,
                  "tau": sum(lengths) / len(lengths) if lengths else 0.0}


@functools.cache
def _margins(dtype, device):
    from specc.bench.equality import reference_margins
    from specc.pairing import resolve_pair

    pair = resolve_pair("specc-tiny")
    return reference_margins(pair.impl.load(pair, dtype, device).target, dtype)


def lossless(outs, reference, prompts, dtype, device) -> dict:
    """``lossless``: True when the tokens equal stock AR's; "tie" when every prompt's first
    difference is at a numerical tie of stock AR (``specc.bench.equality.audit``: its top-2
    margin, measured by specc's model definition of the target in the same dtype, below
    ``specc.verify.DEFAULT_TOLERANCE``; in bf16 the compiled kernels and HF's round differently,
    so a near-tie may flip), listed in ``numerical_ties``; False for any other difference
    (``token_differences``)."""
    if outs == reference:
        return {"lossless": True}
    from specc.bench.equality import audit, tie_tolerance

    found = audit(prompts, reference, outs, _margins(dtype, device), tie_tolerance(dtype))
    return {"lossless": found.pop("same"), **found}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--out", default="tiny_e2e.json")
    args = ap.parse_args()

    from specc.models.loading import load_tokenizer
    from specc.pairing import resolve_pair
    from specc.stock.runner import StockSystem
    from specc.verify import CALIBRATION_TEXTS

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    tok = load_tokenizer(resolve_pair("specc-tiny").target.path)
    prompts = [tok(t)["input_ids"] for t in (CALIBRATION_TEXTS * 2)[: args.prompts]]
    max_len = max(map(len, prompts)) + args.new_tokens + 2
    rows, reference = [], None
    for method, drafter, k in (("ar", None, 0), ("pard", "specc-tiny-pard", 15), ("dflash", "specc-tiny-dflash", 15)):
        pair = resolve_pair("specc-tiny", drafter, method)
        for engine in ("stock", "compiled"):
            if engine == "stock":
                system = StockSystem(pair, k or None, dtype, args.device)
            else:
                system = compiled_system(pair, k, dtype, args.device, max_len)
            outs, figures = run(system, prompts, args.new_tokens, args.device)
            if reference is None:
                reference = outs
            figures.update(method=method, engine=engine, **lossless(outs, reference, prompts, dtype, args.device))
            if engine == "compiled":
                figures["graphs"] = system.graph_stats()  # steps, and the chain step's accept + commit
                system.profile = True  # one more prompt, timed per loop part (synchronising)
                system.generate(prompts[-1], args.new_tokens, ())
                system.profile = False
                figures["part_seconds_last_prompt"] = system.part_seconds
            rows.append(figures)
            print(f"{method:7s} {engine:9s} {figures['tokens_per_s']:8.1f} tok/s  tau {figures['tau']:.2f}  "
                  f"lossless {figures['lossless']}", flush=True)
    base = next(r for r in rows if r["method"] == "ar" and r["engine"] == "stock")["tokens_per_s"]
    for r in rows:
        r["speedup_vs_stock_ar"] = r["tokens_per_s"] / base
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "dtype": str(dtype), "new_tokens": args.new_tokens,
              "prompts_timed": len(prompts), "rows": rows, "date": time.strftime("%Y-%m-%d")}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
