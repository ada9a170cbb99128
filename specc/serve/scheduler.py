"""Schedulers: what the worker thread calls to make progress on the requests it holds.

The worker (``specc.serve.worker``) owns the engine and, on its one thread only, calls::

    rid = scheduler.submit(prompt_ids, max_new_tokens, eos_token_ids)
    outputs = scheduler.step()          # one unit of progress; [StepOutput, ...]
    scheduler.cancel(rid)

``num_running`` / ``num_waiting`` give the queue depth. This is the shape of a
continuous-batching scheduler (``submit`` / ``step`` / ``cancel`` with slots reused), so one
drops in through the worker's ``scheduler=`` factory (docs/serve.md, "The scheduler
interface").

``SerialScheduler`` runs one request at a time, first come first served, through
``Engine.stream``: the engine's loop holds one sequence, so requests cannot interleave on it.
``BatchingScheduler`` decodes up to ``capacity`` requests together through the runtime's
continuous-batching scheduler (``Engine.scheduler``: slots reused, docs/batching.md).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Protocol

from specc.result import GenerationResult, GenerationStats

# GenerationResult.finished_by -> the OpenAI finish_reason
FINISH_REASON = {"eos": "stop", "length": "length"}


@dataclasses.dataclass
class StepOutput:
    """Progress of one request in one ``step()``: new tokens; when ``finished``, its
    ``finish_reason`` ("stop" | "length") and ``result`` (with per-step stats), or the
    ``error`` that ended it."""

    rid: int
    tokens: list[int]
    finished: bool = False
    finish_reason: str | None = None
    result: GenerationResult | None = None
    error: BaseException | None = None


class Scheduler(Protocol):
    def submit(self, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: tuple[int, ...],
               sampling=None) -> int: ...

    def step(self) -> list[StepOutput]: ...

    def cancel(self, rid: int) -> None: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...


@dataclasses.dataclass
class _Queued:
    rid: int
    prompt_ids: list[int]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    sampling: object | None = None  # SamplingParams; None: greedy
    tokens: list[int] = dataclasses.field(default_factory=list)  # generated so far


class SerialScheduler:
    """One request at a time through ``engine.stream``; each ``step()`` takes the next
    committed token of the running request (the engine commits a verification step's tokens
    together, so the tokens of one step arrive in consecutive calls without more device work).

    An exception from the engine ends only the request it was running (``StepOutput.error``);
    the next request starts a fresh generation (the loop re-prefills, resetting its state)."""

    def __init__(self, engine):
        self.engine = engine
        self._next_rid = 0
        self._waiting: collections.OrderedDict[int, _Queued] = collections.OrderedDict()
        self._current: tuple[int, object, _Queued] | None = None  # (rid, the engine's token generator, request)

    def submit(self, prompt_ids, max_new_tokens: int, eos_token_ids=(), sampling=None) -> int:
        rid = self._next_rid
        self._next_rid += 1
        self._waiting[rid] = _Queued(rid, list(prompt_ids), int(max_new_tokens), tuple(eos_token_ids), sampling)
        return rid

    @property
    def num_running(self) -> int:
        return 1 if self._current is not None else 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def cancel(self, rid: int) -> None:
        if self._current is not None and self._current[0] == rid:
            self._current[1].close()
            self._current = None
        else:
            self._waiting.pop(rid, None)

    def step(self) -> list[StepOutput]:
        if self._current is None:
            if not self._waiting:
                return []
            _, q = self._waiting.popitem(last=False)
            self._current = (q.rid, self.engine.stream(q.prompt_ids, q.max_new_tokens, q.eos_token_ids,
                                                       sampling=q.sampling), q)
        rid, gen, q = self._current
        try:
            token = next(gen)
        except StopIteration as stop:
            self._current = None
            result: GenerationResult | None = stop.value
            if result is None:  # an engine whose stream returns nothing: the finish from the tokens
                result = GenerationResult.finish(q.tokens, GenerationStats(), "", q.eos_token_ids)
            return [StepOutput(rid, [], True, FINISH_REASON.get(result.finished_by, "length"), result)]
        except Exception as exc:  # this request's generation failed; the others go on
            self._current = None
            gen.close()
            return [StepOutput(rid, [], True, error=exc)]
        q.tokens.append(int(token))
        return [StepOutput(rid, [int(token)])]


class BatchingScheduler:
    """Up to ``capacity`` requests decoded together (``specc.runtime.batching.BatchScheduler``
    over the engine's loop, sequences of up to ``max_len`` tokens); its step events become
    ``StepOutput``s, a finished request's with its ``GenerationResult``. Each request's tokens
    equal that request run alone (greedy, or sampled with its own params and seed)."""

    def __init__(self, engine, capacity: int, max_len: int | None = None):
        self._inner = engine.scheduler(capacity, max_len)

    def submit(self, prompt_ids, max_new_tokens: int, eos_token_ids=(), sampling=None) -> int:
        """``sampling``: the request's ``SamplingParams`` (None: greedy); requests with different
        params (greedy among them) share the batch, each with its own parameters and seed."""
        return self._inner.submit(list(prompt_ids), int(max_new_tokens), tuple(eos_token_ids), sampling=sampling)

    @property
    def num_running(self) -> int:
        return self._inner.num_running

    @property
    def num_waiting(self) -> int:
        return self._inner.num_waiting

    def cancel(self, rid: int) -> None:
        if self._inner.cancel(rid):
            self._inner.take(rid)  # nobody reads a cancelled request's result

    def step(self) -> list[StepOutput]:
        outputs = []
        for event in self._inner.step():
            if not event.finished:
                outputs.append(StepOutput(event.rid, list(event.tokens)))
                continue
            result = self._inner.take(event.rid)
            outputs.append(StepOutput(event.rid, list(event.tokens), True,
                                      FINISH_REASON.get(result.finished_by, "length"), result))
        return outputs
