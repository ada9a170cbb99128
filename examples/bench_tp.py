"""Tensor-parallel benchmark: a target sharded over 2 GPUs (torch.distributed, NCCL) against 1 GPU.

For each target (random weights in real shapes: Qwen3-8B and a Qwen3-32B-shaped model) one run
measures, on one machine:

1. **Token forcing** in the compute dtype (bf16 on GPU): the 1-GPU model's greedy tokens after a
   prompt are forced through the sharded target (prefill + verify blocks of ``--block`` tokens);
   mismatching positions are counted, and a mismatch is a numerical tie when the 1-GPU top-2
   logit margin there is below ``--tie-tol``. Also the max |logit difference|.
2. **Step times** at Q = ``--qs`` new tokens after ``--context`` cached tokens (median of
   ``--repeats`` after a warm-up, a barrier before each): the unsharded step on 1 GPU vs the
   sharded step (slowest rank), with an ``all_reduce`` of one step's message (1 x Q x hidden)
   timed alone beside it, x 2 per layer. ``--step compiled`` (default): specc's generated steps
   (the compiler's default pipeline, Triton kernels), each captured in a CUDA graph (NCCL
   all-reduces inside) and timed by CUDA events; ``--step ir``: the traced IR run eagerly (torch
   ops, wall time; its attention syncs the host once per layer).
3. Weight bytes held per rank vs on 1 GPU (from the IRs).
4. With ``--speculative K``: speculative decoding with the sharded target and a replicated
   drafter (``TPSpecJob``: ``--spec-method`` ar-draft or pard; the drafter is the target's config
   cut to ``--drafter-layers`` layers with another seed, random weights, so acceptance is low and
   only the exactness and the loop's speed mean something): every rank's tokens vs the 1-GPU
   greedy tokens (in bf16 a near-tie may legitimately diverge: the first differing position is
   reported), tau and tokens/s of a generation after a warm-up one.

Random weights say nothing about acceptance; this checks the sharded target's verify path and
measures its step time.

    PYTHONPATH=. python3 examples/bench_tp.py --out $OUT/tp.json          # nvidia-h200-x2
    PYTHONPATH=. python3 examples/bench_tp.py --device cpu --tiny         # CPU smoke run (gloo)

NCCL_NVLS_ENABLE=0 is set before any process group exists (specc.parallel.launch.RANK_ENV).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

QWEN3_8B = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                max_position_embeddings=40960, tie_word_embeddings=False, eos_token_id=151645)
QWEN3_32B = dict(QWEN3_8B, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64)
MODELS = {"qwen3-8b": QWEN3_8B, "qwen3-32b": QWEN3_32B}
PROMPT = [151643, 872, 3555, 374, 279, 6722, 315, 9625, 30, 151645, 198]


def tiny(cfg: dict, layers: int = 4) -> dict:
    """The same family at toy size (the 32B shape keeps more query heads than hidden / head_dim)."""
    return dict(cfg, vocab_size=512, hidden_size=64, intermediate_size=128, num_key_value_heads=2, head_dim=16,
                num_attention_heads=max(4, cfg["num_attention_heads"] // 8), num_hidden_layers=layers, eos_token_id=511)


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def forcing_report(ref, res, tie_tol: float) -> dict:
    want = ref.argmax
    margins = ref.margins
    per_rank = []
    for rank, got in enumerate(res.argmax):
        bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        ties = [i for i in bad if margins[i] < tie_tol]
        per_rank.append({"rank": rank, "mismatches": len(bad), "ties": len(ties),
                         "non_tie_mismatches": [[i, round(margins[i], 5)] for i in bad if i not in ties]})
    diff = (res.logits - ref.logits).abs()
    return {"positions": len(want), "per_rank": per_rank, "max_abs_logit_diff": float(diff.max()),
            "max_rel_logit_diff": float(diff.max() / ref.logits.abs().max().clamp_min(1e-30)),
            "min_reference_margin": min(margins) if margins else None,
            "tokens_identical": all(r["mismatches"] == 0 for r in per_rank),
            "max_logit_diff_vs_rank0": res.rank_logit_diff,
            "non_tie_mismatches": sum(len(r["non_tie_mismatches"]) for r in per_rank)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tp.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke run)")
    ap.add_argument("--models", default="qwen3-8b,qwen3-32b")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--layers", type=int, default=None, help="truncate the targets to this many layers")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens of the 1-GPU run to force")
    ap.add_argument("--block", type=int, default=4, help="verify block size while forcing")
    ap.add_argument("--qs", default="1,4,16", help="new tokens per timed step")
    ap.add_argument("--context", type=int, default=1024, help="cached tokens before a timed step")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tie-tol", type=float, default=0.0625, help="top-2 margin below which a mismatch is a tie")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", default="sharded", choices=["sharded", "full"],
                    help="sharded: each rank materialises only its slices; full: whole model per rank, then shard")
    ap.add_argument("--speculative", type=int, default=0, metavar="K",
                    help="also run speculative decoding with K drafted tokens per step (0: off)")
    ap.add_argument("--spec-method", default="ar-draft", choices=["ar-draft", "pard"])
    ap.add_argument("--drafter-layers", type=int, default=2)
    ap.add_argument("--step", default="compiled", choices=["compiled", "ir"],
                    help="compiled: specc's generated steps, CUDA-graphed on the GPU; ir: the traced IR, eager")
    ap.add_argument("--start-method", default=None, choices=["spawn", "fork"],
                    help="how ranks start (default: spawn on cuda, fork on cpu)")
    args = ap.parse_args(argv)

    from specc.parallel import (COMPILED_PASSES, DEFAULT_PASSES, RANK_ENV, TPJob, TPSpecJob, reference_run,
                               run_tp)

    os.environ.update(RANK_ENV)
    if args.device == "cpu":
        torch.set_num_threads(1)  # tiny shapes; the ranks get one thread each as well
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    qs = [int(q) for q in args.qs.split(",")]
    context = args.context
    if args.tiny:
        context = min(context, 32)
    timing = {"qs": qs, "context": context, "repeats": args.repeats, "warmup": args.warmup}
    ref_device = "cuda:0" if args.device == "cuda" else "cpu"
    result: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                    "gpus": torch.cuda.device_count() if args.device == "cuda" else 0, "torch": torch.__version__,
                    "nccl": _nccl_version() if args.device == "cuda" else None,
                    "env": {k: os.environ.get(k) for k in RANK_ENV}, "world_size": args.world, "dtype": dtype,
                    "timing": timing, "tokens": args.tokens, "block": args.block, "tiny": args.tiny, "load": args.load,
                    "step": args.step, "models": {}}
    compiled = args.step == "compiled"
    passes = COMPILED_PASSES if compiled else DEFAULT_PASSES
    start = time.perf_counter()
    refs, jobs = {}, []
    for name in args.models.split(","):
        cfg = MODELS[name]
        if args.layers:
            cfg = dict(cfg, num_hidden_layers=args.layers)
        if args.tiny:
            cfg = tiny(cfg, args.layers or 4)
        source = {"config": cfg, "seed": args.seed}
        prompt = [t % cfg["vocab_size"] for t in PROMPT]
        t0 = time.perf_counter()
        refs[name] = reference_run(source, prompt, args.tokens, block=args.block, dtype=dtype, device=ref_device,
                                   timing=timing, passes=passes, compiled=compiled)
        print(f"[{name}] 1-device reference: {time.perf_counter() - t0:.1f} s", flush=True)
        jobs.append(TPJob(source, prompt, refs[name].tokens, args.block, dtype, passes, timing=timing, name=name,
                          load=args.load, compiled=compiled))
        if args.speculative:
            dcfg = dict(cfg, num_hidden_layers=args.drafter_layers)
            if args.spec_method == "pard":
                dcfg["pard_token"] = cfg["vocab_size"] - 2
            jobs.append(TPSpecJob(source, {"config": dcfg, "seed": args.seed + 1}, prompt, args.tokens,
                                  args.spec_method, args.speculative, dtype, name=name))
    t0 = time.perf_counter()
    results = run_tp(jobs, args.world, device=args.device, start_method=args.start_method)
    print(f"{args.world} ranks: {time.perf_counter() - t0:.1f} s", flush=True)

    for job, res in zip(jobs, results):
        if isinstance(job, TPSpecJob):
            want = refs[job.name].tokens
            first = [next((i for i, (a, b) in enumerate(zip(t, want)) if a != b), None) for t in res.tokens]
            result["models"][job.name]["speculative"] = {
                "method": job.method, "num_draft": job.num_draft, "drafter_layers": args.drafter_layers,
                "tokens_identical": all(t == want for t in res.tokens), "first_difference": first,
                "tau": res.tau, "tokens_per_s": res.tokens_per_s, "target_all_reduce": res.target_all_reduce}
            continue
        ref, name = refs[job.name], job.name
        cfg = job.source["config"]
        layers = cfg["num_hidden_layers"]
        steps = {}
        for q in qs:
            one = ref.step_times[q]["median_s"]
            tp = max(r[q]["median_s"] for r in res.step_times)
            ar = max(r[q]["median_s"] for r in res.all_reduce_times)
            steps[str(q)] = {"one_device_ms": one * 1e3, "tp_ms": tp * 1e3, "speedup": one / tp,
                             "all_reduce_us": ar * 1e6, "all_reduce_bytes": res.all_reduce_times[0][q]["bytes"],
                             "all_reduces_per_step": 2 * layers, "all_reduce_share_ms": 2 * layers * ar * 1e3,
                             "tp_ms_per_rank": [r[q]["median_s"] * 1e3 for r in res.step_times]}
        fps = {w["embedding_fingerprint"] for w in res.weights} | {ref.weights["embedding_fingerprint"]}
        result["models"][name] = {
            "config": {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "vocab_size")},
            "forcing": forcing_report(ref, res, args.tie_tol),
            "steps": steps,
            "weights": {"one_device": ref.weights, "per_rank": res.weights,
                        "layer_linear_ratio": [w["layer_linear_weight_bytes"] / ref.weights["layer_linear_weight_bytes"]
                                               for w in res.weights]},
            "same_weights_everywhere": len(fps) == 1,
            "pass_stats": res.pass_stats,
            "step_class": res.step,
        }
    result["seconds"] = time.perf_counter() - start

    print(f"\ntensor parallel, {args.world} x {result['device']}, {dtype}, torch {torch.__version__}")
    print(f"{'model':<10} {'forced':>6} {'mismatch':>8} {'ties':>5} {'max|dlogit|':>11} {'GB/rank':>8} {'GB 1-dev':>8} "
          f"{'peak GB/rank':>12}")
    for name, m in result["models"].items():
        f, w = m["forcing"], m["weights"]
        mism = sum(r["mismatches"] for r in f["per_rank"])
        ties = sum(r["ties"] for r in f["per_rank"])
        peak = max((x["peak_device_bytes"] or 0) for x in w["per_rank"]) / 1e9
        print(f"{name:<10} {f['positions']:>6} {mism:>8} {ties:>5} {f['max_abs_logit_diff']:>11.4g} "
              f"{w['per_rank'][0]['parameter_bytes'] / 1e9:>8.3f} {w['one_device']['parameter_bytes'] / 1e9:>8.3f} "
              f"{peak:>12.3f}")
    print(f"\n{'model':<10} {'Q':>3} {'1-dev ms':>9} {'TP ms':>9} {'speedup':>7} {'AR us':>8} {'2L x AR ms':>10}")
    for name, m in result["models"].items():
        for q, s in m["steps"].items():
            print(f"{name:<10} {q:>3} {s['one_device_ms']:>9.3f} {s['tp_ms']:>9.3f} {s['speedup']:>7.2f} "
                  f"{s['all_reduce_us']:>8.1f} {s['all_reduce_share_ms']:>10.3f}")
    for name, m in result["models"].items():
        sp = m.get("speculative")
        if sp:
            print(f"\n{name} speculative ({sp['method']}, k = {sp['num_draft']}): tokens identical to 1-device greedy "
                  f"{sp['tokens_identical']} (first difference per rank {sp['first_difference']}), tau {sp['tau']}, "
                  f"tokens/s per rank {[round(v, 1) for v in sp['tokens_per_s']]}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()
