"""The ``specc`` command. Each subcommand lives in its own module with ``register(subparsers)``.

Exit status: 0 success, 1 a check failed (e.g. verification), 2 bad input (one-line error).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specc.errors import UserError

# Modules providing subcommands, in the order `specc --help` lists them.
SUBCOMMANDS = [
    "specc.cli.models_cmd",
    "specc.cli.methods_cmd",
    "specc.cli.generate_cmd",
    "specc.cli.compile_cmd",
    "specc.cli.deployments_cmd",
    "specc.cli.ir_cmd",
    "specc.cli.passes_cmd",
    "specc.cli.cost_cmd",
    "specc.cli.calibrate_cmd",
    "specc.cli.search_cmd",
    "specc.cli.tp_cmd",
    "specc.cli.bench_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specc",
        description="specc: a compiler for speculative decoding. Traces a target model and a drafter "
        "into an IR, applies passes chosen for a deployment, emits Triton modules checked token by "
        "token against the eager reference.",
        epilog="Run `specc COMMAND --help` for a command's options.",
    )
    from specc import __version__

    parser.add_argument("--version", action="version", version=f"specc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"specc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
