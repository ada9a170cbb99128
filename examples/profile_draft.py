"""Where the compiled DFlash-b16 draft step spends its time at Qwen3-8B shapes (random weights).

The draft step reads the target's hidden states of the newly committed tokens (context), runs the
drafter's layers over the block and projects the block through the target's lm_head. Its weights
are ~1 GB of drafter layers plus the 1.2 GB lm_head, a ~0.5 ms floor at HBM speed; this profiles
a CUDA-graph replay per kernel (``examples/profile_step.kernel_profile``) so the gap is visible.

    PYTHONPATH=. python3 examples/profile_draft.py --out $OUT/profile_draft.json
    PYTHONPATH=. python3 examples/profile_draft.py --pipelines 'PIPELINE A;PIPELINE B'   # same run, two pipelines
"""

from __future__ import annotations

import argparse
import json

import torch

from examples.bench_steps import QWEN3_8B, build_causal, build_dflash, compiled_system, dflash_config, time_graph
from examples.profile_step import captured_graph, kernel_profile


def launch_latency(step, args, reps: int = 20, burst: int = 10) -> dict:
    """What a graph replay costs when the GPU waits for it (at batch 1 the draft is launched after
    the step's host copy, onto an idle GPU) against replays queued back to back (launch hidden):
    ``idle_ms`` (sync, replay, sync: CUDA events around one replay), ``back_to_back_ms`` (per replay
    of ``burst`` queued ones) and ``replay_host_us`` (host time of the ``replay()`` call)."""
    import statistics
    import time

    with torch.inference_mode():
        graph = captured_graph(step, args)
        idle, host, b2b = [], [], []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            t0 = time.perf_counter()
            graph.replay()
            host.append(time.perf_counter() - t0)
            b.record()
            torch.cuda.synchronize()
            idle.append(a.elapsed_time(b))
        for _ in range(max(reps // 4, 3)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()  # the GPU is busy when ``a`` is recorded: no launch waited for inside
            a.record()
            for _ in range(burst):
                graph.replay()
            b.record()
            torch.cuda.synchronize()
            b2b.append(a.elapsed_time(b) / burst)
    return {"idle_ms": statistics.median(idle), "back_to_back_ms": statistics.median(b2b),
            "replay_host_us": 1e6 * statistics.median(host)}


def main() -> None:
    from specc.models.dflash import DFlashDrafter
    from specc.passes.pipelines import DEFAULT_PIPELINE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--ctx-tokens", type=int, default=8, help="newly committed tokens fed as context")
    ap.add_argument("--pipelines", default=DEFAULT_PIPELINE,
                    help="pass pipelines to compare in one run, separated by ';' (default: the compile default)")
    ap.add_argument("--out", default="profile_draft.json")
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    ids_ = [1, 9, 17, 25, 33]
    dcfg = dflash_config(QWEN3_8B, ids_)
    target = build_causal(QWEN3_8B, dtype, dev, seed=1)
    draft = build_dflash(dcfg, dtype, dev, seed=3)
    target.capture_layers = ()
    module = DFlashDrafter(draft, target.embed_tokens, target.lm_head)
    n, c = args.ctx_tokens, args.context
    block = torch.randint(0, QWEN3_8B["vocab_size"], (1, 16), device=dev)
    hidden = torch.randn(1, n, len(ids_) * QWEN3_8B["hidden_size"], device=dev, dtype=dtype)
    pos = torch.arange(c - n, c + 16, device=dev)[None]
    step_args = (block, hidden, pos, torch.tensor([c - n], device=dev))
    weights = float(sum(p.numel() * p.element_size() for p in draft.parameters())) \
        + float(target.lm_head.weight.numel() * target.lm_head.weight.element_size())
    runs = []
    for pipeline in [p.strip() for p in args.pipelines.split(";") if p.strip()]:
        system, _ = compiled_system(target, module, "dflash", 15, draft.spec, args.context + 128, graphs=False,
                                    pipeline=pipeline)
        d_step = system.drafter.drafter
        ms = time_graph(d_step, step_args)
        launch = launch_latency(d_step, step_args)
        prof = kernel_profile(d_step, step_args)
        logits = d_step(*step_args).float()
        print(f"[draft] {pipeline}: {ms:.3f} ms graphed; kernels {prof['kernel_us_per_step']:.1f} us, span "
              f"{prof['span_us_per_step']:.1f} us, {prof['launches_per_step']:.0f} launches; weight floor "
              f"{weights / 4.8e12 * 1e3:.3f} ms at 4.8 TB/s")
        for r in prof["kernels"][:12]:
            print(f"    {r['us_per_step']:9.1f} us  x{r['calls_per_step']:4.0f}  {r['kernel']}")
        print(f"[draft] launch from an idle GPU: {launch['idle_ms']:.3f} ms per replay vs {launch['back_to_back_ms']:.3f} "
              f"back to back; replay() returns after {launch['replay_host_us']:.1f} us on the host")
        runs.append({"pipeline": pipeline, "ms": ms, **launch, **prof, "argmax": logits.argmax(-1).tolist()})
        del system
    if len(runs) > 1:  # the same drafts from every pipeline (bf16: a differing position is reported, not hidden)
        for r in runs[1:]:
            r["argmax_differs_from_first_at"] = [i for i, (a, b) in enumerate(zip(r["argmax"][0], runs[0]["argmax"][0]))
                                                 if a != b]
            print(f"[draft] {r['pipeline']}: {r['ms'] / runs[0]['ms']:.3f}x the first pipeline's time; drafts differ at "
                  f"{r['argmax_differs_from_first_at']}")
    with open(args.out, "w") as f:
        json.dump({"weight_bytes": weights, "context": c, "ctx_tokens": n, "runs": runs,
                   **{k: v for k, v in runs[0].items() if k != "pipeline"}}, f, indent=1)


if __name__ == "__main__":
    main()
