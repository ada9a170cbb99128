"""The worker over the continuous-batching scheduler (``specc serve --batch-size N``): concurrent
requests of different lengths, budgets and sampling params (greedy and sampled) are decoded
together, each equal to one-at-a-time ``Engine.generate``; a request cancelled half way frees its
slot for the next."""

from __future__ import annotations

import asyncio

import pytest

from specc.sampling import SamplingParams
from specc.serve.backend import GenerationRequest
from specc.serve.scheduler import BatchingScheduler
from specc.serve.worker import EngineWorker
from serve_fakes import collect

PROMPTS = [([5, 6, 7, 8], 10), ([100, 200, 300], 7), ([9] * 20, 12), ([42], 1), ([7, 70, 700], 9)]


class _Recording(BatchingScheduler):
    """Records the most requests that ran together in one step."""

    most = 0

    def step(self):
        self.most = max(self.most, self.num_running + min(self.num_waiting, 3 - self.num_running))
        return super().step()


@pytest.fixture(scope="module")
def reference(tiny_artifact):
    from specc.runtime.engine import load

    return load(tiny_artifact)


@pytest.fixture(scope="module")
def worker(tiny_artifact):
    from specc.runtime.engine import load

    made = []

    def scheduler(engine):
        made.append(_Recording(engine, 3, 128))
        return made[-1]

    w = EngineWorker(lambda: load(tiny_artifact), max_len=128, scheduler=scheduler)
    w.start()
    w.schedulers = made
    yield w
    w.close()


def test_concurrent_requests_batched_equal_one_at_a_time(worker, reference):
    async def main():
        cut = asyncio.ensure_future(collect(worker, GenerationRequest("cut", (5, 6, 7, 8), 40), stop_after=3))
        rest = await asyncio.gather(*(collect(worker, GenerationRequest(f"r{i}", tuple(p), n))
                                      for i, (p, n) in enumerate(PROMPTS)))
        return await cut, rest

    cut, results = asyncio.run(main())
    assert cut[0] == reference.generate([5, 6, 7, 8], 40).tokens[:len(cut[0])]
    for (prompt, n), (tokens, reason) in zip(PROMPTS, results):
        expected = reference.generate(prompt, n)
        assert tokens == expected.tokens
        assert reason == {"eos": "stop", "length": "length"}[expected.finished_by]
    stats = worker.stats()
    assert stats.running == stats.waiting == 0 and stats.finished >= len(PROMPTS)
    assert worker.schedulers[0].most == 3  # requests were decoded together


SAMPLED = [([5, 6, 7, 8], 10, SamplingParams(temperature=0.8, top_p=0.9, seed=1)),
           ([100, 200, 300], 8, None),  # greedy among them
           ([9] * 20, 12, SamplingParams(temperature=1.2, top_k=30, seed=2)),
           ([7, 70, 700], 9, SamplingParams(temperature=0.7, min_p=0.05, repetition_penalty=1.2, seed=3)),
           ([5, 6, 7, 8], 10, SamplingParams(temperature=0.8, top_p=0.9, seed=4))]


def test_concurrent_sampled_requests_batched_equal_one_at_a_time(worker, reference):
    """Requests with different sampling params and seeds (and a greedy one) share the batch; each
    gets exactly what ``Engine.generate`` gives it alone."""
    async def main():
        return await asyncio.gather(*(collect(worker, GenerationRequest(f"s{i}", tuple(p), n, sampling=s))
                                      for i, (p, n, s) in enumerate(SAMPLED)))

    results = asyncio.run(main())
    alone = [reference.generate(p, n, sampling=s).tokens for p, n, s in SAMPLED]
    assert [tokens for tokens, _ in results] == alone
    assert alone[0] != alone[4]  # the seed matters: the same prompt and params, different tokens
    assert alone[1] == reference.generate([100, 200, 300], 8).tokens
