"""``EngineWorker``: the ``ServeBackend`` whose one thread owns the engine.

torch state, CUDA graphs and the engine's static caches belong to one thread: the worker thread
loads the engine, builds the scheduler and is the only caller of either. The asyncio side talks
to it through queues: commands (submit, cancel, stop) go in through a thread-safe inbox, and each
request's chunks come back on its own ``asyncio.Queue``, filled with ``call_soon_threadsafe`` on
the event loop that submitted it.

The worker blocks on the inbox while it has nothing to do, and otherwise alternates: take every
pending command, call ``scheduler.step()`` once, hand the outputs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import AsyncIterator, Callable

from specc.serve.backend import BackendStats, GenerationError, GenerationRequest, ModelInfo, TokenChunk
from specc.serve.scheduler import Scheduler, SerialScheduler


@dataclasses.dataclass
class _Handle:
    """A submitted request as the worker sees it: where its chunks go."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    sink: asyncio.Queue
    rid: int | None = None


class _Stop:
    pass


class EngineWorker:
    """Serves ``load_engine()`` (called on the worker thread) with ``scheduler(engine)``
    (default ``SerialScheduler``) for sequences of up to ``max_len`` tokens (prompt + new;
    None: ``default_max_len`` of the artifact).

    ``start()`` loads and returns the ``ModelInfo``, re-raising whatever loading raised;
    ``close()`` cancels what is left and joins the thread."""

    def __init__(self, load_engine: Callable[[], object], max_len: int | None = None, model_name: str | None = None,
                 scheduler: Callable[[object], Scheduler] = SerialScheduler):
        self._load_engine, self._make_scheduler = load_engine, scheduler
        self.max_len, self.model_name = max_len, model_name
        self.info: ModelInfo | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="specc-engine", daemon=True)
        self._lock = threading.Lock()
        self._counts = dict(finished=0, failed=0, cancelled=0, generated_tokens=0, busy_seconds=0.0,
                            verification_steps=0, step_tokens=0)
        self._depth = (0, 0)  # (running, waiting), written by the worker thread
        self._closed = False

    # -- the asyncio side ------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> ModelInfo:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the engine did not load within {timeout} s")
        if self._load_error is not None:
            raise self._load_error
        return self.info

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    async def submit(self, request: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if not self.alive():
            raise GenerationError("the engine worker is not running")
        handle = _Handle(request, asyncio.get_running_loop(), asyncio.Queue())
        self._inbox.put(("submit", handle))
        done = False
        try:
            while True:
                item = await handle.sink.get()
                if isinstance(item, BaseException):
                    done = True
                    raise GenerationError(f"{type(item).__name__}: {' '.join(str(item).split())}") from item
                if item.finish_reason is not None:
                    done = True
                yield item
                if done:
                    return
        finally:
            if not done:  # the consumer left early (closed the iterator, or its task was cancelled)
                self.cancel(request.id)

    def cancel(self, request_id: str) -> None:
        self._inbox.put(("cancel", request_id))

    def stats(self) -> BackendStats:
        with self._lock:
            running, waiting = self._depth
            return BackendStats(running=running, waiting=waiting, **self._counts)

    def close(self, timeout: float | None = 30.0) -> None:
        if self._thread.is_alive():
            self._inbox.put((_Stop, None))
            self._thread.join(timeout)
        self._closed = True

    # -- the worker thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            engine = self._load_engine()
            if self.max_len is None:
                self.max_len = default_max_len(engine.manifest)
            engine.set_max_len(self.max_len)
            scheduler = self._make_scheduler(engine)
            self.info = _model_info(engine, self.max_len, self.model_name)
        except BaseException as exc:  # handed to start()
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        handles: dict[str, _Handle] = {}
        try:
            self._serve(scheduler, handles)
        except BaseException as exc:  # a bug in the loop itself: nobody may wait forever
            self._closed = True
            waiting = [arg for kind, arg in self._commands(block=False) if kind == "submit"]
            for h in [*handles.values(), *waiting]:
                self._deliver(h, exc)
            logging.getLogger("specc.serve").exception("the engine worker stopped")

    def _serve(self, scheduler, handles: dict) -> None:
        by_rid: dict[int, _Handle] = {}
        while True:
            busy = scheduler.num_running + scheduler.num_waiting > 0
            for kind, arg in self._commands(block=not busy):
                if kind is _Stop:
                    for h in handles.values():
                        self._deliver(h, GenerationError("the server is shutting down"))
                    return
                if kind == "submit":
                    self._submit(scheduler, arg, handles, by_rid)
                elif kind == "cancel" and arg in handles:
                    h = handles.pop(arg)
                    by_rid.pop(h.rid, None)
                    scheduler.cancel(h.rid)
                    self._count(cancelled=1)
            self._set_depth(scheduler)
            if scheduler.num_running + scheduler.num_waiting == 0:
                continue
            start = time.perf_counter()
            try:
                outputs = scheduler.step()
            except Exception as exc:  # not attributable to one request: fail those in flight, keep serving
                outputs = []
                for rid, h in list(by_rid.items()):
                    with contextlib.suppress(Exception):  # free its slot if the scheduler still can
                        scheduler.cancel(rid)
                    self._finish(h, handles, by_rid, failed=1)
                    self._deliver(h, exc)
            self._count(busy_seconds=time.perf_counter() - start)
            for out in outputs:
                self._hand_out(out, handles, by_rid)
            self._set_depth(scheduler)

    def _commands(self, block: bool):
        """Every command waiting in the inbox (waiting for one first when ``block``)."""
        out = []
        try:
            out.append(self._inbox.get() if block else self._inbox.get_nowait())
            while True:
                out.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return out

    def _submit(self, scheduler, h: _Handle, handles, by_rid) -> None:
        r = h.request
        eos = self.info.eos_token_ids if r.eos_token_ids is None else r.eos_token_ids
        try:
            h.rid = scheduler.submit(list(r.prompt_ids), r.max_new_tokens, tuple(eos), r.sampling)
        except Exception as exc:
            self._count(failed=1)
            self._deliver(h, exc)
            return
        handles[r.id] = h
        by_rid[h.rid] = h

    def _hand_out(self, out, handles, by_rid) -> None:
        h = by_rid.get(out.rid)
        if h is None:  # cancelled meanwhile
            return
        if out.error is not None:
            self._finish(h, handles, by_rid, failed=1)
            self._deliver(h, out.error)
            return
        stats = out.result.stats if out.result is not None else None
        self._count(generated_tokens=len(out.tokens))
        if out.finished:
            self._finish(h, handles, by_rid, finished=1, verification_steps=stats.steps if stats else 0,
                         step_tokens=sum(stats.accepted_lengths) if stats else 0)
        if out.tokens or out.finished:
            self._deliver(h, TokenChunk(tuple(out.tokens), out.finish_reason if out.finished else None,
                                        stats if out.finished else None))

    def _finish(self, h: _Handle, handles, by_rid, **counts) -> None:
        handles.pop(h.request.id, None)
        by_rid.pop(h.rid, None)
        self._count(**counts)

    @staticmethod
    def _deliver(h: _Handle, item) -> None:
        try:
            h.loop.call_soon_threadsafe(h.sink.put_nowait, item)
        except RuntimeError:  # its event loop is closed: nobody is listening any more
            pass

    def _count(self, **deltas) -> None:
        with self._lock:
            for k, v in deltas.items():
                self._counts[k] += v

    def _set_depth(self, scheduler) -> None:
        with self._lock:
            self._depth = (scheduler.num_running, scheduler.num_waiting)


def default_max_len(manifest: dict, cap: int = 2048) -> int:
    """The model's positions (``max_position_embeddings``), at most ``cap``."""
    positions = manifest["model"].get("max_position_embeddings")
    return min(cap, positions) if isinstance(positions, int) and positions > 0 else cap


def _model_info(engine, max_len: int, name: str | None) -> ModelInfo:
    """The served model's facts, with a tokenizer of its own (loaded from the artifact, so the
    HTTP side never touches the engine or its attributes)."""
    from specc.models.loading import load_tokenizer

    model = engine.manifest["model"]
    return ModelInfo(name=name or str(model.get("name") or engine.path.name), max_len=max_len,
                     vocab_size=int(model["vocab_size"]), eos_token_ids=tuple(engine.eos_token_ids),
                     tokenizer=load_tokenizer(engine.path))
