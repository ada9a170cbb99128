"""Where a compiled target step spends its time, and which linear configs make it faster.

Builds a compiled target step at real shapes (random weights, default pipeline), then:

1. ``--q``: times the CUDA-graphed step at each Q (median of replays, CUDA events) and profiles
   a few graph replays with ``torch.profiler``: device time per kernel, grouped by kernel name
   and launch grid (the grid tells the linears of different shapes apart), the sum of kernel
   time per step and the idle time between kernels (step time minus kernel time).
2. ``--attention-sweep FILE``: the same with the attention plans a ``sweep_attention.py`` run
   found fastest (to see what a plan change is worth in the step).
3. ``--tune Q``: tunes the linear configs of bucket Q *in the step*: for each linear shape of
   the step, a coordinate search over the dot kernel's parameters (block_n, block_k, stages,
   warps, split-K, TMA loads, the norm prologue), each candidate installed with
   ``linear.set_config`` and judged by the whole step's graph time. Prints and saves the best
   config per shape (paste into ``linear.DEFAULT_CONFIGS`` after confirming it).

    PYTHONPATH=. python3 examples/profile_step.py --q 1,4,16 --tune 16 --out $OUT/profile.json
    PYTHONPATH=. python3 examples/profile_step.py --config qwen3-0.6b --batch 8 --q 1,16 --context 512 --out $OUT/p.json
    PYTHONPATH=. python3 examples/profile_step.py --batch 16 --q 16 --context 192 --deployment h200-bs1 --out $OUT/b16.json
    PYTHONPATH=. python3 examples/profile_step.py --q 1,16 --pack 3 --out $OUT/packed.json   # bf12 layout 3
    PYTHONPATH=. python3 examples/profile_step.py --q 1,16 --ablate-norm --ablate-rope --out $OUT/p.json   # their share
    PYTHONPATH=. python3 examples/profile_step.py --tiny --device cpu --q 1,4   # CPU smoke run

``--deployment``: the linears lowered with that deployment's Triton / cuBLAS choice (what
``specc compile`` builds for it; batched steps then run cuBLAS from 65 rows on the H100 / H200).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import tempfile
import time

import torch

from examples.bench_steps import QWEN3_8B, build_causal, time_graph, tiny


def build_step(cfg: dict, dtype, dev, max_len: int, batch: int = 1, pipeline: str | None = None,
               options: dict | None = None, linear_choice=None):
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate

    target = build_causal(cfg, dtype, dev, seed=1)
    target.setup_caches(1, 16)
    step = instantiate(build_steps(target, None, pipeline or DEFAULT_PIPELINE, pass_options=options or {},
                                   linear_choice=linear_choice).emitted["target"])
    step.setup_caches(batch, max_len)
    shapes = sorted({tuple(v.shape) for name, v in step.state_dict().items()  # the linears' [N, K]
                     if v.dim() == 2 and name.endswith("weight") and "embed" not in name})
    return step, target, shapes


def step_args(cfg: dict, dev, q: int, context: int, batch: int = 1):
    ids = torch.randint(0, cfg["vocab_size"], (batch, q), device=dev)
    pos = torch.arange(context, context + q, device=dev)[None].expand(batch, q).contiguous()
    return ids, pos, torch.full((batch,), context, device=dev)


def captured_graph(step, args) -> "torch.cuda.CUDAGraph":
    """``step(*args)`` run once on a side stream (Triton compiles, allocations settle), captured
    into a CUDA graph and replayed once, the device synchronised; call under inference mode."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*args)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def kernel_profile(step, args, replays: int = 5) -> dict:
    """Device time per (kernel, grid) per step, from a profiled CUDA-graph replay."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        graph = captured_graph(step, args)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    groups: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        key = f"{e['name'][:60]} grid={e.get('args', {}).get('grid')}"
        groups[key][0] += 1
        groups[key][1] += e.get("dur", 0.0)
    rows = sorted(({"kernel": k, "calls_per_step": c / replays, "us_per_step": t / replays}
                   for k, (c, t) in groups.items()), key=lambda r: -r["us_per_step"])
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) / replays if kernels else 0.0
    return {"kernels": rows, "kernel_us_per_step": sum(r["us_per_step"] for r in rows),
            "launches_per_step": len(kernels) / replays, "span_us_per_step": span}


def use_swept_attention(path: str) -> None:
    """Make ``attention.launch_plan`` return the fastest plan of a sweep_attention.py run for
    each Q (at the nearest swept cache capacity), to time whole steps with it."""
    from specc.codegen.kernels import attention as A

    with open(path) as f:
        best = json.load(f)["best"]
    swept = {}
    for key, plan in best.items():
        q, cap = (int(v) for v in key.split("@"))
        swept.setdefault(q, {})[cap] = plan
    original = A.launch_plan

    def plan(bsz, num_q, hq, hkv, d, max_kv_len, device, block_n=None, block_m=None):
        if num_q not in swept:
            return original(bsz, num_q, hq, hkv, d, max_kv_len, device, block_n, block_m)
        caps = swept[num_q]
        pick = caps[min(caps, key=lambda c: abs(c - max_kv_len))]
        out = original(bsz, num_q, hq, hkv, d, max_kv_len, device, block_n, pick["block_m"])
        out.update(num_splits=pick["num_splits"], fused_merge=pick["fused_merge"])
        return out

    A.launch_plan = plan


def profile_qs(step, cfg, dev, qs, context, reps, batch: int = 1) -> dict:
    out = {}
    for q in qs:
        a = step_args(cfg, dev, q, context, batch)
        entry = {"ms": time_graph(step, a, reps)}
        if dev.type == "cuda":
            entry.update(kernel_profile(step, a))
            print(f"[profile] Q={q}: step {entry['ms']:.3f} ms, kernels {entry['kernel_us_per_step'] / 1e3:.3f} ms "
                  f"({entry['launches_per_step']:.0f} launches), idle {entry['ms'] - entry['kernel_us_per_step'] / 1e3:.3f} ms",
                  flush=True)
            for r in entry["kernels"][:14]:
                print(f"    {r['us_per_step']:9.1f} us  x{r['calls_per_step']:4.0f}  {r['kernel']}", flush=True)
        else:
            print(f"[profile] Q={q}: step {entry['ms']:.3f} ms (no kernel profile off CUDA)", flush=True)
        out[q] = entry
    return out


def candidates(base):
    """One-parameter moves from ``base`` (a dot config), then a few joint ones."""
    out = []
    for bn in (32, 64, 128):
        out.append(base.replace(block_n=bn))
    for bk in (64, 128, 256):
        out.append(base.replace(block_k=bk, num_stages=min(base.num_stages, 3) if bk == 256 else base.num_stages))
    for st in (3, 4, 5, 6):
        out.append(base.replace(num_stages=st))
    out.append(base.replace(num_warps=8 if base.num_warps == 4 else 4))
    for sp in (1, 2, 3, 4, 6):
        out.append(base.replace(split_k=sp))
    out.append(base.replace(tma=not base.tma))
    out.append(base.replace(tma=True, num_stages=6))
    out.append(base.replace(tma=True, block_k=256, num_stages=4))
    seen, uniq = set(), []
    for c in out:
        if c != base and c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


def tune(step, cfg: dict, dev, q: int, context: int, shapes, deadline: float, reps: int) -> dict:
    from specc.codegen.kernels import linear as L

    args = step_args(cfg, dev, q, context)
    t0 = time_graph(step, args, reps)
    log = [{"shape": None, "config": None, "ms": t0}]
    print(f"[tune] Q={q}: step {t0:.3f} ms with the shipped table", flush=True)
    best_total = t0
    result = {}
    for n, k in shapes:
        base = L.get_config(q, n, k)
        if base.kind != "dot":
            continue
        best = base
        for c in candidates(base) + ([base.replace(norm_prologue=True)] if base.norm_prologue is None else []):
            if time.time() > deadline:
                print("[tune] time budget reached", flush=True)
                break
            L.set_config(q, n, k, c)
            try:
                t = time_graph(step, args, reps)
            except Exception as e:  # noqa: BLE001 - a config the compiler rejects is a data point
                log.append({"shape": [n, k], "config": dataclasses.asdict(c), "error": f"{type(e).__name__}: {str(e)[:200]}"})
                print(f"[tune] {n}x{k} {c}: {type(e).__name__}", flush=True)
                continue
            log.append({"shape": [n, k], "config": dataclasses.asdict(c), "ms": t})
            if t < best_total * 0.999:
                best, best_total = c, t
                print(f"[tune] {n}x{k}: {t:.3f} ms with {c}", flush=True)
        L.set_config(q, n, k, best)
        result[f"{n}x{k}"] = {"config": dataclasses.asdict(best), "changed": best != base}
    t1 = time_graph(step, args, reps)
    print(f"[tune] Q={q}: step {t0:.3f} -> {t1:.3f} ms (re-timed with every winner)", flush=True)
    return {"q": q, "before_ms": t0, "after_ms": t1, "best": result, "log": log}


def skip_norm(x, weight, eps, residual=None, sum_out=None):
    """--ablate-norm's stand-in for ``rmsnorm.rms_norm`` (its signature): x as it came, and with a
    residual x as the sum too (the add skipped with the norm)."""
    return x if residual is None else (x, x)


def skip_rope(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, q_norm_weight=None, k_norm_weight=None,
              eps=1e-6, out=None):
    """--ablate-rope's stand-in for ``rope.rope_and_cache`` (its signature): q as projected, the
    cache not written."""
    return q


def profile_without(module, name: str, stand_in, what: str, step, cfg, dev, qs, context, args) -> dict:
    """:func:`profile_qs` again with ``module.name`` replaced by ``stand_in`` (the launchers look it
    up at call time, and each timing captures a new graph), then put back. For the ablations, what
    the replaced kernels cost the step at most (those steps compute wrong values)."""
    kept = getattr(module, name)
    setattr(module, name, stand_in)
    try:
        print(f"[profile] without {what}:", flush=True)
        return profile_qs(step, cfg, dev, qs, context, args.reps, args.batch)
    finally:
        setattr(module, name, kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="profile.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen3 config (smoke test)")
    ap.add_argument("--config", default="qwen3-8b",
                    help="target shapes: a name of examples/bench_cost_model.py's CONFIGS or a checkpoint "
                         "(zoo name, directory) whose config.json is read (default qwen3-8b)")
    ap.add_argument("--batch", type=int, default=1, help="rows of the profiled steps (default 1; --tune needs 1)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--q", default="1,16", help="comma-separated new-token counts to time and profile")
    ap.add_argument("--tune", type=int, default=0, help="tune the linear configs of this Q in the step")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for --tune")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pack", type=int, choices=(1, 2, 3), default=None,
                    help="profile the step with pack_weights_12bit (bf12 weights) in this layout version")
    ap.add_argument("--deployment", default=None,
                    help="lower the linears with this deployment's Triton / cuBLAS choice, as specc compile does "
                         "(h200-bs1: cuBLAS from 65 rows; default: the Triton linears everywhere)")
    ap.add_argument("--attention-sweep", default=None,
                    help="a sweep_attention.py JSON: also time the steps with its fastest plans")
    ap.add_argument("--ablate-norm", action="store_true",
                    help="also time the steps with the separate rms_norm kernels skipped (the norm_linear and "
                         "packed linears of more than one row pass x through un-normalized): what fusing every "
                         "norm into its linear could gain at most. Timing only: those steps' logits are wrong")
    ap.add_argument("--ablate-rope", action="store_true",
                    help="also time the steps with the rope_and_cache kernels skipped (attention reads q as "
                         "projected and the cache unwritten): what fusing rope into attention could gain at most. "
                         "Timing only")
    ap.add_argument("--unfuse-norm", action="store_true",
                    help="also time the steps with every Triton linear's norm prologue run as the rms_norm kernel "
                         "before it (LinearConfig.norm_prologue=False; the same values, one launch more a norm)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if args.tune and args.batch != 1:
        ap.error("--tune tunes the batch-1 step: leave --batch at 1")
    from examples.bench_cost_model import target_shapes

    cfg = tiny(QWEN3_8B) if args.tiny else (QWEN3_8B if args.config == "qwen3-8b" else target_shapes(args.config))
    context = min(args.context, 64) if args.tiny else args.context
    from specc.passes.pipelines import DEFAULT_PIPELINE

    pipeline = DEFAULT_PIPELINE.replace("dce", "pack_weights_12bit,dce") if args.pack else None
    rule = None
    if args.deployment:
        from specc.search.calibrate import linear_choice_for
        from specc.search.deployments import get_deployment

        rule = linear_choice_for(get_deployment(args.deployment))
    step, _, shapes = build_step(cfg, dtype, dev, context + 128, args.batch, pipeline,
                                 {"pack_version": args.pack} if args.pack else None, rule)
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "config": "tiny" if args.tiny else args.config, "batch": args.batch,
           "context": context, "linear_shapes": shapes, "pack": args.pack,
           "linear_rule": None if rule is None else rule.source, "steps": {}}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass
    qs = [int(v) for v in args.q.split(",")]
    res["steps"] = profile_qs(step, cfg, dev, qs, context, args.reps, args.batch)
    if args.attention_sweep:
        use_swept_attention(args.attention_sweep)
        print(f"[profile] with the swept attention plans of {args.attention_sweep}:", flush=True)
        res["steps_with_swept_attention"] = profile_qs(step, cfg, dev, qs, context, args.reps, args.batch)
    if args.ablate_norm:
        from specc.codegen.kernels import rmsnorm

        res["steps_without_norm_kernels"] = profile_without(
            rmsnorm, "rms_norm", skip_norm, "the separate rms_norm kernels (timing only; wrong values)", step, cfg,
            dev, qs, context, args)
    if args.ablate_rope:
        from specc.codegen.kernels import rope

        res["steps_without_rope_kernels"] = profile_without(
            rope, "rope_and_cache", skip_rope, "the rope_and_cache kernels (timing only; wrong values)", step, cfg,
            dev, qs, context, args)
    if args.unfuse_norm:
        from specc.codegen.kernels import linear as L

        shipped = L.get_config
        res["steps_norm_unfused"] = profile_without(
            L, "get_config", lambda m, n, k: shipped(m, n, k).replace(norm_prologue=False),
            "the linears' norm prologues (the rms_norm kernel first; same values)", step, cfg, dev, qs, context, args)
    if args.tune:
        res["tune"] = tune(step, cfg, dev, args.tune, context, shapes,
                           time.time() + args.budget, args.reps)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
