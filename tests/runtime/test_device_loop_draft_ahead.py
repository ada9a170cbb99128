"""Drafting ahead at batch 1 (``DeviceSpeculativeDecoder.draft_ahead``): the next step's draft,
launched before a step returns (so the GPU drafts while the host does the scheduler's work),
gives the same tokens and accepted lengths as drafting at the step's start, across budgets, EOS
and requests that follow each other in the slot; a step that does not match the draft made for
it refuses it."""

from __future__ import annotations

import pytest
from helpers import PROMPT
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier

pytestmark = pytest.mark.parametrize("family", ["qwen3"], indirect=True)

DRAFTERS = [("dflash", "dflash", 3), ("pard_same", "pard", 4), ("ar_perturbed", "ar-draft", 3)]


def _loop(checkpoints, key, method, k, ahead):
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints[key], method), k, max_len=len(PROMPT) + 48)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len)
    loop.draft_ahead = ahead
    loop.made_ahead = 0
    step = loop.speculate

    def counted(*args, **kwargs):  # how many steps left a draft for the next one
        out = step(*args, **kwargs)
        loop.made_ahead += loop._ahead is not None
        return out

    loop.speculate = counted
    return loop


@pytest.mark.parametrize("key,method,k", DRAFTERS)
def test_drafting_ahead_gives_the_same_tokens(checkpoints, key, method, k):
    on, off = _loop(checkpoints, key, method, k, True), _loop(checkpoints, key, method, k, False)
    want_ref = reference(checkpoints["target"], 23)
    got, want = on.generate(PROMPT, 23, ()), off.generate(PROMPT, 23, ())
    assert got.tokens == want.tokens == want_ref
    assert got.stats.accepted_lengths == want.stats.accepted_lengths
    assert on.made_ahead >= len(got.stats.accepted_lengths) - 2 and off.made_ahead == 0
    # an EOS mid-way (its request ends with a draft made for a step that never comes), then
    # requests one after another in the slot (budgets ending mid-step)
    eos = want_ref[9]
    got, want = on.generate(PROMPT, 23, (eos,)), off.generate(PROMPT, 23, (eos,))
    assert got.tokens == want.tokens and got.finished_by == want.finished_by == "eos"
    prompts, budgets = [PROMPT, PROMPT[:4], PROMPT[2:]], [11, 3, 17]
    got = on.generate_batch(prompts, budgets, (), batch_size=1)
    want = off.generate_batch(prompts, budgets, (), batch_size=1)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.stats.accepted_lengths for r in got] == [r.stats.accepted_lengths for r in want]


def test_drafting_ahead_under_replayed_acceptance(checkpoints):
    """DFlash with acceptance replayed: accepted lengths vary step to step, the drafts ahead
    follow each step's accepted context."""
    loops = [_loop(checkpoints, "dflash", "dflash", 3, ahead) for ahead in (True, False)]
    for loop in loops:
        loop.verifier = ReplayVerifier([0.9, 0.7, 0.8], seed=5)
    got, want = (loop.generate(PROMPT, 30, ()) for loop in loops)
    assert got.tokens == want.tokens and got.stats.accepted_lengths == want.stats.accepted_lengths
    assert len(set(got.stats.accepted_lengths)) > 1 and loops[0].made_ahead > 0


def test_a_step_that_does_not_match_the_draft_made_ahead_refuses_it(checkpoints):
    loop = _loop(checkpoints, "pard_same", "pard", 4, True)
    scheduler = BatchScheduler(loop, 1)
    scheduler.submit(PROMPT, 30, ())
    scheduler.admit()
    scheduler.decode()
    assert loop._ahead is not None
    with pytest.raises(RuntimeError, match="made ahead"):
        loop.speculate([2])  # a budget the draft was not made for: k = 1
    scheduler = BatchScheduler(loop, 1)  # a new generation drops any draft made ahead
    assert loop._ahead is None
