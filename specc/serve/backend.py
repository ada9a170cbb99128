"""What the HTTP layer needs from whatever runs the model: the ``ServeBackend`` protocol.

The app (``specc.serve.app``) speaks only to this protocol, never to an engine: the requests it
accepts go in as ``GenerationRequest``s and come back as an async iterator of ``TokenChunk``s.
So the worker of today (``specc.serve.worker.EngineWorker``: one thread owns the engine and runs
a scheduler) and any later backend are interchangeable, and the app's tests run on a fake one.
"""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator, Protocol

from specc.result import GenerationStats


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One greedy generation: ``prompt_ids`` then up to ``max_new_tokens`` new tokens, stopping
    after an EOS of ``eos_token_ids`` (None: the model's own; (): none)."""

    id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...] | None = None
    sampling: object | None = None  # a specc.sampling.SamplingParams; None: greedy


@dataclasses.dataclass(frozen=True)
class TokenChunk:
    """Tokens committed since the previous chunk. The last chunk of a request has a
    ``finish_reason`` ("stop": it ended with an EOS, which ``tokens`` holds; "length": it reached
    ``max_new_tokens``) and, where the backend has them, the generation's ``stats``."""

    tokens: tuple[int, ...]
    finish_reason: str | None = None
    stats: GenerationStats | None = None


class GenerationError(Exception):
    """The generation of one request failed (the backend keeps serving the others)."""


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the HTTP layer checks requests against: the served name, the longest sequence
    (prompt + new tokens) the backend accepts, the vocabulary, the EOS ids and the tokenizer
    (None: token-id prompts only)."""

    name: str
    max_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    tokenizer: object | None = None


@dataclasses.dataclass(frozen=True)
class BackendStats:
    """A snapshot of the backend's counters (``specc.serve.metrics`` exports them)."""

    running: int = 0  # requests generating now
    waiting: int = 0  # requests queued behind them
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    generated_tokens: int = 0
    busy_seconds: float = 0.0  # time spent making progress (scheduler steps)
    verification_steps: int = 0  # of finished requests
    step_tokens: int = 0  # tokens those steps committed

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of busy time (the decode throughput while working)."""
        return self.generated_tokens / self.busy_seconds if self.busy_seconds > 0 else 0.0

    @property
    def accepted_tokens_per_step(self) -> float:
        """Mean tokens committed per verification step (tau) over the finished requests."""
        return self.step_tokens / self.verification_steps if self.verification_steps else 0.0


class ServeBackend(Protocol):
    """Runs generations for the HTTP layer.

    ``submit`` returns an async iterator of the request's chunks; it raises
    ``GenerationError`` if the generation fails, and closing it early (``aclose``, or a cancelled
    task) cancels the request, as ``cancel(request.id)`` does."""

    info: ModelInfo

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenChunk]: ...

    def cancel(self, request_id: str) -> None: ...

    def stats(self) -> BackendStats: ...

    def alive(self) -> bool: ...
