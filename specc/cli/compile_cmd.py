"""`specc compile`, `specc run`, `specc verify`: build, use and re-check compiled artifacts."""

from __future__ import annotations

import argparse
import math
import sys

from specc.cli.common import (add_prompt_args, add_sampling_args, check_budget, emit_result, finite_non_negative,
                              positive, sampling_json, sampling_params)
from specc.errors import UserError, auto_off_or_int
from specc.methods import method_names


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile MODEL (+ drafter) for a deployment into an artifact",
                       description="Load, trace, run the deployment's passes, generate Triton-backed modules, check "
                       "them token by token against stock on calibration prompts, and write the artifact. "
                       "Refuses (exit 1) to write an artifact that fails verification.",
                       epilog="""examples:
  specc compile specc-tiny --drafter specc-tiny-dflash --deployment cpu -o tiny.specc
  specc compile specc-tiny --drafter specc-tiny-pard --deployment cpu -o pard.specc --passes fuse_qkv,dce
  specc compile Qwen/Qwen3-8B --drafter z-lab/Qwen3-8B-DFlash-b16 --deployment h200-bs1 -o q8.specc
""", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="target checkpoint: local directory, hub id or zoo name")
    p.add_argument("--drafter", metavar="D", help="drafter checkpoint (AR causal LM, PARD or DFlash)")
    p.add_argument("--method", choices=method_names(), help="default: from the drafter (`specc methods`)")
    p.add_argument("--deployment", default="cpu", metavar="NAME",
                   help="deployment profile (`specc deployments`), or a .toml/.json file (default: cpu)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="artifact directory to write (e.g. model.specc)")
    p.add_argument("--passes", metavar="LIST",
                   help="pass pipeline, comma separated; '+module:Class' adds a user pass; '' for none "
                   "(default: the deployment's pipeline)")
    p.add_argument("--drafter-passes", metavar="LIST",
                   help="the drafter's own pass pipeline (default: the target's), e.g. the target's passes without "
                   "pack_weights_12bit to keep the drafter in bf16")
    p.add_argument("--prompts", metavar="FILE", help="calibration prompts (JSON list of strings/id lists, or lines)")
    p.add_argument("--num-draft", type=int, metavar="K", help="drafted tokens per step")
    p.add_argument("--verify-tokens", type=int, default=24, metavar="N", help="tokens per prompt checked (default 24)")
    p.add_argument("--memory", metavar="FILE",
                   help="search memory to choose the pipeline from (default: ~/.cache/specc/memory or $SPECC_MEMORY_DIR)")
    p.add_argument("--tree", default="auto", metavar="auto|off|N",
                   help="tree verification: auto (default; where the method drafts per-position distributions, "
                   "measure rank acceptance on the calibration prompts and let the cost model pick a node budget "
                   "or the chain), off, or N drafted nodes per step")
    p.add_argument("--two-level", default="auto", metavar="auto|off|K1",
                   help="two-level verification: auto (default; for a batch > 1 deployment the cost model prices "
                   "one level, two-level at each K1 and per-request k with the measured acceptance and the artifact "
                   "records the choice), off, or K1 drafts (1..k-1) verified in level 1")
    p.add_argument("--linears", default="auto", metavar="auto|triton|FILE",
                   help="linear implementations: auto (default; cuBLAS for the shapes and row counts where the "
                   "calibrated deployment measured it faster than the Triton kernel, `specc calibrate`), triton "
                   "(Triton everywhere), or a linear choice table (JSON, docs/kernels.md)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(handler=run_compile)

    r = sub.add_parser("run", help="generate with a compiled artifact",
                       description="Generation with a compiled artifact (same JSON shape as `specc generate`): "
                       "greedy, or speculative sampling with --temperature > 0.",
                       epilog="""examples:
  specc run tiny.specc --prompt "def fibonacci(n):"
  specc run tiny.specc --input-ids 1,2,3 --max-new-tokens 32 --json --profile
  specc run tiny.specc --input-ids 1,2,3 --max-new-tokens 32 --profile events
  specc run tiny.specc --prompts prompts.json --batch-size 8 --json
  specc run tiny.specc --prompt "import os" --temperature 0.7 --top-p 0.9 --seed 1
""", formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("artifact", metavar="ARTIFACT")
    add_prompt_args(r)
    r.add_argument("--device", help="override the artifact's device (e.g. cpu)")
    r.add_argument("--expect-hash", metavar="SHA256",
                   help="refuse the artifact unless its manifest.json has this sha256 (printed by `specc compile`)")
    r.add_argument("--stream", action="store_true", help="print tokens as they are committed")
    r.add_argument("--profile", nargs="?", const="sync", choices=("sync", "events"), default=None,
                   help="also time prefill / draft / verify / accept per part: 'sync' (the default) "
                   "synchronises at each part's end (wall time); 'events' times the device between CUDA "
                   "events without synchronising (the parts add up to the run; 'between' is the host's "
                   "time between steps)")
    add_sampling_args(r)
    r.set_defaults(handler=run_run)

    v = sub.add_parser("verify", help="re-run token forcing of an artifact against stock",
                       description="Token forcing: run stock on prompts, feed its tokens through the compiled system, "
                       "compare the argmax at every position; ties (stock top-2 margin below the tolerance) are "
                       "reported, every other mismatch fails (exit 1).",
                       epilog="""examples:
  specc verify tiny.specc
  specc verify q8.specc --tokens 64 --fp32-audit --json
""", formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("artifact", metavar="ARTIFACT")
    v.add_argument("--model", help="target checkpoint if it moved since compile (default: the recorded name)")
    v.add_argument("--drafter", help="drafter checkpoint if it moved since compile")
    v.add_argument("--prompts", metavar="FILE", help="prompts file (default: the built-in calibration set)")
    v.add_argument("--tokens", type=int, default=24, metavar="N", help="tokens per prompt (default 24)")
    v.add_argument("--tolerance", type=float, help="tie margin (default: the artifact's)")
    v.add_argument("--fp32-audit", action="store_true",
                   help="ask stock again in fp32 about each mismatch above the tolerance: one where fp32 prefers "
                        "stock's token by no more than stock's own rounding error on the two logits (or prefers the "
                        "compiled token) is reported as an fp32-audited tie, not a failure")
    v.add_argument("--expect-hash", metavar="SHA256", help="refuse the artifact unless its manifest.json has this sha256")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(handler=run_verify)


def run_compile(args) -> int:
    import json

    from specc.compiler import VerificationFailed, compile_artifact

    positive(args.num_draft, "--num-draft")
    positive(args.verify_tokens, "--verify-tokens")
    two_level = auto_off_or_int(args.two_level, "--two-level", "a level-1 draft count K1")
    if two_level not in ("auto", "off"):
        if two_level < 1:
            raise UserError(f"--two-level K1 needs K1 >= 1 (got {two_level}; --two-level off for one level)")
    if args.verify_tokens > 1 << 16:
        raise UserError(f"--verify-tokens {args.verify_tokens} is more than {1 << 16}")
    from specc.cli.progress import Progress

    try:
        with Progress.for_args(args) as progress:
            result = compile_artifact(args.model, args.drafter, method=args.method, deployment=args.deployment,
                                      out=args.out, passes=args.passes, drafter_passes=args.drafter_passes,
                                      prompts_file=args.prompts,
                                      num_draft=args.num_draft, max_new_tokens=args.verify_tokens,
                                      progress=progress, memory=args.memory,
                                      tree=args.tree, two_level=two_level,
                                      linear_choice={"auto": None, "triton": False}.get(args.linears, args.linears))
    except VerificationFailed as exc:
        print(f"specc: verification failed, no artifact written: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(dict(result.manifest, manifest_sha256=result.manifest_hash)))
    else:
        print("\n".join(result.summary_lines))
    return 0


def _load_engine(path, device=None, max_len=2048, expect_hash=None, warmup=False, progress=None):
    from specc.codegen.artifact import ArtifactError
    from specc.errors import UserError
    from specc.runtime.engine import load

    if device is not None:
        import torch

        try:
            kind = torch.device(device).type
        except RuntimeError:
            raise UserError(f"--device {device!r} is not a torch device") from None
        if kind not in ("cpu", "cuda"):
            raise UserError(f"--device {device!r}: only cpu and cuda are supported")
    try:
        return load(path, device, max_len=max_len, expect_hash=expect_hash, warmup=warmup, progress=progress)
    except ArtifactError as exc:
        raise UserError(str(exc)) from exc


def _check_engine_budget(engine, prompt_len: int, new_tokens: int, flag: str, rows: int = 1) -> None:
    """Positions and cache memory of a generation (``rows`` decoded together) with a loaded
    artifact, before allocating."""
    import torch

    from specc.runtime.state import StateSpec

    per_token = 0
    for role, info in engine.manifest["steps"].items():
        if role in ("target_tree", "target_ragged"):
            continue  # they run on the target's decoding state: no memory of their own
        for name, c in info["caches"].items():
            spec = StateSpec.from_manifest(name, c)  # per-position bytes: the slot shape x the dtype's size
            per_token += math.prod(spec.shape) * torch.finfo(getattr(torch, spec.dtype or "float32")).bits // 8
    positions = engine.manifest["model"].get("max_position_embeddings")
    check_budget(prompt_len, new_tokens, positions if isinstance(positions, int) else None, per_token * rows,
                 engine.device, flag)


class _ArtifactRuns:
    """Errors raised by an artifact's generated code (a manifest that does not fit its modules)
    become one line naming the artifact instead of a traceback."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None and issubclass(kind, (RuntimeError, AttributeError, IndexError, KeyError, TypeError,
                                                  ValueError)) and not issubclass(kind, UserError):
            raise UserError(f"{self.path}: the artifact failed while running ({kind.__name__}: "
                            f"{' '.join(str(exc).split())[:300]}); is it intact and from this specc version?") from exc
        return False


def run_run(args) -> int:
    from specc.cli.common import prompt_list

    from specc.cli.progress import Progress

    positive(args.max_new_tokens, "--max-new-tokens")
    sampling = sampling_params(args)
    if args.prompts is not None and (args.stream or args.profile):
        raise UserError("--stream and --profile take one prompt (--prompt or --input-ids), not --prompts")
    with Progress.for_args(args) as progress, _ArtifactRuns(args.artifact):  # warm-up runs the artifact's code
        progress(f"loading {args.artifact}")
        engine = _load_engine(args.artifact, args.device, expect_hash=args.expect_hash, warmup=True,
                              progress=lambda msg, seconds: progress(f"{msg} ({seconds:.2f} s)"))
    prompts, tokenizer = prompt_list(args, engine.path, int(engine.manifest["model"]["vocab_size"]))
    if args.prompts is not None:
        return _run_prompts(engine, prompts, tokenizer, args, sampling)
    ids = prompts[0]
    _check_engine_budget(engine, len(ids), args.max_new_tokens, "--max-new-tokens")
    engine.set_max_len(len(ids) + args.max_new_tokens + 1)
    if args.stream and not args.json:
        with _ArtifactRuns(args.artifact):
            for tok in engine.stream(ids, args.max_new_tokens, sampling=sampling):
                sys.stdout.write((tokenizer.decode([tok]) if tokenizer else f"{tok} "))
                sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    with _ArtifactRuns(args.artifact):
        profile = {"sync": True, "events": "events"}.get(args.profile, False)
        result = engine.generate(ids, args.max_new_tokens, profile=profile, sampling=sampling)
    extra = {"engine": "compiled", "sampling": sampling_json(sampling), **run_timings(engine)}
    if args.profile:
        extra["part_seconds"] = engine.last_stats["part_seconds"]
        if not args.json:
            how = "events, not synchronised" if args.profile == "events" else "synchronised"
            parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in extra["part_seconds"].items())
            print(f"time per part ({how}): {parts}", file=sys.stderr)
    emit_result(result, args, tokenizer, extra)
    if not args.json:
        print(timings_line(extra), file=sys.stderr)
    return 0


def _run_prompts(engine, prompts, tokenizer, args, sampling=None) -> int:
    """`specc run --prompts FILE [--batch-size N]`: every prompt through ``Engine.generate_batch``
    (continuous batching, N slots); one result per prompt in order, a throughput line on stderr."""
    from specc.cli.common import emit_results

    batch = min(args.batch_size or len(prompts), len(prompts))
    _check_engine_budget(engine, max(len(p) for p in prompts), args.max_new_tokens, "--max-new-tokens", rows=batch)
    with _ArtifactRuns(args.artifact):
        results = engine.generate_batch(prompts, args.max_new_tokens, batch_size=batch, sampling=sampling)
    s = engine.last_stats
    emit_results(results, args, tokenizer, {"engine": "compiled", "batch_size": batch, "sampling": sampling_json(sampling)})
    print(f"{len(prompts)} prompts, {s['tokens']} tokens in {s['seconds']:.2f} s: {s['tokens_per_s']:,.1f} tok/s "
          f"(batch size {batch})", file=sys.stderr)
    return 0


# engine.load_stats phases, in order: integrity check, the GPU driver's context, weights onto the
# device, the artifact's step modules imported and bound, tokenizer, then the warm-up's kernel
# compilation (or cache load) and CUDA-graph capture
LOAD_PHASES = ("verify", "device_init", "weights", "modules", "tokenizer", "kernels", "graphs")


def run_timings(engine) -> dict:
    """The one-time work (load) apart from time to first token and steady decode."""
    from specc.codegen.kernels.pdl import launch_mode

    s, load = engine.last_stats, engine.load_stats
    return {"tokens_per_s": s["tokens_per_s"], "launch": launch_mode(engine.device),
            "step_graphs": bool(getattr(engine.loop, "step_graphs", False)),
            "load_seconds": load.get("total", 0.0),
            "load_phases_s": {k: load[k] for k in LOAD_PHASES if k in load},
            "kernel_cache": load.get("kernel_cache"),
            "time_to_first_token_s": s["time_to_first_token_s"],
            "decode_tokens_per_s": s["decode_tokens_per_s"], "decode_seconds": s["decode_seconds"],
            "decode_steps": s["decode_steps"], "decode_step_s": s["decode_step_s"],
            "tokens_per_step": s["tokens_per_step"]}


def timings_line(t: dict) -> str:
    phases = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in t["load_phases_s"].items()
                       if v >= 0.005 or k in ("kernels", "graphs"))
    return (f"load {t['load_seconds']:.2f} s ({phases}; one-time) | first token {t['time_to_first_token_s'] * 1e3:.1f} ms"
            f" | decode {t['decode_tokens_per_s']:,.1f} tok/s steady ({t['decode_steps']} steps of "
            f"{t['decode_step_s'] * 1e3:.2f} ms, {t['tokens_per_step']:.2f} tokens/step)")


def run_verify(args) -> int:
    import json

    import torch

    from specc.pairing import resolve_pair
    from specc.stock.runner import StockSystem
    from specc.verify import calibration_prompts, fp32_referee, load_prompts_file, run_stock_reference, verify_system

    from specc.cli.progress import Progress

    positive(args.tokens, "--tokens")
    finite_non_negative(args.tolerance, "--tolerance")
    with Progress.for_args(args) as progress:
        progress(f"loading {args.artifact}")
        engine = _load_engine(args.artifact, expect_hash=args.expect_hash)
        m = engine.manifest
        pair = resolve_pair(args.model or m["model"]["name"],
                            args.drafter or (m["drafter"]["name"] if m["drafter"] else None), m["method"])
        vocab = int(m["model"]["vocab_size"])
        prompts = (load_prompts_file(args.prompts, engine.tokenizer, vocab) if args.prompts
                   else calibration_prompts(engine.tokenizer, vocab))
        _check_engine_budget(engine, max(len(p) for p in prompts), args.tokens, "--tokens")
        engine.set_max_len(max(len(p) for p in prompts) + args.tokens + 1)
        dep = m["deployment"]
        progress(f"loading stock ({pair.target.name}" + (f" + {pair.drafter.name}" if pair.drafter else "") + ")")
        stock = StockSystem(pair, m.get("num_draft") or None, getattr(torch, dep["dtype"]), engine.device)
        progress(f"token forcing on {len(prompts)} prompts x {args.tokens} tokens")
        runs = run_stock_reference(pair, prompts, args.tokens, stock=stock, progress=progress.counter("stock"))
        tol = args.tolerance if args.tolerance is not None else m["tolerances"]["tie_margin"]
        referee, audit = fp32_referee(stock.target) if args.fp32_audit else (None, None)
        with _ArtifactRuns(args.artifact):
            report = verify_system(engine, runs, tol, pair.eos_token_ids, referee=referee,
                                   progress=progress.counter("compiled, forced"), audit=audit)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(report.summary())
    return 0 if report.passed else 1
