"""`specc generate`: run the stock (eager HF transformers) system, or the eager specc.models loop."""

from __future__ import annotations

from specc.cli.common import add_pair_args, add_prompt_args, check_ids_in_vocab, emit_result, positive, prompt_ids


def register(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate with the stock reference system (eager, HF transformers)",
        description="Greedy generation with the reference ('stock') system: AR, chain speculation with an "
        "AR drafter, PARD or DFlash, as their authors publish them. Output equals HF greedy generate.")
    add_pair_args(p)
    add_prompt_args(p)
    p.add_argument("--engine", choices=("stock", "eager"), default="stock",
                   help="stock: HF transformers loops (default); eager: specc.models definitions, uncompiled")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--tree", type=int, metavar="N",
                   help="tree verification with N drafted nodes per step (the eager loop; drafters with "
                   "per-position distributions: PARD, DFlash)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import torch

    from specc.pairing import resolve_pair

    positive(args.max_new_tokens, "--max-new-tokens")
    positive(args.num_draft, "--num-draft")
    pair = resolve_pair(args.model, args.drafter, args.method)
    ids, tokenizer = prompt_ids(args, pair.target.path)
    check_ids_in_vocab(ids, int(pair.target.raw["vocab_size"]))
    dtype = getattr(torch, args.dtype)
    tree = getattr(args, "tree", None)
    if tree is not None:
        from specc.errors import UserError

        positive(tree, "--tree")
        if not pair.impl.supports_tree:
            raise UserError(f"--tree needs a drafter with per-position distributions; method {pair.method} has none")
        from specc.runtime.eager import build_eager

        decoder = build_eager(pair, args.num_draft, len(ids) + args.max_new_tokens, dtype, args.device, tree_budget=tree)
        result = decoder.generate(ids, args.max_new_tokens, pair.eos_token_ids)
        s = result.stats
        stats = {"budget": tree, "depth": decoder.num_draft, "nodes_per_step": list(s.tree_nodes),
                 "mean_nodes": sum(s.tree_nodes) / max(1, len(s.tree_nodes)), "accepted_lengths": list(s.accepted_lengths)}
        emit_result(result, args, tokenizer, {"engine": "eager", "tree": stats})
        return 0
    if args.engine == "stock":
        from specc.stock.runner import run_stock

        result = run_stock(pair, ids, args.max_new_tokens, args.num_draft, dtype, args.device)
    else:
        from specc.runtime.eager import build_eager

        decoder = build_eager(pair, args.num_draft, len(ids) + args.max_new_tokens, dtype, args.device)
        result = decoder.generate(ids, args.max_new_tokens, pair.eos_token_ids)
    emit_result(result, args, tokenizer, {"engine": args.engine})
    return 0
