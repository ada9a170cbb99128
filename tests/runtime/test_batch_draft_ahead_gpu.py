"""Drafting ahead at batch > 1 on the GPU (GPU only): a compiled DFlash or PARD artifact's graphed steps,
the decision read through a pinned buffer behind an event while the next step's draft runs.
Every step verifies the drafts that drafting at its start gives, and the tokens and accepted
lengths are those of the loop without drafting ahead, with acceptance replayed so that rows
accept different counts."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.parametrize("family", ["qwen3"], indirect=True)]
PROMPTS = [[5, 17, 33, 2, 8, 9, 41], [7, 3, 30, 12, 1, 44], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3],
           [40, 41, 6, 1, 23], [8, 8, 1], [30, 2, 71, 5, 9]]
BUDGETS = [30, 24, 12, 28, 20, 9]


def _run(engine, ahead: bool):
    from specc.runtime.replay import ReplayVerifier

    loop = engine.loop
    loop.batch_draft_ahead = ahead
    loop.use_verifiers(chain=ReplayVerifier([0.9, 0.6, 0.8], seed=3))
    verified, took = [], [0]
    accept_fn, speculate = loop._chain_accept_fn, loop.speculate

    def recording():
        fn = accept_fn()

        def call(drafts, *args):
            verified.append(drafts.clone())
            return fn(drafts, *args)
        return call

    def counted(*args, **kwargs):
        took[0] += loop._ahead is not None
        return speculate(*args, **kwargs)

    loop._chain_accept_fn, loop.speculate = recording, counted
    try:
        rows = loop.generate_batch(PROMPTS, BUDGETS, (), batch_size=4, buckets=False)
    finally:
        del loop._chain_accept_fn, loop.speculate
    return rows, verified, took[0]


@pytest.mark.parametrize("key", ["dflash", "pard_same"])
def test_drafts_made_ahead_on_the_gpu_equal_drafts_made_at_the_step(checkpoints, tmp_path, key):
    import specc
    from specc.compiler import compile_artifact

    path = tmp_path / "a.specc"
    # k = 3: the test drafters' block (DFlash W = 4) less one, where DFlash drafts ahead (a full window);
    # the compiler's own choice of k may be shorter, and then only PARD would draft ahead
    compile_artifact(checkpoints["target"], checkpoints[key], out=path, max_new_tokens=4, num_draft=3)
    engine = specc.load(path, device="cuda", max_len=64)
    off, off_drafts, _ = _run(engine, False)
    on, on_drafts, took = _run(engine, True)
    assert took > 5
    assert [r.tokens for r in on] == [r.tokens for r in off]
    assert [r.stats.accepted_lengths for r in on] == [r.stats.accepted_lengths for r in off]
    assert len(on_drafts) == len(off_drafts)
    for a, b in zip(on_drafts, off_drafts):
        assert torch.equal(a, b)
