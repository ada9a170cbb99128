"""EngineWorker: requests submitted from asyncio run on the worker thread, which alone touches
the engine; outputs equal one-at-a-time Engine.generate, also after a request cancelled half
way; errors reach the request they belong to (or all in flight), and the worker keeps serving."""

from __future__ import annotations

import asyncio
import threading

import pytest

from specc.errors import UserError
from specc.serve.backend import GenerationError, GenerationRequest
from specc.serve.worker import EngineWorker
from serve_fakes import collect


class ThreadCheckedEngine:
    """An engine proxy that records the thread of every attribute access."""

    def __init__(self, engine):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "threads", set())

    def __getattr__(self, name):
        self.threads.add(threading.get_ident())
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def reference(tiny_artifact):
    from specc.runtime.engine import load

    return load(tiny_artifact)


@pytest.fixture(scope="module")
def worker(tiny_artifact):
    from specc.runtime.engine import load

    proxies = []

    def load_engine():
        proxies.append(ThreadCheckedEngine(load(tiny_artifact)))
        return proxies[0]

    w = EngineWorker(load_engine, max_len=128)
    w.start()
    w.proxies = proxies
    yield w
    w.close()


def test_engine_stream_returns_the_generate_result(reference):
    """SerialScheduler reads the finish and the per-step stats from Engine.stream's return value."""
    from specc.runtime.loop import run_to_end

    streamed, whole = run_to_end(reference.stream([5, 6, 7], 9)), reference.generate([5, 6, 7], 9)
    assert streamed.tokens == whole.tokens and streamed.stats.accepted_lengths == whole.stats.accepted_lengths
    assert streamed.finished_by == whole.finished_by


PROMPTS = [([5, 6, 7, 8], 10), ([100, 200, 300], 7), ([9] * 20, 12), ([42], 1)]


def test_concurrent_requests_equal_one_at_a_time_generate(worker, reference):
    async def main():
        return await asyncio.gather(*(collect(worker, GenerationRequest(f"r{i}", tuple(p), n))
                                      for i, (p, n) in enumerate(PROMPTS)))

    results = asyncio.run(main())
    for (prompt, n), (tokens, reason) in zip(PROMPTS, results):
        expected = reference.generate(prompt, n)
        assert tokens == expected.tokens
        assert reason == {"eos": "stop", "length": "length"}[expected.finished_by]
    engine = worker.proxies[0]
    assert engine.threads == {worker._thread.ident}  # only the worker thread touched the engine
    stats = worker.stats()
    assert stats.finished >= len(PROMPTS) and stats.running == stats.waiting == 0
    assert stats.verification_steps > 0 and stats.accepted_tokens_per_step >= 1.0 and stats.tokens_per_second > 0


def test_a_request_cancelled_half_way_leaves_the_engine_clean(worker, reference):
    async def main():
        cut = await collect(worker, GenerationRequest("cut", (5, 6, 7, 8), 40), stop_after=3)
        after = await asyncio.gather(*(collect(worker, GenerationRequest(f"a{i}", tuple(p), n))
                                       for i, (p, n) in enumerate(PROMPTS[:2])))
        return cut, after

    before = worker.stats().cancelled
    cut, after = asyncio.run(main())
    assert cut[0] == reference.generate([5, 6, 7, 8], 40).tokens[:len(cut[0])] and cut[1] is None
    for (prompt, n), (tokens, _) in zip(PROMPTS[:2], after):
        assert tokens == reference.generate(prompt, n).tokens
    assert worker.stats().cancelled == before + 1


def test_an_engine_error_fails_its_request_and_the_worker_serves_on(worker, reference):
    async def main():
        with pytest.raises(GenerationError):  # a token id past the vocabulary (the app refuses it earlier)
            await collect(worker, GenerationRequest("bad", (5, 10 ** 6), 4))
        return await collect(worker, GenerationRequest("ok", (5, 6), 4))

    assert asyncio.run(main())[0] == reference.generate([5, 6], 4).tokens and worker.alive()


class _ExplodingScheduler:
    """A scheduler whose step fails on its first call (not attributable to one request)."""

    def __init__(self, engine):
        self.pending, self.steps = [], 0

    num_waiting = property(lambda self: 0)
    num_running = property(lambda self: len(self.pending))

    def submit(self, prompt_ids, max_new_tokens, eos_token_ids, sampling=None):
        self.pending.append(len(self.pending))
        return self.pending[-1]

    def cancel(self, rid):
        self.pending.remove(rid)

    def step(self):
        self.steps += 1
        if self.steps == 1:
            raise RuntimeError("batch step failed")
        from specc.serve.scheduler import StepOutput

        return [StepOutput(self.pending.pop(0), [1], True, "length")]


class _StubEngine:
    manifest = {"model": {"name": "stub", "vocab_size": 8}}
    eos_token_ids = ()
    path = None

    def set_max_len(self, n):
        pass


def test_a_failing_step_fails_those_in_flight_and_the_next_request_runs(monkeypatch):
    monkeypatch.setattr("specc.models.loading.load_tokenizer", lambda path: None)
    w = EngineWorker(_StubEngine, max_len=16, scheduler=_ExplodingScheduler)
    info = w.start()
    assert info.name == "stub" and info.tokenizer is None

    async def main():
        with pytest.raises(GenerationError, match="batch step failed"):
            await collect(w, GenerationRequest("x", (1,), 2))
        return await collect(w, GenerationRequest("y", (1,), 2))

    try:
        assert asyncio.run(main()) == ([1], "length")
        assert w.stats().failed == 1 and w.stats().finished == 1
    finally:
        w.close()
    assert not w.alive()


class _BrokenScheduler(_ExplodingScheduler):
    def step(self):  # not a list of StepOutput: the worker's own loop fails
        return ["garbage"]


def test_if_the_worker_loop_dies_waiting_requests_fail_and_it_reports_dead(monkeypatch, caplog):
    monkeypatch.setattr("specc.models.loading.load_tokenizer", lambda path: None)
    w = EngineWorker(_StubEngine, max_len=16, scheduler=_BrokenScheduler)
    w.start()

    async def main():
        with pytest.raises(GenerationError):
            await collect(w, GenerationRequest("x", (1,), 2))
        w._thread.join(10)
        with pytest.raises(GenerationError, match="not running"):
            await collect(w, GenerationRequest("y", (1,), 2))

    asyncio.run(main())
    assert not w.alive() and "the engine worker stopped" in caplog.text
    w.close()


def test_a_load_error_reaches_start():
    def broken():
        raise UserError("tiny.specc: not a specc artifact")

    with pytest.raises(UserError, match="not a specc artifact"):
        EngineWorker(broken).start(timeout=30)
