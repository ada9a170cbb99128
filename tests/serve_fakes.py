"""Test doubles for specc.serve: a backend without a model, and uvicorn in a thread."""

from __future__ import annotations

import asyncio
import threading
import time


class FakeBackend:
    """A ``ServeBackend`` without a model: request r generates ``script(r)`` (default: token
    ``(sum(prompt) + 7 i) % 500 + 300``), one token per chunk, ``delay`` seconds apart; it stops
    after an EOS of the model's, or raises ``fail`` after ``fail_after`` tokens."""

    def __init__(self, info, script=None, delay: float = 0.0, fail: Exception | None = None, fail_after: int = 0):
        self.info, self.script, self.delay, self.fail, self.fail_after = info, script, delay, fail, fail_after
        self.submitted, self.cancelled, self.finished = [], [], []
        self._alive = True

    def tokens_for(self, request) -> list[int]:
        if self.script is not None:
            return list(self.script(request))
        return [(sum(request.prompt_ids) + 7 * i) % 500 + 300 for i in range(request.max_new_tokens)]

    async def submit(self, request):
        from specc.serve.backend import GenerationError, TokenChunk

        self.submitted.append(request)
        done = False
        try:
            tokens = self.tokens_for(request)[:request.max_new_tokens]
            eos = set(self.info.eos_token_ids)
            for i, tok in enumerate(tokens):
                if self.fail is not None and i == self.fail_after:
                    done = True
                    raise GenerationError(str(self.fail)) from self.fail
                await asyncio.sleep(self.delay)
                last = tok in eos or i == len(tokens) - 1
                reason = ("stop" if tok in eos else "length") if last else None
                done = last
                yield TokenChunk((tok,), reason)
                if last:
                    self.finished.append(request.id)
                    return
        finally:
            if not done:
                self.cancelled.append(request.id)

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def stats(self):
        from specc.serve.backend import BackendStats

        return BackendStats(running=0, waiting=len(self.submitted) % 3, finished=len(self.finished),
                            generated_tokens=11, busy_seconds=2.0, verification_steps=4, step_tokens=10)

    def alive(self):
        return self._alive


class ThreadServer:
    """uvicorn serving ``app`` from a thread on 127.0.0.1 (a free port); ``url``; ``stop()``."""

    def __init__(self, app):
        import uvicorn

        from specc.serve.server import bind, url_of

        self.sock = bind("127.0.0.1", 0)
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


async def collect(worker, request, stop_after=None):
    """Drain ``worker.submit(request)``: (tokens, the last chunk's finish reason); with
    ``stop_after``, close the stream once that many tokens arrived (a client going away)."""
    tokens, reason = [], None
    stream = worker.submit(request)
    async for chunk in stream:
        tokens += chunk.tokens
        reason = chunk.finish_reason
        if stop_after is not None and len(tokens) >= stop_after:
            await stream.aclose()
            break
    return tokens, reason
