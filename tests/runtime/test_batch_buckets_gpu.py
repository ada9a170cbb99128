"""Batch buckets on the GPU (GPU only): a compiled artifact's CUDA-graphed steps, captured per
width, replayed as the width moves between buckets and back. The scheduler with buckets gives
the tokens of the same scheduler without them, and graphs replay at more than one width."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
QWEN3 = pytest.mark.parametrize("family", ["qwen3"], indirect=True)
PROMPTS = [[5, 17, 33, 2, 8, 9, 41], [7, 3], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [9], [40, 41, 6, 1, 23],
           [8, 8, 1], [30, 2, 71, 5], [12]]
BUDGETS = [4, 30, 6, 26, 5, 18, 3, 22]  # finishing at different steps: moves, widths 8 -> 4 -> 2


@contextlib.contextmanager
def widths_seen(loop):
    """The loop's width at each speculative step inside the block (a list filled as it runs)."""
    widths = []
    speculate = loop.speculate

    def traced(budgets, *args, **kwargs):
        widths.append(loop.batch)
        return speculate(budgets, *args, **kwargs)

    loop.speculate = traced
    try:
        yield widths
    finally:
        del loop.speculate


@QWEN3
@pytest.mark.parametrize("key,tree", [("dflash", "off"), ("pard_same", "off"), ("pard_same", "8")])
def test_bucketed_graphs_give_the_unbucketed_tokens(checkpoints, tmp_path, monkeypatch, key, tree):
    import specc
    from specc.compiler import compile_artifact
    from specc.runtime.batching import BatchScheduler

    # every narrowing taken (a toy model's steps cost the same at any width: the measured-gain check would skip them)
    monkeypatch.setattr(BatchScheduler, "_narrowing_pays", lambda self, wanted: True)
    path = tmp_path / "a.specc"
    compile_artifact(checkpoints["target"], checkpoints[key], out=path, max_new_tokens=4, tree=tree)
    engine = specc.load(path, device="cuda", max_len=48)
    runs = {}
    for buckets in (False, True, True):  # the second bucketed pass replays the graphs of every width
        scheduler = BatchScheduler(engine.loop, 8, buckets=buckets)
        with widths_seen(engine.loop) as widths:
            results = scheduler.run([(p, m, ()) for p, m in zip(PROMPTS, BUDGETS)])
        runs.setdefault(buckets, []).append(([r.tokens for r in results], widths))
    (off, off_widths), = runs[False]
    assert set(off_widths) == {8}
    for tokens, widths in runs[True]:
        assert tokens == off and {2, 4, 8} <= set(widths)
    stats = engine.loop.graph_stats().values()
    assert sum(s["captures"] for s in stats) >= 3 and sum(s["replays"] for s in stats) > 0


@QWEN3
def test_sampled_requests_narrow_under_graphs_as_without_buckets(checkpoints, tmp_path, monkeypatch):
    """Sampled and greedy requests in one graphed batch: their seeds, parameters and seen sets move
    with them as the width narrows (``SamplingPolicy.move_rows``); the tokens equal the same batch
    without buckets (the random numbers depend on seed and position, not on the slot)."""
    import specc
    from specc.compiler import compile_artifact
    from specc.runtime.batching import BatchScheduler
    from specc.sampling.params import SamplingParams

    monkeypatch.setattr(BatchScheduler, "_narrowing_pays", lambda self, wanted: True)
    path = tmp_path / "a.specc"
    compile_artifact(checkpoints["target"], checkpoints["dflash"], out=path, max_new_tokens=4)
    engine = specc.load(path, device="cuda", max_len=48)
    params = [SamplingParams(temperature=0.8, seed=3), None, SamplingParams(temperature=1.0, top_k=5, seed=9), None,
              SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.2, seed=11), None, None,
              SamplingParams(temperature=1.0, seed=5)]
    off = engine.loop.generate_batch(PROMPTS, BUDGETS, (), sampling=params, buckets=False)
    with widths_seen(engine.loop) as widths:
        on = engine.loop.generate_batch(PROMPTS, BUDGETS, (), sampling=params, buckets=True)
    assert {2, 4, 8} <= set(widths)
    assert [r.tokens for r in on] == [r.tokens for r in off]
