"""Argument groups and output shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys

from specc.errors import UserError
from specc.methods import method_names


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
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


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
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")


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
