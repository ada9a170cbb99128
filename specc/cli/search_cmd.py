"""`specc search`: rounds of cost-model-guided search, every candidate checked by token forcing."""

from __future__ import annotations

from specc.methods import method_names

import argparse
import json
import os
import sys

from specc.errors import UserError

EPILOG = """\
examples:
  specc search specc-tiny --drafter specc-tiny-pard --deployment h200-bs1 --rounds 3
  specc search specc-tiny --drafter specc-tiny-dflash --deployment cpu --rounds 2 --json
  specc search specc-tiny --drafter specc-tiny-pard --deployment h200-bs8 --memory mem/qwen3__h200-bs8.json
  specc search specc-tiny --drafter specc-tiny-pard --proposer llm --endpoint http://127.0.0.1:8000/v1 --model m
memory: validated mechanisms are kept per model family x deployment in $SPECC_MEMORY_DIR
(default ~/.cache/specc/memory); later searches, on this and other deployments, try them first.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "search", help="search passes and parameters for a deployment (cost model + token forcing)",
        description="Rounds: gap report of the best configuration -> proposers -> cost-model predictions -> "
                    "compile and token-force the promising candidates against stock -> keep the best (measured on "
                    "a GPU when the deployment is CUDA and one is present). Validated mechanisms go to the memory.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="target checkpoint: local directory, hub id or zoo name")
    p.add_argument("--drafter", metavar="D", help="drafter checkpoint (AR causal LM, PARD or DFlash)")
    p.add_argument("--method", choices=method_names(), help="default: from the drafter (`specc methods`)")
    p.add_argument("--deployment", default="cpu", metavar="NAME",
                   help="deployment profile (`specc deployments`) or a .toml/.json file (default: cpu)")
    p.add_argument("--rounds", type=int, default=2, metavar="N", help="search rounds (default 2)")
    p.add_argument("--memory", metavar="FILE", help="memory file (.json) or directory (default: $SPECC_MEMORY_DIR "
                                                    "or ~/.cache/specc/memory)")
    p.add_argument("--no-memory", action="store_true", help="neither read nor write a memory")
    p.add_argument("--num-draft", type=int, metavar="K", help="starting drafts per step (default: the method's)")
    p.add_argument("--start-passes", metavar="LIST", help="starting pipeline (default: the compile default; '' for none)")
    p.add_argument("--max-verify", type=int, default=3, metavar="N", help="candidates token-forced per round (default 3)")
    p.add_argument("--prompts", metavar="FILE", help="calibration prompts (JSON list of strings/id lists, or lines)")
    p.add_argument("--verify-tokens", type=int, default=16, metavar="N", help="tokens per prompt (default 16)")
    p.add_argument("--context", type=int, metavar="C", help="context length the predictions assume (default 1024)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="where candidates are compiled and checked")
    p.add_argument("--proposer", choices=("builtin", "llm", "both"), default="builtin",
                   help="where candidates come from (memory first always); 'llm' needs --endpoint and --model")
    p.add_argument("--endpoint", metavar="URL", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", dest="llm_model", metavar="NAME", help="model name for the LLM endpoint")
    p.add_argument("--api-key-env", default="SPECC_LLM_API_KEY", metavar="VAR",
                   help="environment variable holding the endpoint's API key, if it needs one")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(handler=run)


class RichReporter:
    """Progress of a search with rich: messages as log lines, a bar while candidates are checked."""

    def __init__(self):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.progress = None
        self.task = None

    def message(self, text: str) -> None:
        self.console.log(text)

    def start(self, description: str, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if total <= 0:
            return
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
        self.progress.start()
        self.task = self.progress.add_task(description, total=total)

    def advance(self, text: str = "") -> None:
        if self.progress is not None:
            self.progress.advance(self.task)
        if text:
            self.console.log(f"  {text}")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def run(args) -> int:
    from specc.cli.common import positive
    from specc.search.driver import Search
    from specc.search.evaluated import Reporter
    from specc.search.proposers import BuiltinProposer

    positive(args.rounds + 1, "--rounds + 1")
    positive(args.num_draft, "--num-draft")
    positive(args.max_verify, "--max-verify")
    positive(args.verify_tokens, "--verify-tokens")
    proposers = []
    if args.proposer in ("builtin", "both"):
        proposers.append(BuiltinProposer())
    if args.proposer in ("llm", "both"):
        if not args.endpoint or not args.llm_model:
            raise UserError("--proposer llm needs --endpoint URL and --model NAME")
        from specc.search.llm_proposer import LLMProposer

        proposers.append(LLMProposer(args.endpoint, args.llm_model, api_key=os.environ.get(args.api_key_env),
                                     max_requests=max(args.rounds, 1)))
    prompts = None
    if args.prompts:
        from specc.models.loading import load_tokenizer
        from specc.pairing import resolve_pair
        from specc.verify import load_prompts_file

        pair = resolve_pair(args.model, args.drafter, args.method)
        prompts = load_prompts_file(args.prompts, load_tokenizer(pair.target.path), int(pair.target.raw["vocab_size"]))
    reporter = Reporter() if args.quiet else RichReporter()
    memory = False if args.no_memory else args.memory
    s = Search(args.model, args.drafter, method=args.method, deployment=args.deployment, memory=memory,
               proposers=proposers, prompts=prompts, max_new_tokens=args.verify_tokens, start_pipeline=args.start_passes,
               num_draft=args.num_draft, max_verify=args.max_verify, device=args.device, context=args.context,
               reporter=reporter)
    result = s.run(args.rounds)
    if args.json:
        json.dump(result.to_json(), sys.stdout, default=str)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for line in result.summary_lines():
        console.print(line, highlight=False, markup=False)
    table = Table(title="candidates")
    for col in ("round", "mechanism", "origin", "predicted tok/s", "measured tok/s", "status"):
        table.add_column(col)
    for r in result.rounds:
        for c in r["candidates"]:
            pred = c["predicted"].get("tokens_per_s")
            meas = (c.get("measured") or {}).get("tokens_per_s")
            table.add_row(str(r["round"]), c["mechanism"], c["origin"], f"{pred:,.1f}" if pred else "-",
                          f"{meas:,.1f}" if meas else "-", c["status"] + (f" ({c['error']})" if c.get("error") else ""))
    console.print(table)
    if result.best.prediction is not None:
        console.print(result.best.prediction.gap_report().text(), highlight=False, markup=False)
    return 0
