"""The ``specc`` command. Each subcommand lives in its own module with ``register(subparsers)``.

Exit status: 0 success, 1 a check failed (e.g. verification), 2 bad input (one-line error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
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
    "specc.cli.serve_cmd",
]


class _Parser(argparse.ArgumentParser):
    """argparse with specc's error format: one line ``specc: error: ...``, exit status 2."""

    def error(self, message: str):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        self.exit(2, f"specc: error: {command}{one_line(message)} (see `{self.prog} --help`)\n")


def one_line(text) -> str:
    return " ".join(str(text).split()) or "(no message)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    parser.set_defaults(_commands=sub.choices)  # main() names the command an unknown argument came to
    for command in sub.choices.values():  # one knob on every subcommand (specc/threads.py)
        command.add_argument("--threads", type=int, metavar="N",
                             help="CPU threads for torch (default: $SPECC_THREADS, else min(physical cores, 4, "
                             "idle cores))")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)  # a usage error: one line, SystemExit(2)
    if unknown:  # said by the command's own parser, which points at its own --help
        args._commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    try:
        from specc.threads import configure_threads

        args.threads_given = args.threads is not None or bool(os.environ.get("SPECC_THREADS", "").strip())
        args.threads = configure_threads(args.threads)
        from specc.codegen.kernels.batch_invariant import batch_invariant

        # --batch-invariant: on before anything loads, compiles or captures; else as the environment says
        with batch_invariant() if getattr(args, "batch_invariant", False) else contextlib.nullcontext():
            return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"specc: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `specc ... | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("specc: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("specc: error: out of memory (try a smaller --max-new-tokens, batch or model)", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, permission denied... on a path the user gave
        if os.environ.get("SPECC_DEBUG"):
            raise
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"specc: error: {where}{one_line(exc.strerror or exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line (SPECC_DEBUG=1 shows the traceback)
        if os.environ.get("SPECC_DEBUG"):
            raise
        print(f"specc: error: internal error: {type(exc).__name__}: {one_line(exc)} "
              "(a bug; rerun with SPECC_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
