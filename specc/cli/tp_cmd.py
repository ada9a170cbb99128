"""`specc tp`: check a tensor-parallel target against the 1-device model, on CPU ranks or GPUs.

Starts ``--world`` ranks (gloo on CPU, NCCL on CUDA, one GPU per rank), each running its shard
of the target (``specc.parallel``). Without a drafter: token forcing of the 1-device
model's greedy tokens through the sharded target; with one: speculative decoding with the
target sharded and the drafter replicated, against 1-device greedy decoding.
"""

from __future__ import annotations

import argparse
import json

from specc.cli.common import positive
from specc.errors import UserError
from specc.methods import available_methods

EPILOG = """\
examples:
  specc tp specc-tiny --world 2                                   # 2 gloo ranks, token forcing, traced IR
  specc tp specc-tiny --world 2 --compiled --json                 # the ranks run specc's generated steps
  specc tp specc-tiny --drafter specc-tiny-pard --world 2             # speculative decoding, drafter replicated
  specc tp specc-tiny --drafter specc-tiny-dflash --num-draft 7       # DFlash: reads the sharded target's hidden states
  specc tp Qwen/Qwen3-8B --world 2 --device cuda --dtype bfloat16   # NCCL, cuda:0 and cuda:1
exit status: 0 the sharded system matches the 1-device model, 1 it does not, 2 bad input.
"""


def drafting_method_names() -> tuple[str, ...]:
    """Methods that speculate with a drafter (a sharded target needs one to speculate)."""
    return tuple(name for name, m in available_methods().items() if m.uses_drafter)


def register(sub) -> None:
    p = sub.add_parser(
        "tp", help="check a tensor-parallel (sharded) target against the 1-device model",
        description="Shard the target over --world ranks (column-parallel q/k/v and gate/up, row-parallel o/down "
                    "+ all-reduce, replicated embedding, norms and lm_head) and check it token by token against "
                    "the 1-device model: token forcing without a drafter, speculative decoding with one.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="target checkpoint: local directory, hub id or zoo name")
    p.add_argument("--drafter", metavar="D", help="an AR, PARD or DFlash drafter: check speculative decoding")
    p.add_argument("--method", choices=drafting_method_names(), help="with --drafter (default: from the drafter)")
    p.add_argument("--num-draft", type=int, default=3, metavar="K", help="drafted tokens per step (default 3)")
    p.add_argument("--world", type=int, default=2, metavar="W", help="ranks (default 2)")
    p.add_argument("--tokens", type=int, default=12, metavar="N", help="tokens to force / generate (default 12)")
    p.add_argument("--compiled", action="store_true",
                   help="token forcing through specc's generated steps instead of the traced IR")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo ranks; cuda: NCCL, a GPU per rank")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--tie-tol", type=float, default=None, metavar="T",
                   help="top-2 margin under which a forcing mismatch is a tie (default 1e-3 fp32, 0.0625 bf16/fp16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _check_shardable(raw: dict, world: int, name: str) -> None:
    heads, kv = int(raw["num_attention_heads"]), int(raw.get("num_key_value_heads") or raw["num_attention_heads"])
    inter = int(raw["intermediate_size"])
    for what, n in (("query heads", heads), ("kv heads", kv), ("intermediate features", inter)):
        if n % world:
            raise UserError(f"{name} has {n} {what}, not divisible by --world {world}")


def run(args) -> int:
    import torch

    from specc.pairing import resolve_pair
    from specc import parallel as D

    positive(args.tokens, "--tokens")
    positive(args.num_draft, "--num-draft")
    if args.world < 2:
        raise UserError(f"--world must be >= 2 (got {args.world})")
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise UserError(f"--world {args.world} on cuda needs {args.world} GPUs, this machine has "
                        f"{torch.cuda.device_count()}")
    pair = resolve_pair(args.model, args.drafter, args.method)
    _check_shardable(pair.target.raw, args.world, args.model)
    prompt = [t % int(pair.target.raw["vocab_size"]) for t in D.DEFAULT_PROMPT]
    if pair.drafter is None:
        tie = args.tie_tol if args.tie_tol is not None else (1e-3 if args.dtype == "float32" else 0.0625)
        check = D.tp_forward_check(str(pair.target.path), args.world, prompt=prompt, num_tokens=args.tokens,
                                   dtype=args.dtype, device=args.device, tie_tol=tie, compiled=args.compiled,
                                   passes=D.COMPILED_PASSES if args.compiled else D.DEFAULT_PASSES)
        ok = check.argmax_equal or len(check.ties) == len(check.mismatches)
        out = {"mode": "forcing", "ok": ok, **check.to_json(), "step": check.result.step}
        text = check.summary()
    else:
        res = D.tp_speculative_check(str(pair.target.path), str(pair.drafter.path), args.world, prompt=prompt,
                                     max_new_tokens=args.tokens, method=pair.method, num_draft=args.num_draft,
                                     dtype=args.dtype, device=args.device)
        ok = res["equal"]
        out = {"mode": "speculative", "ok": ok, "method": pair.method, "num_draft": args.num_draft,
               "world_size": args.world, "reference": res["reference"], "ranks": res["ranks"], "tau": res["tau"],
               "target_all_reduce": res["result"].target_all_reduce}
        text = (f"{args.model}: {pair.method} with the target sharded over {args.world} ranks, k = {args.num_draft}: "
                f"{'tokens identical to' if ok else 'tokens DIFFER from'} 1-device greedy on every rank "
                f"({args.tokens} tokens, tau {res['tau'][0]:.2f})")
    print(json.dumps(out) if args.json else text)
    return 0 if ok else 1
