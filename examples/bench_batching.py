"""Tokens/s against batch size: specc's compiled AR and compiled speculative loop, batched.

Builds real shapes with random weights (``specc.bench.shapes``), compiles the AR step and the
speculative steps in memory (the default pipeline), and for each batch size B runs B prompts of
different lengths (``--prompt-len`` +- 25%) through ``DeviceSpeculativeDecoder.generate_batch``
(continuous batching, B slots), ``--tokens`` new tokens each, no EOS. Random weights accept
nothing, so the speculative loop's acceptance is replayed from a stated model
(``--acceptance``, ``specc.runtime.replay``): the drafter and the target do all their work, only
the accepted count is drawn, so the timing is real and the tokens are not the model's output.
Before timing, the batched AR output is checked equal to each prompt run alone (greedy).

Each row: batch size, seconds, total new tokens, tokens/s, tokens/s per request, mean committed
tokens per step; one untimed pass first (Triton compiles, CUDA-graph captures per shape). With
``--goodput`` the speculative loop also runs under the goodput rule (``specc.runtime.adaptive``:
drafts per step from the requests' measured, here replayed, acceptance against the cost model's
step-time curve for ``--deployment``), rows ``specc-goodput`` with the mean k it chose.

    python3 examples/bench_batching.py --device cpu --shapes tiny-qwen3 --tokens 16 --batches 1,2
    PYTHONPATH=. python3 examples/bench_batching.py --device cuda --shapes qwen3-8b --drafter-shapes dflash-b16 \
        --acceptance dflash-qwen3-8b:gsm8k --batches 1,2,4,8,16,32 --goodput --deployment h200-bs1 --out $OUT/batching.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specc.passes.pipelines import DEFAULT_PIPELINE


def build(opts, dev):
    """(AR loop, speculative loop or None, prompts pool, acceptance model or None)."""
    from specc.bench.acceptance import parse_acceptance
    from specc.bench.run import BenchOptions, _setup_shapes
    from specc.codegen.build import build_steps
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop
    from specc.runtime.replay import ReplayVerifier

    bench = BenchOptions(shapes=opts.shapes, drafter_shapes=opts.drafter_shapes, device=str(dev), systems=("specc",),
                         prompts=max(opts.batches), prompt_len=opts.prompt_len, seed=opts.seed)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    s = _setup_shapes(bench, dtype, dev)
    max_len = int(opts.prompt_len * 1.25) + opts.tokens + 4

    def loop_over(with_drafter: bool):
        target, draft = s.loaded.target, s.loaded.draft if with_drafter else None
        saved = getattr(target, "capture_layers", ())
        if not with_drafter:
            target.capture_layers = ()
        try:
            target.setup_caches(1, 16)
            if draft is not None:
                draft.setup_caches(1, 16)
            spec = s.loaded.draft_spec if draft is not None else None
            built = build_steps(target, draft, DEFAULT_PIPELINE, spec)
        finally:
            target.capture_layers = saved
        steps = {role: instantiate(e, spec if role == "drafter" else None) for role, e in built.emitted.items()}
        return build_loop(steps, s.impl.strategy if draft is not None else None, s.k if draft is not None else 0,
                          max_len, drafter_section=s.section if draft is not None else None)

    g = torch.Generator().manual_seed(opts.seed)
    lo, hi = int(opts.prompt_len * 0.75), int(opts.prompt_len * 1.25)
    vocab = s.target_raw["vocab_size"]
    prompts = [torch.randint(10, vocab - 10, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
               for _ in range(max(opts.batches))]
    ar = loop_over(False)
    spec_loop, acceptance = None, None
    if s.impl.uses_drafter:
        acceptance = parse_acceptance(opts.acceptance, s.k)
        if acceptance is None:
            raise SystemExit("random weights accept nothing: give --acceptance (e.g. tau:6.5, dflash-qwen3-8b:gsm8k)")
        spec_loop = loop_over(True)
        spec_loop.verifier = ReplayVerifier(acceptance.alphas, seed=opts.seed, source=acceptance.source)
    curve = None
    if opts.goodput and spec_loop is not None:
        from specc.search.batch_pricing import step_seconds
        from specc.search.cost_model import CostModel
        from specc.search.deployments import get_deployment
        from specc.search.meta_pair import MetaPair

        irs = MetaPair(s.target_raw, s.drafter_raw, s.impl.name, "bfloat16" if dev.type == "cuda" else None).irs(
            DEFAULT_PIPELINE)
        curve = step_seconds(CostModel(get_deployment(opts.deployment)), *irs, s.impl.name,
                             context=opts.prompt_len + opts.tokens // 2)
    return ar, spec_loop, prompts, acceptance, curve


def time_goodput(loop, prompts, tokens, dev, curve):
    """The speculative loop under the goodput rule: (row, mean k chosen)."""
    from specc.runtime.adaptive import GoodputDraftLength
    from specc.runtime.batching import BatchScheduler

    def once():
        scheduler = BatchScheduler(loop, len(prompts), (), GoodputDraftLength(curve, loop.num_draft))
        rids = [scheduler.submit(p, tokens, ()) for p in prompts]
        ks = []
        while not scheduler.idle:
            scheduler.step()
            if scheduler.last_num_draft is not None:
                ks.append(scheduler.last_num_draft)
        return [scheduler.take(r) for r in rids], ks

    once()  # untimed: captures for every k the rule picks
    loop.verifier.reset()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    results, ks = once()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new = sum(len(r.tokens) for r in results)
    steps = sum(r.stats.steps for r in results)
    return {"batch": len(prompts), "seconds": seconds, "tokens": new, "tokens_per_s": new / seconds,
            "tokens_per_s_per_request": new / seconds / len(prompts),
            "tokens_per_step": (new - len(results)) / steps if steps else 0.0,
            "mean_k": sum(ks) / len(ks) if ks else 0.0}


def time_batch(loop, prompts, tokens, dev):
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    loop.generate_batch(prompts, tokens, (), batch_size=len(prompts))  # untimed: compiles, graph captures
    if hasattr(loop.verifier, "reset"):
        loop.verifier.reset()
    sync()
    start = time.perf_counter()
    results = loop.generate_batch(prompts, tokens, (), batch_size=len(prompts))
    sync()
    seconds = time.perf_counter() - start
    new = sum(len(r.tokens) for r in results)
    steps = sum(r.stats.steps for r in results)
    return {"batch": len(prompts), "seconds": seconds, "tokens": new, "tokens_per_s": new / seconds,
            "tokens_per_s_per_request": new / seconds / len(prompts),
            "tokens_per_step": (new - len(results)) / steps if steps else 0.0}, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="qwen3-8b", help="target shapes (specc.bench.shapes)")
    ap.add_argument("--drafter-shapes", default="dflash-b16", help="drafter shapes, or none for AR only")
    ap.add_argument("--acceptance", default="dflash-qwen3-8b:gsm8k", help="acceptance model replayed (specc bench)")
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes, comma separated")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--prompt-len", type=int, default=128, help="mean prompt length (+- 25%%)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--goodput", action="store_true", help="also run the goodput rule (drafts per step)")
    ap.add_argument("--deployment", default="h200-bs1", help="deployment whose cost model prices the goodput rule")
    ap.add_argument("--out", help="write the rows as JSON here")
    opts = ap.parse_args()
    opts.batches = sorted({int(b) for b in opts.batches.split(",") if b.strip()})
    dev = torch.device(opts.device)
    ar, spec_loop, pool, acceptance, curve = build(opts, dev)
    alone = [ar.generate(p, opts.tokens, ()).tokens for p in pool[: max(2, min(4, len(pool)))]]
    batched = ar.generate_batch(pool[: len(alone)], opts.tokens, (), batch_size=len(alone))
    if [r.tokens for r in batched] != alone:
        raise SystemExit("batched AR output differs from the prompts run alone: not timing a wrong system")
    rows = []
    print(f"{'system':>10} {'B':>4} {'tok/s':>10} {'tok/s/req':>10} {'tok/step':>9} {'seconds':>8}")
    for name, loop in (("specc-ar", ar), ("specc-spec", spec_loop)):
        if loop is None:
            continue
        for b in opts.batches:
            row, _ = time_batch(loop, pool[:b], opts.tokens, dev)
            row["system"] = name
            rows.append(row)
            print(f"{name:>10} {b:>4} {row['tokens_per_s']:>10,.1f} {row['tokens_per_s_per_request']:>10,.1f} "
                  f"{row['tokens_per_step']:>9.2f} {row['seconds']:>8.3f}")
    if curve is not None:
        for b in opts.batches:
            row = time_goodput(spec_loop, pool[:b], opts.tokens, dev, curve)
            row["system"] = "specc-goodput"
            rows.append(row)
            print(f"{'goodput':>10} {b:>4} {row['tokens_per_s']:>10,.1f} {row['tokens_per_s_per_request']:>10,.1f} "
                  f"{row['tokens_per_step']:>9.2f} {row['seconds']:>8.3f}  mean k {row['mean_k']:.1f}")
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "shapes": opts.shapes, "drafter_shapes": opts.drafter_shapes, "tokens": opts.tokens,
              "prompt_len": opts.prompt_len, "rows": rows,
              "acceptance": acceptance.source if acceptance is not None else None,
              "notice": "random weights; speculative acceptance replayed: tokens are not the model's output"}
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
