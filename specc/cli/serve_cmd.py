"""`specc serve`: an OpenAI-compatible HTTP server over a compiled artifact (docs/serve.md)."""

from __future__ import annotations

import argparse
import sys

from specc.cli.common import add_batch_invariant_arg, positive
from specc.errors import UserError

EPILOG = """\
examples:
  specc serve tiny.specc --port 8000
  specc serve tiny.specc --port 0 --max-len 512 --model-name tiny
  specc serve tiny.specc --port 8000 --batch-size 8
  specc serve q8.specc --host 0.0.0.0 --port 8000 --max-len 4096 --device cuda
endpoints: POST /v1/completions, POST /v1/chat/completions (tokenizers with a chat template),
GET /v1/models, /health, /metrics (Prometheus). Greedy decoding only: temperature > 0 is refused.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve an artifact over HTTP (OpenAI-compatible API)",
        description="Load a compiled artifact and answer OpenAI-style /v1/completions and /v1/chat/completions "
        "requests (streaming with server-sent events), with /v1/models, /health and /metrics. One worker thread "
        "owns the engine and runs the requests one at a time, or --batch-size N of them together (continuous "
        "batching). Prints the URL once it accepts connections; "
        "Ctrl-C stops it. Needs the serve extra: pip install 'specc[serve]'.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, metavar="N", help="port (default 8000; 0: any free port)")
    p.add_argument("--max-len", type=int, metavar="N",
                   help="longest prompt + completion in tokens (default: the model's positions, at most 2048)")
    p.add_argument("--device", help="override the artifact's device (e.g. cpu)")
    p.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="decode up to N requests together (continuous batching; default 1: one at a time)")
    add_batch_invariant_arg(p)
    p.add_argument("--model-name", metavar="NAME",
                   help="the name clients send as `model` (default: the artifact's model name)")
    p.add_argument("--expect-hash", metavar="SHA256",
                   help="refuse the artifact unless its manifest.json has this sha256 (printed by `specc compile`)")
    p.set_defaults(handler=run)


def _check_installed() -> None:
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            raise UserError(f"specc serve needs {module}: pip install 'specc[serve]'") from None


def run(args) -> int:
    from specc.cli.compile_cmd import _ArtifactRuns, _check_engine_budget, _load_engine
    from specc.cli.progress import Progress

    _check_installed()
    from specc.serve.app import create_app
    from specc.serve.server import bind, run_server
    from specc.serve.scheduler import BatchingScheduler, SerialScheduler
    from specc.serve.worker import EngineWorker, default_max_len

    positive(args.max_len, "--max-len")
    positive(args.batch_size, "--batch-size")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be 0..65535 (got {args.port})")
    sock = bind(args.host, args.port)  # a busy port fails now, before the engine loads
    progress = Progress.for_args(args)

    def load_engine():  # runs on the worker thread, which owns the engine from here on
        with _ArtifactRuns(args.artifact):
            progress(f"loading {args.artifact}")
            engine = _load_engine(args.artifact, args.device, max_len=args.max_len or 2048,
                                  expect_hash=args.expect_hash, warmup=True,
                                  progress=lambda msg, seconds: progress(f"{msg} ({seconds:.2f} s)"))
        _check_engine_budget(engine, 0, args.max_len or default_max_len(engine.manifest), "--max-len",
                             rows=args.batch_size)
        return engine

    # the scheduler the worker thread drives (docs/serve.md, "The scheduler interface")
    if args.batch_size > 1:  # continuous batching: up to N requests decoded together (docs/batching.md)
        def scheduler(engine):
            return BatchingScheduler(engine, args.batch_size, args.max_len or default_max_len(engine.manifest))
    else:
        scheduler = SerialScheduler
    worker = EngineWorker(load_engine, max_len=args.max_len, model_name=args.model_name, scheduler=scheduler)
    try:
        with progress:
            info = worker.start()

        def ready(url: str) -> None:
            chat = ", /v1/chat/completions" if getattr(info.tokenizer, "chat_template", None) else ""
            print(f"specc serve: {info.name} on {url} (max length {info.max_len}; POST /v1/completions{chat}; "
                  "GET /v1/models, /health, /metrics)", flush=True)

        try:
            run_server(create_app(worker, info), sock, on_ready=ready)
        except KeyboardInterrupt:  # uvicorn shut down gracefully, then re-raised Ctrl-C
            pass
    finally:
        worker.close()
        sock.close()
    print("specc serve: stopped", file=sys.stderr)
    return 0
