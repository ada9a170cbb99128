"""Drafting ahead at batch > 1 (``DeviceSpeculativeDecoder.batch_draft_ahead``): the next step's
DFlash or PARD draft, launched between the step's decision and its host read from device state
alone (DFlash: the window of hidden states slid on the device, the block at each row's committed
length; PARD: each row's last committed tokens and the mask slots), gives
the same tokens and accepted lengths as drafting at the next step's start; admissions, requests
that finish at different steps, short prompts (too few entries for the full window) and budgets
that cap k all fall back to drafting at the step's start."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.drafters import ARDraft
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier

pytestmark = pytest.mark.parametrize("family", ["qwen3"], indirect=True)

OTHER = [7, 3, 30, 12, 1, 44, 6, 19]
THIRD = [11, 2, 40, 9, 9, 23]


def _loop(checkpoints, ahead: bool, k: int = 3, cap_to_budget: bool = True, key: str = "dflash",
          method: str = "dflash"):
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints[key], method), k, max_len=64)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len,
                                    cap_to_budget=cap_to_budget)
    loop.batch_draft_ahead = ahead
    loop.made_ahead = loop.took = 0
    step = loop.speculate

    def counted(*args, **kwargs):  # steps that left a draft for the next one / took one
        loop.took += loop._ahead is not None
        out = step(*args, **kwargs)
        loop.made_ahead += loop._ahead is not None
        return out

    loop.speculate = counted
    return loop


def _same(got, want):
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.finished_by for r in got] == [r.finished_by for r in want]
    assert [r.stats.accepted_lengths for r in got] == [r.stats.accepted_lengths for r in want]


DRAFTERS = pytest.mark.parametrize("key,method", [("dflash", "dflash"), ("pard_same", "pard")])


@DRAFTERS
@pytest.mark.parametrize("cap_to_budget", [True, False])
def test_drafting_ahead_at_batch_gives_the_same_tokens(checkpoints, cap_to_budget, key, method):
    on = _loop(checkpoints, True, cap_to_budget=cap_to_budget, key=key, method=method)
    off = _loop(checkpoints, False, cap_to_budget=cap_to_budget, key=key, method=method)
    prompts = [PROMPT, OTHER, PROMPT[1:]]
    got, want = on.generate_batch(prompts, 24, ()), off.generate_batch(prompts, 24, ())
    _same(got, want)
    for prompt, row in zip(prompts, got):
        assert row.tokens == reference(checkpoints["target"], 24, prompt=prompt)
    assert on.made_ahead >= 3 and on.took >= 3 and off.made_ahead == 0
    assert on.took <= on.made_ahead  # the last steps' drafts (an ending budget) are dropped


class _Recording(ReplayVerifier):
    """The replay verifier, keeping every step's drafts (what the step verified)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drafts = []

    def verify(self, drafts, target_logits, max_drafts=None, **kw):
        self.drafts.append(drafts.clone())
        return super().verify(drafts, target_logits, max_drafts, **kw)


@DRAFTERS
def test_drafting_ahead_at_batch_under_replayed_acceptance(checkpoints, key, method):
    """Acceptance replayed: the rows accept different counts step to step, so the window slides
    by a different amount per row; every step verifies exactly the drafts (the random drafter's,
    so a wrong window, position or cache length would change them) that drafting at the step's
    start gives."""
    loops = [_loop(checkpoints, ahead, key=key, method=method) for ahead in (True, False)]
    for loop in loops:
        loop.verifier = _Recording([0.9, 0.6, 0.8], seed=3)
    prompts = [PROMPT, OTHER, PROMPT[2:], OTHER[1:]]
    got, want = (loop.generate_batch(prompts, 30, ()) for loop in loops)
    _same(got, want)
    assert len({n for r in got for n in r.stats.accepted_lengths}) > 2 and loops[0].took > 3
    ahead, start = (loop.verifier.drafts for loop in loops)
    assert len(ahead) == len(start) > loops[0].took
    for a, b in zip(ahead, start):
        assert torch.equal(a, b)


@DRAFTERS
def test_admissions_finishes_and_short_prompts_fall_back(checkpoints, key, method):
    """More requests than slots (admissions between steps), requests ending at an EOS and at
    different budgets, and a prompt too short for the full window (3 tokens, W = 4): the same
    tokens as drafting at each step's start, and drafts made ahead are dropped whenever the next
    step is not the one they were made for."""
    on, off = _loop(checkpoints, True, key=key, method=method), _loop(checkpoints, False, key=key, method=method)
    eos = reference(checkpoints["target"], 20, prompt=OTHER)[6]
    prompts = [PROMPT, OTHER, THIRD, PROMPT[:3], OTHER[2:], PROMPT[3:]]
    budgets = [20, 17, 9, 12, 20, 5]
    got = on.generate_batch(prompts, budgets, (eos,), batch_size=3)
    want = off.generate_batch(prompts, budgets, (eos,), batch_size=3)
    _same(got, want)
    assert "eos" in [r.finished_by for r in got]
    for prompt, budget, row in zip(prompts, budgets, got):
        assert row.tokens == reference(checkpoints["target"], budget, eos=eos, prompt=prompt)
    assert on.took > 0 and on.took < on.made_ahead + 1


def test_a_short_row_stops_drafting_ahead(checkpoints):
    """A DFlash row with fewer than W - 1 committed entries before its block cannot re-feed the
    full window: the loop drafts at the step's start until it can."""
    loop = _loop(checkpoints, True)
    loop.generate_batch([PROMPT, [5, 9]], 2, ())
    assert loop.made_ahead == 0
    rows = loop.generate_batch([PROMPT, [5, 9]], 14, ())
    assert loop.made_ahead > 0
    assert rows[1].tokens == reference(checkpoints["target"], 14, prompt=[5, 9])


def test_drafters_without_a_draft_ahead_run_as_before(checkpoints):
    """An AR drafter has no ``draft_ahead_rows``: the flag changes nothing."""
    on = _loop(checkpoints, True, key="ar_perturbed", method="ar-draft")
    off = _loop(checkpoints, False, key="ar_perturbed", method="ar-draft")
    assert isinstance(on.drafter, ARDraft)
    prompts = [PROMPT, OTHER]
    _same(on.generate_batch(prompts, 16, ()), off.generate_batch(prompts, 16, ()))
    assert on.made_ahead == 0


@DRAFTERS
def test_a_step_that_does_not_match_the_draft_made_ahead_refuses_it(checkpoints, key, method):
    from specc.runtime.batching import BatchScheduler

    loop = _loop(checkpoints, True, key=key, method=method)
    scheduler = BatchScheduler(loop, 2, buckets=False)
    for prompt in (PROMPT, OTHER):
        scheduler.submit(prompt, 30, ())
    scheduler.admit()
    scheduler.decode()
    assert loop._ahead is not None
    loop.n[0] += 1  # a step the draft was not made for
    with pytest.raises(RuntimeError, match="made ahead"):
        loop.speculate([20, 20])


def test_a_draft_shorter_than_the_block_feeds_what_the_rows_need(checkpoints):
    """DFlash with k + 1 below its block (k = 2, W = 4): no full window, so no draft ahead; the
    rows feed their own unfed entries as before, and the tokens are the reference's."""
    on, off = _loop(checkpoints, True, k=2), _loop(checkpoints, False, k=2)
    prompts = [PROMPT, OTHER]
    got = on.generate_batch(prompts, 16, ())
    _same(got, off.generate_batch(prompts, 16, ()))
    assert on.made_ahead == 0
    assert got[1].tokens == reference(checkpoints["target"], 16, prompt=OTHER)
