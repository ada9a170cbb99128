"""`specc compile`, `specc run`, `specc verify`: build, use and re-check compiled artifacts."""

from __future__ import annotations

from specc.methods import method_names

import sys

from specc.cli.common import add_prompt_args, check_ids_in_vocab, emit_result, positive


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile MODEL (+ drafter) for a deployment into an artifact",
                       description="Load, trace, run the deployment's passes, generate Triton-backed modules, check "
                       "them token by token against stock on calibration prompts, and write the artifact. "
                       "Refuses (exit 1) to write an artifact that fails verification.")
    p.add_argument("model", metavar="MODEL", help="target checkpoint: local directory, hub id or zoo name")
    p.add_argument("--drafter", metavar="D", help="drafter checkpoint (AR causal LM, PARD or DFlash)")
    p.add_argument("--method", choices=method_names(), help="default: from the drafter (`specc methods`)")
    p.add_argument("--deployment", default="cpu", metavar="NAME",
                   help="deployment profile (`specc deployments`), or a .toml/.json file (default: cpu)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="artifact directory to write (e.g. model.specc)")
    p.add_argument("--passes", metavar="LIST",
                   help="pass pipeline, comma separated; '+module:Class' adds a user pass; '' for none "
                   "(default: the deployment's pipeline)")
    p.add_argument("--prompts", metavar="FILE", help="calibration prompts (JSON list of strings/id lists, or lines)")
    p.add_argument("--num-draft", type=int, metavar="K", help="drafted tokens per step")
    p.add_argument("--verify-tokens", type=int, default=24, metavar="N", help="tokens per prompt checked (default 24)")
    p.add_argument("--memory", metavar="FILE",
                   help="search memory to choose the pipeline from (default: ~/.cache/specc/memory or $SPECC_MEMORY_DIR)")
    p.add_argument("--tree", default="auto", metavar="auto|off|N",
                   help="tree verification: auto (default; where the method drafts per-position distributions, "
                   "measure rank acceptance on the calibration prompts and let the cost model pick a node budget "
                   "or the chain), off, or N drafted nodes per step")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(handler=run_compile)

    r = sub.add_parser("run", help="generate with a compiled artifact",
                       description="Greedy generation with a compiled artifact (same JSON shape as `specc generate`).")
    r.add_argument("artifact", metavar="ARTIFACT")
    add_prompt_args(r)
    r.add_argument("--device", help="override the artifact's device (e.g. cpu)")
    r.add_argument("--stream", action="store_true", help="print tokens as they are committed")
    r.add_argument("--profile", action="store_true", help="also time prefill / draft / verify / accept")
    r.set_defaults(handler=run_run)

    v = sub.add_parser("verify", help="re-run token forcing of an artifact against stock",
                       description="Token forcing: run stock on prompts, feed its tokens through the compiled system, "
                       "compare the argmax at every position; ties (stock top-2 margin below the tolerance) are "
                       "reported, every other mismatch fails (exit 1).")
    v.add_argument("artifact", metavar="ARTIFACT")
    v.add_argument("--model", help="target checkpoint if it moved since compile (default: the recorded name)")
    v.add_argument("--drafter", help="drafter checkpoint if it moved since compile")
    v.add_argument("--prompts", metavar="FILE", help="prompts file (default: the built-in calibration set)")
    v.add_argument("--tokens", type=int, default=24, metavar="N", help="tokens per prompt (default 24)")
    v.add_argument("--tolerance", type=float, help="tie margin (default: the artifact's)")
    v.add_argument("--fp32-audit", action="store_true",
                   help="ask stock again in fp32 about each mismatch above the tolerance: one within stock's own "
                        "rounding error on the two logits is reported as an fp32-audited tie, not a failure")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(handler=run_verify)


def run_compile(args) -> int:
    import json

    from specc.compiler import VerificationFailed, compile_artifact

    positive(args.num_draft, "--num-draft")
    positive(args.verify_tokens, "--verify-tokens")
    status = None
    if not args.json:
        from rich.console import Console

        console = Console(stderr=True)

        def status(msg: str) -> None:
            console.print(f"[dim]specc:[/dim] {msg}")
    try:
        result = compile_artifact(args.model, args.drafter, method=args.method, deployment=args.deployment, out=args.out,
                                  passes=args.passes, prompts_file=args.prompts, num_draft=args.num_draft,
                                  max_new_tokens=args.verify_tokens, progress=status, memory=args.memory,
                                  tree=args.tree)
    except VerificationFailed as exc:
        print(f"specc: verification failed, no artifact written: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.manifest))
    else:
        print("\n".join(result.summary_lines))
    return 0


def _load_engine(path, device=None, max_len=2048):
    from specc.codegen.artifact import ArtifactError
    from specc.errors import UserError
    from specc.runtime.engine import load

    try:
        return load(path, device, max_len=max_len)
    except ArtifactError as exc:
        raise UserError(str(exc)) from exc


def run_run(args) -> int:
    from specc.cli.common import prompt_ids

    positive(args.max_new_tokens, "--max-new-tokens")
    engine = _load_engine(args.artifact, args.device)
    ids, tokenizer = prompt_ids(args, engine.path)
    check_ids_in_vocab(ids, int(engine.manifest["model"]["vocab_size"]))
    engine.set_max_len(len(ids) + args.max_new_tokens + 1)
    if args.stream and not args.json:
        for tok in engine.stream(ids, args.max_new_tokens):
            sys.stdout.write((tokenizer.decode([tok]) if tokenizer else f"{tok} "))
            sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    result = engine.generate(ids, args.max_new_tokens, profile=args.profile)
    extra = {"engine": "compiled", "tokens_per_s": engine.last_stats["tokens_per_s"]}
    if args.profile:
        extra["part_seconds"] = engine.last_stats["part_seconds"]
        if not args.json:
            print("time per part: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in extra["part_seconds"].items()),
                  file=sys.stderr)
    emit_result(result, args, tokenizer, extra)
    return 0


def run_verify(args) -> int:
    import json

    import torch

    from specc.pairing import resolve_pair
    from specc.stock.runner import StockSystem
    from specc.verify import Fp32Referee, calibration_prompts, load_prompts_file, run_stock_reference, verify_system

    engine = _load_engine(args.artifact)
    m = engine.manifest
    pair = resolve_pair(args.model or m["model"]["name"],
                        args.drafter or (m["drafter"]["name"] if m["drafter"] else None), m["method"])
    vocab = int(m["model"]["vocab_size"])
    prompts = load_prompts_file(args.prompts, engine.tokenizer, vocab) if args.prompts else calibration_prompts(engine.tokenizer, vocab)
    engine.set_max_len(max(len(p) for p in prompts) + args.tokens + 1)
    dep = m["deployment"]
    stock = StockSystem(pair, m.get("num_draft") or None, getattr(torch, dep["dtype"]), engine.device)
    runs = run_stock_reference(pair, prompts, args.tokens, stock=stock)
    tol = args.tolerance if args.tolerance is not None else m["tolerances"]["tie_margin"]
    referee = Fp32Referee(stock.target) if args.fp32_audit else None
    report = verify_system(engine, runs, tol, pair.eos_token_ids, referee=referee)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(report.summary())
    return 0 if report.passed else 1
