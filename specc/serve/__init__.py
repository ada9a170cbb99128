"""`specc serve`: an OpenAI-compatible HTTP server over a compiled artifact (docs/serve.md).

- ``backend``: the ``ServeBackend`` protocol the HTTP layer talks to (requests in, token chunks out).
- ``scheduler``: what the worker thread calls to make progress (``SerialScheduler`` today; the
  runtime's continuous-batching scheduler has the same ``submit / step / cancel`` shape).
- ``worker``: ``EngineWorker``, the ``ServeBackend`` whose one thread owns the engine.
- ``schemas``, ``prompts``, ``text``, ``metrics``, ``app``: OpenAI request shapes, prompt
  resolution and checks, incremental detokenization with stop strings, Prometheus metrics, the
  FastAPI application.
- ``server``: uvicorn on a bound socket, printing the URL when ready.

Needs the ``serve`` extra (FastAPI, uvicorn, prometheus_client); nothing here is imported by
``specc.load`` or the compiler.
"""
