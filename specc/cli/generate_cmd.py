"""`specc generate`: run the stock (eager HF transformers) system, or the eager specc.models loop."""

from __future__ import annotations

import argparse

from specc.cli.common import (add_pair_args, add_prompt_args, add_sampling_args, check_budget, check_num_draft,
                              emit_result, emit_results, kv_bytes_per_token, positive, prompt_list, sampling_json,
                              sampling_params)
from specc.errors import UserError


def register(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate with the stock reference system (eager, HF transformers)",
        description="Greedy generation with the reference ('stock') system: AR, chain speculation with an "
        "AR drafter, PARD or DFlash, as their authors publish them. Output equals HF greedy generate. "
        "With --temperature > 0 the stock system is plain sampling of the target (the distribution "
        "speculative sampling must reproduce); --engine eager runs speculative sampling.",
        epilog="""examples:
  specc generate specc-tiny --drafter specc-tiny-dflash --prompt "def fibonacci(n):"
  specc generate specc-tiny --drafter specc-tiny-pard --input-ids 1,2,3 --num-draft 4 --json
  specc generate specc-tiny --engine eager --prompt "import os" --max-new-tokens 16
  specc generate specc-tiny --drafter specc-tiny-pard --prompts prompts.json --batch-size 4 --json
  specc generate specc-tiny --drafter specc-tiny-pard --engine eager --prompt "import os" --temperature 0.7 --top-p 0.9 --seed 1
""", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_prompt_args(p)
    p.add_argument("--engine", choices=("stock", "eager"),
                   help="stock: HF transformers loops (default); eager: specc.models definitions, uncompiled "
                   "(with --batch-size: the batched device loop over them)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--tree", type=int, metavar="N",
                   help="tree verification with N drafted nodes per step (the eager loop; drafters with "
                   "per-position distributions: PARD, DFlash)")
    add_sampling_args(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import torch

    from specc.pairing import resolve_pair

    from specc.cli.progress import Progress

    positive(args.max_new_tokens, "--max-new-tokens")
    positive(args.num_draft, "--num-draft")
    pair = resolve_pair(args.model, args.drafter, args.method)
    check_num_draft(pair, args.num_draft)
    prompts, tokenizer = prompt_list(args, pair.target.path, int(pair.target.raw["vocab_size"]))
    sampling = sampling_params(args)
    batch = args.batch_size
    if batch is not None and args.engine == "stock":
        raise UserError("--engine stock runs one prompt at a time: drop --batch-size, or use --engine eager")
    engine = args.engine or "stock"
    dtype = getattr(torch, args.dtype)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise UserError(f"--device {args.device!r}: {' '.join(str(exc).split())}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is available")
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {args.device!r}: only cpu and cuda are supported")
    nbytes = torch.finfo(dtype).bits // 8
    per_token = kv_bytes_per_token(pair.target.raw, nbytes) + (
        kv_bytes_per_token(pair.drafter.raw, nbytes) if pair.drafter is not None else 0)
    positions = pair.target.raw.get("max_position_embeddings")
    longest = max(len(ids) for ids in prompts)
    check_budget(longest, args.max_new_tokens, positions if isinstance(positions, int) else None,
                 per_token * min(batch or 1, len(prompts)), device)
    tree = getattr(args, "tree", None)
    if tree is not None:
        positive(tree, "--tree")
        if not pair.impl.supports_tree:
            raise UserError(f"--tree needs a drafter with per-position distributions; method {pair.method} has none")
    emit = emit_results if args.prompts is not None else (lambda rs, *a: emit_result(rs[0], *a))
    if batch is not None:  # the batched device loop over the specc.models definitions
        from specc.runtime.eager import build_device_loop

        loop = build_device_loop(pair, args.num_draft, longest + args.max_new_tokens, dtype, args.device,
                                 tree_budget=tree or 0)
        results = loop.generate_batch(prompts, args.max_new_tokens, pair.eos_token_ids, batch_size=batch,
                                      sampling=sampling)
        emit(results, args, tokenizer, {"engine": "batched", "batch_size": min(batch, len(prompts)),
                                        "sampling": sampling_json(sampling)})
        return 0
    if tree is not None:
        from specc.runtime.eager import build_eager

        decoder = build_eager(pair, args.num_draft, longest + args.max_new_tokens, dtype, args.device, tree_budget=tree)
        results, extras = [], []
        for ids in prompts:
            result = decoder.generate(ids, args.max_new_tokens, pair.eos_token_ids, sampling)
            s = result.stats
            extras.append({"budget": tree, "depth": decoder.num_draft, "nodes_per_step": list(s.tree_nodes),
                           "mean_nodes": sum(s.tree_nodes) / max(1, len(s.tree_nodes)),
                           "accepted_lengths": list(s.accepted_lengths)})
            results.append(result)
        if args.prompts is None:
            emit_result(results[0], args, tokenizer, {"engine": "eager", "tree": extras[0],
                                                      "sampling": sampling_json(sampling)})
        else:
            emit_results(results, args, tokenizer, {"engine": "eager", "tree": {"budget": tree},
                                                    "sampling": sampling_json(sampling)})
        return 0
    names = pair.target.name + (f" + {pair.drafter.name}" if pair.drafter else "")
    with Progress.for_args(args) as progress:
        if engine == "stock" and sampling is not None:
            from specc.stock.runner import load_hf_causal_lm
            from specc.stock.sampling import sample_ar

            progress(f"loading {pair.target.name} (HF transformers, {args.dtype}, {args.device})")
            target = load_hf_causal_lm(pair.target.path, dtype, args.device)
        elif engine == "stock":
            from specc.stock.runner import StockSystem

            progress(f"loading {names} (HF transformers, {args.dtype}, {args.device})")
            system = StockSystem(pair, args.num_draft, dtype, args.device)
        else:
            from specc.runtime.eager import build_eager

            progress(f"loading {names} (specc.models, {args.dtype}, {args.device})")
            decoder = build_eager(pair, args.num_draft, longest + args.max_new_tokens, dtype, args.device)
        results = []
        for i, ids in enumerate(prompts):
            which = f" (prompt {i + 1}/{len(prompts)})" if len(prompts) > 1 else ""
            progress(f"generating {args.max_new_tokens} tokens ({pair.method}){which}")
            if engine == "stock" and sampling is not None:  # stock sampling: the target alone
                results.append(sample_ar(target, ids, args.max_new_tokens, sampling, pair.eos_token_ids))
            elif engine == "stock":
                results.append(system.generate(ids, args.max_new_tokens))
            else:
                results.append(decoder.generate(ids, args.max_new_tokens, pair.eos_token_ids, sampling))
    emit(results, args, tokenizer, {"engine": engine, "sampling": sampling_json(sampling)})
    return 0
