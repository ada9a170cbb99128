"""`specc bench`: tokens/s of AR baselines and specc's systems, measured, with the cost model beside."""

from __future__ import annotations

import argparse
import sys

from specc.cli.common import add_batch_invariant_arg

EPILOG = """\
examples:
  specc bench specc-tiny --drafter specc-tiny-dflash --device cpu --tokens 16 --prompts 2
  specc bench model.specc --tokens 128                              # an artifact vs the AR baselines
  specc bench --shapes qwen3-8b --drafter-shapes dflash-b16 --acceptance tau:6.5 --device cuda -o bench/
  specc bench --shapes llama-3.1-8b --drafter-shapes pard --acceptance alpha:0.8 --device cuda --json bench.json
  specc bench --shapes qwen3-8b --acceptance dflash-qwen3-8b:gsm8k --batch 1,16,32 --systems specc-ar,specc --device cuda
  specc bench tree.specc --systems specc --acceptance dflash-qwen3-8b:gsm8k+ranks:ranks.json   # chain vs tree
  specc bench --shapes qwen3-8b --drafter-shapes dflash-b16 --tree 32 --acceptance ranks:ranks.json --device cuda
  specc bench --shapes qwen3-8b --acceptance tau:6.5 --device cuda --systems specc-ar,specc \
      --passes fuse_qkv,fuse_gate_up,fuse_norm_linear,pack_weights_12bit,dce --ar-passes fuse_qkv,fuse_gate_up,fuse_norm_linear,dce
systems: hf-eager (HF generate), hf-compiled (HF static cache + torch.compile; CUDA only), stock (the
drafter's published loop; real checkpoints), specc-ar (compiled AR), specc (compiled speculative).
acceptance (--acceptance): measured (default with real checkpoints: the target decides), tau:T[@K],
alpha:A, alphas:a1,a2,..., dflash-qwen3-8b:{gsm8k,math500,humaneval,mt-bench} (published), or a JSON
file; anything but 'measured' REPLAYS it: drafter and target do their full work, the accepted count
is drawn from the model, and the tokens are not the model's output. An artifact with a tree budget
(or --tree N) gives a chain row and a tree row; the tree replays a per-rank model: ranks:FILE (tree acceptance
JSON), SPEC+ranks:FILE (rank 0 from SPEC, the rest split as in FILE) or SPEC alone (rank 0 only)
(docs/trees.md). docs/benchmarks/README.md explains the table.
"""


def register(sub) -> None:
    from specc.bench.run import ALL_SYSTEMS

    p = sub.add_parser("bench", help="tokens/s of AR baselines and specc's systems, with the cost model beside",
                       description="End-to-end greedy tokens/s of HF transformers (eager; static cache + torch.compile), "
                       "specc's compiled AR and specc's speculative system, on a checkpoint, an artifact, or named real "
                       "shapes with random weights (acceptance then replayed from a stated model). Prints a table, "
                       "writes JSON and PNG plots.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", metavar="MODEL", help="target checkpoint (zoo name, directory) or artifact")
    p.add_argument("--drafter", metavar="D", help="drafter checkpoint")
    from specc.methods import method_names

    p.add_argument("--method", choices=method_names(), help="default: from the drafter")
    p.add_argument("--num-draft", type=int, metavar="K", help="drafts per step (default: the method's)")
    p.add_argument("--shapes", metavar="NAME", help="real target shapes with random weights: qwen3-8b, llama-3.1-8b, "
                   "qwen3.5-9b (hybrid: gated DeltaNet + attention) (tiny-qwen3, tiny-llama, tiny-hybrid for CPU)")
    p.add_argument("--drafter-shapes", default="dflash-b16", metavar="NAME",
                   help="with --shapes: dflash-b16 (dflash-bN), pard or none (default dflash-b16)")
    p.add_argument("--tree", type=int, metavar="N", help="also time tree verification of N drafted nodes beside the "
                   "chain (checkpoints and --shapes; an artifact uses its compiled budget)")
    p.add_argument("--acceptance", metavar="SPEC", help="acceptance to replay (see below); required with --shapes")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--tokens", type=int, default=64, metavar="N", help="new tokens per prompt (default 64)")
    p.add_argument("--prompts", type=int, default=2, metavar="N", help="prompts timed (default 2)")
    p.add_argument("--prompt-len", type=int, default=128, metavar="N", help="prompt tokens with --shapes (default 128)")
    p.add_argument("--systems", metavar="LIST", default=",".join(ALL_SYSTEMS),
                   help=f"comma separated subset of {','.join(ALL_SYSTEMS)} (default: all)")
    p.add_argument("--deployment", metavar="NAME", help="cost-model deployment (default: from the device)")
    p.add_argument("--passes", metavar="LIST", help="specc pass pipeline (default: the compile default)")
    p.add_argument("--ar-passes", metavar="LIST", action="append", default=[],
                   help="also time specc's compiled AR with this pipeline at batch 1 (repeatable; '' for none), "
                        "e.g. the default pipeline beside a --passes that packs 12-bit weights: the row is named by "
                        "the passes it adds and drops (specc-ar[-pack_weights_12bit])")
    p.add_argument("--drafter-passes", metavar="LIST", help="the drafter's own pipeline (default: --passes), e.g. "
                   "12-bit weights for the target only ('' for none)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed generations per system first (default 1)")
    p.add_argument("--batch", default="1", metavar="B[,B...]",
                   help="batch sizes, comma separated (default 1). At B > 1, specc-ar and specc decode B requests "
                        "together (continuous batching); the speculative row verifies as the cost model chooses for "
                        "B (one level, two-level, goodput k); hf-eager runs the B prompts left-padded in one generate; "
                        "hf-compiled and stock run at batch 1 only")
    p.add_argument("--seed", type=int, default=0, help="prompts and acceptance draws (default 0)")
    add_batch_invariant_arg(p)
    p.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-': stdout, no table)")
    p.add_argument("-o", "--out", metavar="DIR", help="write DIR/bench.json and the PNG plots into DIR")
    p.add_argument("--no-plots", action="store_true", help="with -o: JSON only")
    p.set_defaults(handler=run)


def parse_batches(text: str) -> tuple[int, ...]:
    """``--batch``: "1", "16" or "1,4,16" -> the sorted distinct sizes (each >= 1)."""
    from specc.errors import UserError

    try:
        sizes = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise UserError(f"--batch {text!r}: give batch sizes as integers, comma separated (e.g. 1,16,32)") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"--batch {text!r}: batch sizes must be >= 1")
    return tuple(sizes)


def run(args) -> int:
    import json

    from specc.bench import BenchOptions, run_bench
    from specc.bench.report import print_table, write_json, write_plots
    from specc.errors import UserError

    for flag, value in (("--tokens", args.tokens), ("--prompts", args.prompts), ("--prompt-len", args.prompt_len)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1 (got {value})")
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0 (got {args.warmup})")
    if args.shapes:  # a misspelt name stops here, before anything is built
        from specc.bench.shapes import drafter_config

        drafter_config(args.shapes, args.drafter_shapes)
    batches = parse_batches(args.batch)
    if args.num_draft is not None and args.num_draft < 1:
        raise UserError("--num-draft must be >= 1")
    if args.tree is not None and args.tree < 1:
        raise UserError("--tree must be >= 1 (a node budget)")
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    opts = BenchOptions(model=args.model, drafter=args.drafter, method=args.method, num_draft=args.num_draft,
                        shapes=args.shapes, drafter_shapes=args.drafter_shapes, acceptance=args.acceptance,
                        device=args.device, tokens=args.tokens, prompts=args.prompts, prompt_len=args.prompt_len,
                        systems=systems, deployment=args.deployment, passes=args.passes,
                        ar_passes=tuple(args.ar_passes), drafter_passes=args.drafter_passes, seed=args.seed,
                        warmup=args.warmup, batches=batches, tree=args.tree)
    to_stdout = args.json == "-"
    progress = None
    if not to_stdout:
        from rich.console import Console

        err = Console(stderr=True)

        def progress(msg: str) -> None:
            err.print(f"[dim]specc: {msg}[/dim]")
    report = run_bench(opts, progress)
    if to_stdout:
        json.dump(report, sys.stdout, default=str)
        sys.stdout.write("\n")
        return 0
    print_table(report)
    if args.json:
        print(f"wrote {write_json(report, args.json)}")
    if args.out:
        print(f"wrote {write_json(report, f'{args.out}/bench.json')}")
        if not args.no_plots:
            try:
                paths = write_plots(report, args.out)
            except ImportError:
                print("plots skipped: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
                paths = []
            for path in paths:
                print(f"wrote {path}")
    return 0
