"""`specc ir`: trace a step function and print its IR (nodes, shapes, bytes, FLOPs, totals)."""

from __future__ import annotations

import argparse
import json
import sys

from specc.errors import UserError

EPILOG = """\
symbols: B batch rows, Q new tokens per row, C tokens already in the KV cache,
         N target tokens injected as DFlash context (DFlash draft step only),
         T packed tokens of R rows (ragged_verify step only).
examples:
  specc ir specc-tiny --step verify --new-tokens 8 --context 512
  specc ir specc-tiny --step ragged_verify --packed-tokens 40 --rows 8 --totals
  specc ir specc-tiny --drafter specc-tiny-dflash --step draft --brief
  specc ir config.json --config-only --step ar --totals           # Qwen3-8B without weights
  specc ir specc-tiny --step ar --after fuse_qkv,fuse_gate_up,fuse_norm_linear --check
  specc ir specc-tiny --step ar --after fuse_gate_up,+examples.custom_pass:FuseSiluMulDown
"""


def register(sub) -> None:
    p = sub.add_parser(
        "ir", help="print the IR of a step function: nodes, shapes, bytes, FLOPs",
        description="Trace one step function (prefill, ar, draft, verify, tree_verify or ragged_verify) into "
                    "specc's IR and print one line per "
                    "node (name, op kind, output shape, bytes, FLOPs) and the step's totals, as formulas in the "
                    "symbolic sizes and evaluated at the given sizes.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="target checkpoint: directory, zoo name or hub id "
                                                  "(with --config-only also a config.json file)")
    p.add_argument("--drafter", metavar="D", help="drafter checkpoint (AR causal LM, PARD or DFlash); needed by --step draft")
    p.add_argument("--step", choices=("prefill", "ar", "draft", "verify", "tree_verify", "ragged_verify"), default="ar",
                   help="step function to trace (default: ar)")
    p.add_argument("--after", "--passes", dest="passes", metavar="PASS[,PASS]",
                   help="apply these passes first (names from `specc passes`, or +module:Class / +file.py:Class)")
    p.add_argument("--check", action="store_true", help="lint the IR after tracing and after every pass")
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR text before and after every pass into DIR")
    p.add_argument("--batch", "-B", type=int, metavar="N", help="evaluate costs at B = N (default 1)")
    p.add_argument("--new-tokens", "-Q", type=int, metavar="N",
                   help="evaluate at Q = N (default: prefill 128, verify/draft 8, DFlash block size; ar is 1)")
    p.add_argument("--context", "-C", type=int, metavar="N", help="evaluate at C = N cached tokens (default 1024, prefill 0)")
    p.add_argument("--injected", "-N", type=int, metavar="N", help="DFlash: evaluate at N injected context tokens (default 4)")
    p.add_argument("--packed-tokens", "-T", type=int, metavar="N",
                   help="ragged_verify: evaluate at T = N tokens packed over all rows (default 32)")
    p.add_argument("--rows", "-R", type=int, metavar="N", help="ragged_verify: evaluate at R = N rows (default 4)")
    p.add_argument("--config-only", action="store_true",
                   help="build from config.json on the meta device, no weights (for big models)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                   help="weight/activation dtype (default: the checkpoint's torch_dtype)")
    p.add_argument("--brief", action="store_true", help="hide structural nodes (weights, views, sizes)")
    p.add_argument("--formulas", action="store_true", help="show each node's cost formulas too")
    p.add_argument("--totals", action="store_true", help="print only the totals")
    p.add_argument("--json", action="store_true", help="print one JSON object (nodes with formulas and values, totals)")
    p.set_defaults(handler=run)


def _values(args) -> dict[str, int]:
    values = {}
    for flag, key, value in (("--batch", "B", args.batch), ("--new-tokens", "Q", args.new_tokens),
                             ("--context", "C", args.context), ("--injected", "N", args.injected),
                             ("--packed-tokens", "T", args.packed_tokens), ("--rows", "R", args.rows)):
        if value is None:
            continue
        if value < (0 if key == "C" else 1):
            raise UserError(f"{flag} must be >= {0 if key == 'C' else 1} (got {value})")
        values[key] = value
    if ("T" in values or "R" in values) and args.step != "ragged_verify":
        raise UserError("--packed-tokens and --rows size the ragged_verify step only (use --step ragged_verify)")
    if args.step == "ar" and values.get("Q", 1) != 1:
        raise UserError("the ar step has exactly one new token per row: use --step verify for --new-tokens > 1")
    return values


def _load(ref: str, args, what: str):
    """A Loaded model with caches, real weights or (--config-only) on the meta device."""
    from specc.ir import IRError, meta_model, parse_dtype
    from specc.models.config import ConfigError
    from specc.models.loading import CheckpointError

    try:
        if args.config_only:
            return meta_model(ref, dtype=args.dtype)
        from specc.ir.trace import read_config
        from specc.models import load_model

        raw, _ = read_config(ref)
        dtype = parse_dtype(args.dtype or raw.get("dtype") or raw.get("torch_dtype"))  # float32 when unstated
        loaded = load_model(ref, dtype=dtype, with_tokenizer=False)
        loaded.model.setup_caches(1, 16)
        return loaded
    except (CheckpointError, ConfigError, IRError, FileNotFoundError) as exc:
        raise UserError(f"{what}: {exc}") from exc


def build_ir(args):
    """The traced IR the arguments describe (shared with tests)."""
    from specc.ir import IRError, bind_dflash, trace

    if args.step == "draft" and not args.drafter:
        raise UserError("--step draft traces the drafter's step: give the drafter with --drafter D")
    target = _load(args.model, args, "MODEL")
    if target.kind == "dflash":
        raise UserError("MODEL is a DFlash drafter: give the target as MODEL and the drafter with --drafter")
    drafter = _load(args.drafter, args, "--drafter") if args.drafter else None
    if drafter is not None and drafter.config.vocab_size != target.config.vocab_size:
        raise UserError(f"drafter vocabulary ({drafter.config.vocab_size}) differs from the target's "
                        f"({target.config.vocab_size})")
    try:
        if args.step == "draft":
            if drafter.kind == "dflash":
                return trace(bind_dflash(target.model, drafter.model), "draft")
            return trace(drafter.model, "draft")
        if drafter is not None and drafter.kind == "dflash":
            target.model.capture_layers = tuple(drafter.model.spec.target_layer_ids)
        return trace(target.model, args.step)
    except IRError as exc:
        raise UserError(str(exc)) from exc


def run(args) -> int:
    from specc.ir import IRError
    from specc.passes import PassError, PassManager, PipelineError, parse_pipeline

    values = _values(args)
    ir = build_ir(args)
    if args.check:
        try:
            ir.lint()
        except IRError as exc:
            print(f"specc: {exc}", file=sys.stderr)
            return 1
    report = None
    if args.passes or args.dump_ir:
        try:
            pipeline = parse_pipeline(args.passes or "")
        except PipelineError as exc:
            raise UserError(str(exc)) from exc
        try:
            report = PassManager(pipeline, check=args.check, dump_ir=args.dump_ir).run(ir)
        except PassError as exc:
            print(f"specc: {exc}", file=sys.stderr)
            return 1
    if args.json:
        payload = ir.to_dict(values)
        if report is not None:
            payload["passes"] = [dict(name=r.name, changed=r.changed, stats=r.stats, seconds=round(r.seconds, 6),
                                      skipped=r.skipped) for r in report.records]
        json.dump(payload, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from specc.ir.printer import make_console, render

    console = make_console()
    if report is not None and report.records:
        console.print("passes applied:", style="bold")
        console.print(str(report), highlight=False, markup=False)
    render(ir, values, console=console, brief=args.brief, formulas=args.formulas, show_nodes=not args.totals)
    return 0
