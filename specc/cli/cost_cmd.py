"""`specc cost`: the cost model's prediction and gap report for a model (+ drafter) on a deployment.

Needs no weights: the step functions are traced from config.json on the meta device.
"""

from __future__ import annotations

from specc.methods import method_names

import argparse
import json
import sys

from specc.errors import UserError

EPILOG = """\
examples:
  specc cost Qwen3-8B/config.json --deployment h200-bs1                       # AR step
  specc cost Qwen3-8B/config.json --drafter dflash/config.json --deployment h200-bs1 --tau 6.55
  specc cost specc-tiny --drafter specc-tiny-pard --deployment h200-bs16 --acceptance acc.json --sweep
  specc cost Qwen3-8B/config.json --deployment h200-bs1 --nodes --json         # per-node costs + formulas
  specc cost Qwen3-8B/config.json --drafter dflash/config.json --deployment h200-bs16 --tau 6.55 --batching 16,32
  specc cost --shapes qwen3-8b --drafter-shapes dflash-b16 --deployment h200-bs1 --tau 6.55   # no checkpoint
acceptance: --tau T (published acceptance length at --num-draft, geometric fit), --alpha A (constant
per-position acceptance), or --acceptance FILE ({"alphas": [...]}, {"tau": T, "num_draft": K} or
{"accepted_lengths": [[...]], "num_draft": K}). Without one, the acceptance `specc compile` measured
for the same pair (kept in the search memory) is used, as compile does; else E = 1 token per step.
The output says which.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "cost", help="predict step times, tokens/s and the gap report (cost model; no weights needed)",
        description="Trace the target's verify step (and the drafter's draft step) from config.json on the meta "
                    "device, apply passes, and price every node for a deployment: max(bytes / bandwidth, FLOPs / peak) "
                    "+ launch overhead. Prints AR, draft and verify step times, tokens/s, speedup over AR and the gap "
                    "report (predicted vs floor per component, largest gap first).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="target: config.json file, checkpoint directory, zoo name or hub id (or --shapes)")
    p.add_argument("--drafter", metavar="D", help="drafter config.json / checkpoint")
    p.add_argument("--shapes", metavar="NAME",
                   help="instead of MODEL: named real shapes, as `specc bench --shapes` (qwen3-8b, llama-3.1-8b)")
    p.add_argument("--drafter-shapes", metavar="NAME",
                   help="with --shapes: dflash-b16 (dflash-bN), pard or none (default none: AR)")
    p.add_argument("--method", choices=method_names(), help="default: from the drafter (`specc methods`)")
    p.add_argument("--deployment", default="cpu", metavar="NAME", help="deployment name or file (default: cpu)")
    p.add_argument("--passes", metavar="LIST", help="pass pipeline to apply first (default: the compile default; '' none)")
    p.add_argument("--num-draft", type=int, metavar="K", help="drafts per step (default: the method's)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--tau", type=float, metavar="T", help="published acceptance length at --num-draft drafts")
    group.add_argument("--alpha", type=float, metavar="A", help="constant per-position acceptance probability")
    group.add_argument("--acceptance", metavar="FILE", help="acceptance model JSON file")
    p.add_argument("--memory", metavar="FILE",
                   help="search memory to read measured acceptance from (default: ~/.cache/specc/memory or "
                        "$SPECC_MEMORY_DIR)")
    p.add_argument("--context", "-C", type=int, metavar="C",
                   help="tokens in the KV cache (default 1024, at most the model's max_position_embeddings)")
    p.add_argument("--batch", "-B", type=int, metavar="B", help="batch rows (default: the deployment's)")
    p.add_argument("--no-graphs", action="store_true", help="price launches as eager launches, not CUDA-graph nodes")
    p.add_argument("--sweep", action="store_true", help="also print tokens/s and speedup for each drafts-per-step")
    p.add_argument("--nodes", action="store_true", help="with --json: every node's costs and formulas")
    p.add_argument("--tree", type=int, metavar="N",
                   help="also price tree verification with N drafted nodes (acceptance: --tree-acceptance FILE, "
                   "else the chain acceptance with rank 0 only)")
    p.add_argument("--tree-acceptance", metavar="FILE", help="per-depth per-rank tree acceptance JSON ({'p': ...} "
                   "or {'rank_counts': ...})")
    p.add_argument("--batching", nargs="?", const="1,4,8,16,32,64", metavar="B,...",
                   help="also price the batching options per batch size (default 1,4,8,16,32,64): one level, "
                   "two-level verification at each k1 = 1..k-1 and per-request k, with the choice `specc compile` "
                   "would record")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _pair_name(ref: str) -> str:
    """The name a checkpoint goes by in the search memory (as `specc compile` was given it): a
    config.json path stands for its directory."""
    from pathlib import Path

    p = Path(ref)
    return str(p.parent) if p.is_file() and p.suffix == ".json" else ref


def _weights(model_ref: str, drafter_ref: str | None) -> str | None:
    """The pair's ``memory.weights_fingerprint`` when both resolve to checkpoint directories
    (the search memory then offers only acceptance measured on these weights); None for a bare
    config.json or anything that does not resolve (any record for the names counts)."""
    from specc.models.loading import CheckpointError, resolve_checkpoint
    from specc.search.memory import weights_fingerprint

    dirs = []
    for ref in (model_ref, drafter_ref):
        if ref is None:
            continue
        try:
            dirs.append(resolve_checkpoint(_pair_name(ref)))
        except (CheckpointError, OSError, ValueError):
            return None
    return weights_fingerprint(*dirs)


def _configs(args) -> tuple[dict, dict | None]:
    """(target, drafter or None) config.json contents: read from MODEL / --drafter, or the named
    --shapes / --drafter-shapes (``specc.bench.shapes``); ``args.model`` / ``args.drafter`` are
    then set to names the search memory and the messages use."""
    from specc.ir.trace import read_user_config

    if args.shapes:
        if args.model or args.drafter:
            raise UserError("give MODEL (and --drafter) or --shapes (and --drafter-shapes), not both")
        from specc.bench.shapes import drafter_config, target_config

        raw_t = target_config(args.shapes)
        _, raw_d = drafter_config(args.shapes, args.drafter_shapes)
        args.model = args.shapes
        args.drafter = f"{args.shapes}:{args.drafter_shapes}" if raw_d is not None else None
        return raw_t, raw_d
    if args.drafter_shapes:
        raise UserError("--drafter-shapes goes with --shapes")
    if not args.model:
        raise UserError("give MODEL (a config.json, checkpoint, zoo name or hub id) or --shapes NAME")
    return read_user_config(args.model), read_user_config(args.drafter) if args.drafter else None


def _method(args, drafter_kind: str | None):
    """The method object: --method if given, else the drafter kind's default."""
    from specc.methods import default_method, get_method

    impl = get_method(args.method) if args.method else default_method(drafter_kind)
    if impl.uses_drafter and drafter_kind is None:
        raise UserError(f"--method {impl.name} needs a --drafter")
    return impl


def _context(args, dep, raw_t: dict, raw_d: dict | None) -> tuple[int, str | None]:
    """The KV-cache length to price and a note when the default was capped: --context (refused
    past the target's or drafter's positions), else the cost model's default capped at them."""
    from specc.search.cost_model import default_context, positions_of

    limits = [(n, who) for n, who in ((positions_of(raw_t), "the model's"), (positions_of(raw_d), "the drafter's"))
              if n is not None]
    limit = min(limits, key=lambda lim: lim[0], default=None)
    if args.context is not None:
        if args.context < 0:
            raise UserError(f"--context must be >= 0 (got {args.context})")
        if limit is not None and args.context > limit[0]:
            raise UserError(f"--context {args.context} exceeds {limit[1]} {limit[0]} positions "
                            "(max_position_embeddings)")
        return args.context, None
    context, uncapped = default_context(dep, raw_t, raw_d), default_context(dep)
    if context < uncapped:
        return context, f"default {uncapped}, capped at {limit[1]} positions"
    return context, None


def run(args) -> int:
    from specc.ir import IRError, fmt_rate
    from specc.models.config import ConfigError
    from specc.models.registry import classify
    from specc.search.choose import resolve_acceptance
    from specc.search.cost_model import CostModel, fmt_seconds, speedup_table
    from specc.search.memory import family_of
    from specc.search.deployments import get_deployment
    from specc.search.defaults import default_pipeline
    from specc.search.meta_pair import MetaPair

    dep = get_deployment(args.deployment)
    raw_t, raw_d = _configs(args)
    kind = classify(raw_d) if raw_d is not None else None  # a ConfigError is a UserError
    impl = _method(args, kind)
    method = impl.name
    if args.num_draft is not None and args.num_draft < 1:
        raise UserError("--num-draft must be >= 1")
    if args.batch is not None and args.batch < 1:
        raise UserError(f"--batch must be >= 1 (got {args.batch})")
    if args.tree is not None and args.tree < 1:
        raise UserError(f"--tree N needs N >= 1 (got {args.tree})")
    stated = [flag for flag, value in (("--tau", args.tau), ("--alpha", args.alpha), ("--acceptance", args.acceptance),
                                       ("--tree-acceptance", args.tree_acceptance)) if value is not None]
    if stated and not impl.uses_drafter:
        raise UserError(f"{stated[0]} states a drafter's acceptance, but method {impl.name} drafts nothing: "
                        "give --drafter (or --drafter-shapes with --shapes)")
    k = impl.num_draft(args.num_draft, raw_d)
    context, context_note = _context(args, dep, raw_t, raw_d if impl.uses_drafter else None)
    # one source of acceptance, shared with `specc compile`: stated (--tau/--alpha/--acceptance), else the
    # search memory's measured record for this pair (compile writes it), else unknown (E = 1)
    acc, acc_kind, recorded = resolve_acceptance(
        _pair_name(args.model), _pair_name(args.drafter) if args.drafter else None, method, family_of(raw_t),
        dep.name, k, tau=args.tau, alpha=args.alpha, file=args.acceptance, memory=args.memory,
        weights=_weights(args.model, args.drafter) if args.drafter else None)
    if not impl.uses_drafter:
        acc = None
    pipeline = default_pipeline() if args.passes is None else args.passes
    try:
        pair = MetaPair(raw_t, raw_d if impl.uses_drafter else None, method, dep.dtype)
        t_ir, d_ir = pair.irs(pipeline)
    except (IRError, ConfigError) as exc:
        raise UserError(str(exc)) from exc
    except Exception as exc:
        from specc.passes import PassError, PipelineError

        if isinstance(exc, (PassError, PipelineError)):
            raise UserError(str(exc).splitlines()[0]) from exc
        raise
    model = CostModel(dep, graphs=False if args.no_graphs else None)
    from specc.search.model_shapes import unmeasured_small_linears

    unmeasured = unmeasured_small_linears(model, (t_ir, d_ir))
    calibrate_for = f"--model {args.model}" + (f" --drafter {args.drafter}" if args.drafter and not args.shapes else "")
    pred = model.predict(t_ir, d_ir, method=method, num_draft=k, acceptance=acc, context=context,
                         batch_size=args.batch, formula=True)
    sweep = []
    if args.sweep and impl.uses_drafter:
        ks = impl.search_k_choices(raw_d, k)
        sweep = speedup_table(model, t_ir, d_ir, method, acc, ks, context)
    tree = None
    if args.tree is not None:
        tree = _tree_prediction(args, model, t_ir, d_ir, impl, acc, k, context)
    batching = _batching_table(args, model, t_ir, d_ir, impl, acc, k, context) if args.batching else None
    if args.json:
        out = pred.to_json(nodes=args.nodes)
        if batching is not None:
            out["batching"] = batching
        if context_note is not None:
            out["context_note"] = context_note
        out.update(pipeline=pipeline, sweep=sweep, calibrated=dep.calibrated, graphs=model.graphs,
                   unmeasured_small_linears=[list(s) for s in unmeasured],
                   acceptance_kind=acc_kind, acceptance_source=acc.source if acc is not None else "AR (no drafts)")
        if tree is not None:
            out["tree"] = tree
        json.dump(out, sys.stdout, default=str)
        sys.stdout.write("\n")
        return 0
    print(f"{dep.name}: {dep.gpu}, {fmt_rate(dep.hbm_bandwidth, 'B')} x {model.bandwidth_efficiency('linear'):.2f}, "
          f"{fmt_rate(dep.bf16_flops, 'FLOP')} x {dep.flops_efficiency:.2f}, "
          f"{'graph node' if model.graphs else 'launch'} {model.overhead * 1e6:.2f} us"
          + (" (calibrated)" if dep.calibrated else ""))
    print(f"passes: {pipeline or '(none)'}; B={pred.batch_size}, C={pred.context}"
          + (f" ({context_note})" if context_note else ""))
    if unmeasured:
        print(f"note: {len(unmeasured)} small linear shape{'s' if len(unmeasured) > 1 else ''} (e.g. K x N = "
              f"{unmeasured[0][0]} x {unmeasured[0][1]}) priced from the 8B-sized reference efficiencies, which "
              f"underprice latency-bound kernels; `specc calibrate --deployment {dep.name} {calibrate_for} "
              "-o FILE` times them")
    print(f"AR step: {fmt_seconds(pred.ar.time)} (floor {fmt_seconds(pred.ar.floor)}; {pred.ar.launches} launches; "
          f"weights {pred.ar.weight_bytes / 1e9:.3f} GB)")
    if pred.verify is not None:
        print(f"verify Q={k + 1}: {fmt_seconds(pred.verify.time)}; draft: {fmt_seconds(pred.draft_time)} "
              f"({', '.join(f'{n} x Q={p.values.get(chr(81))}' for p, n in pred.drafts)})")
        print(f"acceptance ({acc_kind}): {acc.describe(k)}")
        if acc_kind == "stated" and recorded is not None:
            print(f"  (the search memory holds a measured one for this pair, E = {recorded.expected_tokens(k):.2f} at "
                  f"k={k}: drop --tau/--alpha/--acceptance to predict with it, as `specc compile` does)")
        elif acc_kind == "unknown":
            print("  (no measured acceptance for this pair in the search memory and none stated: `specc compile` "
                  "measures and records it; or give --tau/--alpha/--acceptance)")
    print(pred.summary())
    print()
    print(pred.gap_report().text())
    for row in sweep:
        print(f"  k={row['num_draft']:>2}: E {row['expected_tokens']:.2f}, step {fmt_seconds(row['step_s'])}, "
              f"{row['tokens_per_s']:,.1f} tok/s, {row['speedup']:.2f}x")
    if tree is not None:
        print(f"tree, {tree['budget']} nodes, depth {tree['depth']} (acceptance: {tree['acceptance_source']}):")
        for row in tree["rows"]:
            label = "chain" if row["budget"] == 0 else f"tree {row['budget']}"
            print(f"  {label:>9}: E {row['expected_tokens']:.2f}, verify rows {row['verify_rows']}, step "
                  f"{fmt_seconds(row['step_s'])}, {row['tokens_per_s']:,.1f} tok/s, {row['speedup']:.2f}x")
    if batching is not None:
        _print_batching(batching, k, batching[0]["context"], acc)
    return 0


def _tree_prediction(args, model, t_ir, d_ir, impl, acc, k, context) -> dict:
    """Chain vs a tree of ``--tree`` nodes at depth k (``specc.search.tree_cost``)."""
    from specc.search.tree_acceptance import TreeAcceptanceModel
    from specc.search.tree_cost import choose_budget

    if not impl.supports_tree:
        raise UserError(f"--tree needs a method with per-position draft distributions; {impl.name} has none")
    tree = (TreeAcceptanceModel.from_file(args.tree_acceptance) if args.tree_acceptance
            else TreeAcceptanceModel.from_chain(acc, k))
    chain = model.predict(t_ir, d_ir, method=impl.name, num_draft=k, acceptance=acc, context=context,
                          batch_size=args.batch)
    _, rows = choose_budget(model, t_ir, d_ir, impl, tree, k, chain, budgets=(args.tree,), context=context,
                            batch_size=args.batch)
    return {"budget": args.tree, "depth": k, "acceptance_source": tree.source, "rows": rows}


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--batching takes batch sizes separated by commas, not {text!r}") from None
    if not sizes or any(not 1 <= b <= 4096 for b in sizes):
        raise UserError(f"--batching batch sizes must be in 1..4096 (got {text!r})")
    return sorted(set(sizes))


def _batching_table(args, model, t_ir, d_ir, impl, acc, k, context) -> list[dict]:
    """Per batch size: every option priced (``search.batching_cost``) and the choice
    (``search.batching_choice``). The options assume a target that verifies packed rows."""
    from specc.search.batching_choice import batching_section
    from specc.search.batching_cost import BatchingPricer

    sizes = _batch_sizes(args.batching)
    if not impl.uses_drafter or k < 1:
        raise UserError("--batching prices speculative steps: give a --drafter")
    pricer = BatchingPricer(model, t_ir, d_ir, impl, k, context)
    out = []
    for b in sizes:
        options = pricer.options(b, acc, reference=True)
        section = batching_section(pricer, b, acc, curve=False)
        section.pop("candidates", None)
        out.append({"batch_size": b, "context": pricer.context, "options": [o.to_json() for o in options],
                    "choice": section})
    return out


def _row_ks(counts: dict) -> str:
    """{"7": 16, "8": 16} -> "k=7..8"; {"8": 32} -> "k=8"."""
    ks = sorted(int(k) for k in counts)
    return f"k={ks[0]}" if len(ks) == 1 else f"k={ks[0]}..{ks[-1]}"


def _print_batching(table: list[dict], k: int, context: int, acc) -> None:
    from specc.search.cost_model import fmt_seconds

    print()
    print(f"batching options, k={k}, C={context} (acceptance: {acc.source or 'stated'}):")
    print("  (priced for a ragged verify step: `specc compile` records a mechanism only for an artifact that has one;"
          " 'goodput k, dense' is the reference of one k for every row without it)")
    print(f"  {'B':>4}  {'option':<26} {'step':>11} {'level 2':>11} {'l2 rows':>8} {'tok/s':>11} {'speedup':>8}")
    for entry in table:
        chosen = entry["choice"].get("chosen", "one level")
        for row in entry["options"]:
            mark = " <-" if row["option"] == chosen else ""
            l2 = fmt_seconds(row["level2_s"]) if row["two_level_k1"] else "-"
            rows2 = f"{row['level2_rows']:.1f}" if row["two_level_k1"] else "-"
            label = row["option"] + (f" ({_row_ks(row['row_k'])})" if row.get("row_k") else "")
            print(f"  {entry['batch_size']:>4}  {label:<26} {fmt_seconds(row['step_s']):>11} {l2:>11} "
                  f"{rows2:>8} {row['tokens_per_s']:>11,.1f} {row['speedup']:>7.2f}x{mark}")
        print(f"  B={entry['batch_size']}: {entry['choice']['source']}")
