"""Argument groups and output shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys

from specc.errors import UserError
from specc.methods import method_names
from specc.pairing import check_num_draft  # noqa: F401 (re-exported)


def add_pair_args(p: argparse.ArgumentParser, with_method: bool = True) -> None:
    p.add_argument("model", metavar="MODEL", help="target checkpoint: local directory, hub id or zoo name")
    p.add_argument("--drafter", metavar="D", help="drafter checkpoint (AR causal LM, PARD or DFlash)")
    if with_method:
        p.add_argument("--method", choices=method_names(),
                       help="decoding method (default: from the drafter's kind; 'ar' without a drafter)")
    p.add_argument("--num-draft", type=int, metavar="K",
                   help="drafted tokens per step (default: the method's; `specc methods` lists them)")


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", metavar="TEXT", help="prompt text (needs the target's tokenizer)")
    group.add_argument("--input-ids", metavar="1,2,3", help="prompt token ids, comma separated")
    group.add_argument("--prompts", metavar="FILE",
                       help="several prompts: a JSON list of strings or token-id lists, or one text prompt per line; "
                       "one result per prompt, in order (JSON lines with --json)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="with --prompts: decode up to N prompts together (continuous batching: a finished "
                   "prompt's slot takes the next); each result equals that prompt run alone")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON object (per prompt) instead of text")


def prompt_list(args, tokenizer_path, vocab_size: int) -> tuple[list[list[int]], object]:
    """(one id list per prompt, tokenizer or None) from --prompt / --input-ids / --prompts;
    checks --batch-size (only with --prompts, >= 1) and the ids against the vocabulary."""
    from specc.models.loading import CheckpointError, load_tokenizer

    batch = getattr(args, "batch_size", None)
    if batch is not None and getattr(args, "prompts", None) is None:
        raise UserError("--batch-size needs --prompts FILE")
    positive(batch, "--batch-size")
    if getattr(args, "prompts", None) is None:
        ids, tokenizer = prompt_ids(args, tokenizer_path)
        check_ids_in_vocab(ids, vocab_size)
        return [ids], tokenizer
    from specc.verify.prompts import load_prompts_file

    try:
        tokenizer = load_tokenizer(tokenizer_path)
    except CheckpointError as exc:
        raise UserError(str(exc)) from exc
    return load_prompts_file(args.prompts, tokenizer, vocab_size), tokenizer


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling", "temperature > 0 samples (speculative sampling: the output is distributed "
                             "as sampling the target alone, docs/sampling.md); 0, the default, is greedy")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default 0: greedy)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (default 0: off)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1: off)")
    g.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="drop tokens below P x the top token's probability (default 0: off)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="penalise tokens already in the context (default 1: off)")
    g.add_argument("--seed", type=int, default=0, metavar="S", help="random seed: the same seed gives the same tokens (default 0)")
    add_batch_invariant_arg(g)


def add_batch_invariant_arg(p) -> None:
    """--batch-invariant: kernels whose results for a request do not depend on the other requests of
    its batch (``specc.codegen.kernels.batch_invariant``; the CLI's main switches it on before the
    command loads anything)."""
    p.add_argument("--batch-invariant", action="store_true",
                   help="kernels that give a request the same bits alone or in any batch, so a seed gives the "
                   "same tokens in both (slower; $SPECC_BATCH_INVARIANT=1; docs/kernels.md)")


def sampling_params(args):
    """The ``SamplingParams`` of --temperature ... --seed, or None for greedy (a UserError names
    the bad flag)."""
    from specc.sampling import SamplingParams

    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                repetition_penalty=args.repetition_penalty, seed=args.seed)
    except ValueError as exc:
        field = str(exc).split()[0]
        raise UserError(f"--{field.replace('_', '-')}: {exc}") from None
    return None if params.greedy else params


def sampling_json(params) -> dict:
    """What the JSON output says about sampling (``{"temperature": 0}`` when greedy)."""
    return params.to_json() if params is not None else {"temperature": 0.0}


def positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise UserError(f"{flag} must be >= 1 (got {value})")


def prompt_ids(args, tokenizer_path) -> tuple[list[int], object]:
    """(token ids, tokenizer or None) from --prompt / --input-ids."""
    from specc.models.loading import CheckpointError, load_tokenizer

    try:
        tokenizer = load_tokenizer(tokenizer_path)
    except CheckpointError as exc:
        raise UserError(str(exc)) from exc
    if args.input_ids is not None:
        try:
            ids = [int(t) for t in args.input_ids.replace(" ", "").split(",") if t]
        except ValueError:
            raise UserError(f"--input-ids must be comma-separated integers (got {args.input_ids!r})") from None
        if not ids:
            raise UserError("--input-ids is empty")
        return ids, tokenizer
    if tokenizer is None:
        raise UserError(f"{tokenizer_path} ships no tokenizer: pass --input-ids instead of --prompt")
    ids = tokenizer(args.prompt, add_special_tokens=True)["input_ids"]
    if not ids:
        raise UserError("the prompt tokenizes to nothing")
    return ids, tokenizer


def check_ids_in_vocab(ids: list[int], vocab_size: int) -> None:
    from specc.result import check_vocab

    try:
        check_vocab(ids, vocab_size)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def emit_result(result, args, tokenizer, extra: dict | None = None) -> None:
    if args.json:
        payload = result.to_json()
        if tokenizer is not None:
            payload["text"] = tokenizer.decode(result.tokens)
        payload.update(extra or {})
        json.dump(payload, sys.stdout)
        sys.stdout.write("\n")
        return
    if tokenizer is not None:
        print(tokenizer.decode(result.tokens))
    else:
        print(" ".join(str(t) for t in result.tokens))
    s = result.stats
    print(f"[{result.method}] {len(result.tokens)} tokens in {s.steps} steps, tau {s.tau:.2f}, "
          f"{s.target_forwards} target / {s.draft_forwards} draft forwards, finished by {result.finished_by}",
          file=sys.stderr)


def emit_results(results, args, tokenizer, extra: dict | None = None) -> None:
    """One result per prompt, in order: JSON lines (each object as ``emit_result`` prints it,
    plus ``index``) with --json, else each prompt's text then its stats line."""
    for index, result in enumerate(results):
        if args.json:
            payload = result.to_json()
            if tokenizer is not None:
                payload["text"] = tokenizer.decode(result.tokens)
            payload.update({"index": index, **(extra or {})})
            sys.stdout.write(json.dumps(payload) + "\n")
        else:
            emit_result(result, args, tokenizer, extra)


def finite_non_negative(value: float | None, flag: str) -> None:
    import math

    if value is not None and (not math.isfinite(value) or value < 0):
        raise UserError(f"{flag} must be a finite number >= 0 (got {value})")


def kv_bytes_per_token(raw: dict, dtype_bytes: int = 4) -> int:
    """KV-cache bytes one token takes in a model of this config.json (all attention layers, K and
    V; a hybrid target's GDN layers keep a fixed-size state instead)."""
    from specc.models.config import model_config_from_hf
    from specc.models.hybrid_config import hybrid_config_from_hf, is_hybrid_config

    if is_hybrid_config(raw):
        hybrid = hybrid_config_from_hf(raw)
        return (hybrid.num_layers - len(hybrid.linear_layers)) * 2 * hybrid.num_kv_heads * hybrid.head_dim * dtype_bytes
    cfg = model_config_from_hf(raw)
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def check_budget(prompt_len: int, max_new_tokens: int, max_positions: int | None, bytes_per_token: int,
                 device="cpu", what: str = "--max-new-tokens") -> None:
    """Refuse, before allocating anything, a generation longer than the model's positions or one
    whose caches cannot fit in the memory available."""
    from specc.models.loading import available_memory_bytes

    total = prompt_len + max_new_tokens + 1
    if max_positions is not None and prompt_len > max_positions:
        raise UserError(f"the prompt has {prompt_len} tokens, more than the model's {max_positions} positions "
                        "(max_position_embeddings)")
    if max_positions is not None and total - 1 > max_positions:
        raise UserError(f"{what} {max_new_tokens}: the prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens "
                        f"exceeds the model's {max_positions} positions (max_position_embeddings)")
    need = total * bytes_per_token
    avail = available_memory_bytes(device)
    if avail is not None and need > 0.9 * avail:
        raise UserError(f"{what} {max_new_tokens}: the caches would need about {need / 1e9:,.1f} GB, more than the "
                        f"{avail / 1e9:,.1f} GB available")
