"""Drafts per step by goodput (specc.runtime.adaptive): the expected-tokens formula, the
acceptance estimate, the choice against a step-time curve, the per-request choice against a
ragged step-time curve (checked against brute force), and a scheduler driven by it stays
lossless while its k changes with the requests' measured acceptance."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.adaptive import AcceptanceEstimate, GoodputDraftLength, expected_tokens
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager

PROMPTS = [[5, 17, 33, 2, 8, 9, 41], [7, 3], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [9]]


def test_expected_tokens_is_the_geometric_sum():
    for alpha in (0.0, 0.3, 0.9, 1.0):
        for k in range(6):
            assert expected_tokens(alpha, k) == pytest.approx(sum(alpha ** i for i in range(k + 1)))


def test_acceptance_estimate_from_steps():
    est = AcceptanceEstimate()
    assert est.alpha == 0.5
    est.observe(4, 4)  # all accepted: no rejection
    est.observe(4, 1)  # one accepted, then a rejection
    assert est.alpha == pytest.approx((1 + 5) / (1 + 5 + 1 + 1))


def test_goodput_choice_follows_the_curve():
    flat = GoodputDraftLength(lambda rows, k: 1.0, 8)  # drafting is free: draft all
    assert flat.choose([0.5, 0.1], [20, 20], 2) == 8
    assert flat.choose([0.5], [3], 1) == 3  # never past what the row can still use
    steep = GoodputDraftLength(lambda rows, k: 1.0 + rows * k, 8)  # every draft costs a full step
    assert steep.choose([0.9, 0.9], [20, 20], 2) == 0
    mid = GoodputDraftLength(lambda rows, k: 1.0 + 0.1 * rows * k, 8)
    assert 0 < mid.choose([0.8] * 4, [20] * 4, 4) < mid.choose([0.8], [20], 1)
    with pytest.raises(ValueError, match="positive"):
        GoodputDraftLength(lambda rows, k: 0.0, 2).choose([0.5], [4], 1)


def _ragged_goodput(alphas, ks, seconds):
    return sum(expected_tokens(a, k) for a, k in zip(alphas, ks)) / seconds(len(alphas), sum(k + 1 for k in ks))


@settings(max_examples=40, deadline=None)
@given(alphas=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
       caps=st.lists(st.integers(0, 4), min_size=4, max_size=4), k_max=st.integers(0, 4),
       cost=st.tuples(st.floats(0.1, 10.0), st.floats(0.0, 2.0), st.floats(0.0, 0.5)))
def test_per_request_choice_is_the_brute_force_optimum(alphas, caps, k_max, cost):
    """Greedy by marginal gain reaches the best sum E_b(k_b) / T(R, sum (k_b + 1)) over every
    allocation within the caps and k_max, for convex and linear step-time curves."""
    base, per_row, per_token2 = cost
    caps = caps[:len(alphas)]

    def seconds(rows, tokens):
        return base + per_row * rows + 0.1 * tokens + per_token2 * tokens ** 2

    rule = GoodputDraftLength(lambda rows, k: 1.0, k_max, ragged_seconds=seconds)
    ks = rule.choose_rows(alphas, caps, 8)
    assert len(ks) == len(alphas) and all(0 <= k <= min(c, k_max) for k, c in zip(ks, caps))
    best = max(_ragged_goodput(alphas, combo, seconds)
               for combo in itertools.product(*(range(min(c, k_max) + 1) for c in caps)))
    assert _ragged_goodput(alphas, ks, seconds) == pytest.approx(best, rel=1e-9)


def test_per_request_choice_follows_each_requests_acceptance():
    rule = GoodputDraftLength(lambda rows, k: 1.0, 6, ragged_seconds=lambda rows, tokens: 1.0 + 0.1 * tokens)
    ks = rule.choose_rows([0.95, 0.02, 0.6], [20, 20, 20], 3)
    assert ks[1] == 0 and ks[0] > ks[2] > 0  # a request never accepted drafts none, the others keep theirs
    assert rule.choose_rows([0.95, 0.95], [2, 20], 2)[0] == 2  # never past what the row can still use
    assert rule.choose_rows([], [], 3) == []
    one_k = GoodputDraftLength(lambda rows, k: 1.0 + 0.2 * k, 6)  # no ragged curve: one k for all
    assert one_k.choose_rows([0.9, 0.1], [20, 20], 2) == [one_k.choose([0.9, 0.1], [20, 20], 2)] * 2
    with pytest.raises(ValueError, match="ragged_seconds"):
        GoodputDraftLength(lambda rows, k: 1.0, 2, ragged_seconds=lambda rows, tokens: 0.0).choose_rows([0.5], [4], 1)


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", [
    ("pard", "target", "pard_same", 4), ("dflash", "const_target", "const_dflash", 3),
    ("ar-draft", "target", "ar_random", 4)])
def test_scheduler_with_goodput_rule_is_lossless_and_adapts(checkpoints, method, target_key, drafter_key, num_draft):
    target = checkpoints[target_key]
    pair = resolve_pair(target, checkpoints[drafter_key], method)
    eager = build_eager(pair, num_draft, max_len=40)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len)
    rule = GoodputDraftLength(lambda rows, k: 1.0 + 0.2 * k, loop.num_draft)
    scheduler = BatchScheduler(loop, 3, draft_length=rule)
    budgets = [16, 12, 20, 9]
    rids = [scheduler.submit(p, m) for p, m in zip(PROMPTS, budgets)]
    chosen = []
    while not scheduler.idle:
        scheduler.step()
        chosen.append(scheduler.last_num_draft)
    for rid, prompt, budget in zip(rids, PROMPTS, budgets):
        assert scheduler.take(rid).tokens == reference(target, budget, prompt=prompt)
    ks = [k for k in chosen if k is not None]
    if drafter_key == "ar_random":  # nothing is ever accepted: the rule stops drafting
        assert ks[-1] == 0
    elif drafter_key == "const_dflash":  # everything is accepted: the rule drafts the most it can
        assert max(ks) == loop.num_draft
    assert len(set(ks)) > 1  # the choice followed the measured acceptance


def test_steps_without_drafts_then_drafting_again(checkpoints):
    """The rule stops drafting for requests whose drafter is never right (k = 0 steps: DFlash
    keeps their unfed target hidden states) and drafts again when a new request (prior
    acceptance 0.5) joins; every request stays equal to HF greedy alone."""
    target = checkpoints["target"]
    eager = build_eager(resolve_pair(target, checkpoints["dflash"], "dflash"), 3, max_len=40)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len)
    scheduler = BatchScheduler(loop, 3, draft_length=GoodputDraftLength(lambda rows, k: 1.0 + 0.3 * k, 3))
    asked = {scheduler.submit(PROMPTS[0], 20): (PROMPTS[0], 20)}
    chosen = []
    for step in range(40):
        if step in (6, 12):
            prompt, budget = PROMPTS[1 + step // 6], 9
            asked[scheduler.submit(prompt, budget)] = (prompt, budget)
        if scheduler.idle:
            break
        scheduler.step()
        chosen.append(scheduler.last_num_draft)
    for rid, (prompt, budget) in asked.items():
        assert scheduler.take(rid).tokens == reference(target, budget, prompt=prompt)
    first_zero = chosen.index(0)
    assert any(k for k in chosen[first_zero:])  # drafting resumed after steps without drafts


def test_a_prior_starts_each_request_where_the_choice_was_priced(checkpoints):
    """With drafting this costly, the uniform prior (alpha 0.5) offers no drafts to a new request,
    and a request offered none never learns otherwise; the rule's ``prior_alpha`` (the acceptance
    the batching choice was priced with) starts every request of the scheduler there instead."""
    assert AcceptanceEstimate.from_prior(0.9, 4.0).alpha == pytest.approx(0.9)
    assert AcceptanceEstimate.from_prior(1.0, 4.0).alpha == pytest.approx(0.99)  # never certain
    costly = lambda rows, k: 1.0 + 0.6 * k  # noqa: E731
    assert GoodputDraftLength(costly, 4).choose([0.5], [20], 1) == 0
    rule = GoodputDraftLength(costly, 4, prior_alpha=0.95)
    assert rule.choose([rule.new_estimate().alpha], [20], 1) > 0
    with pytest.raises(ValueError):
        GoodputDraftLength(costly, 4, prior_alpha=1.5)
    target = checkpoints["target"]
    eager = build_eager(resolve_pair(target, checkpoints["pard_same"], "pard"), 4, max_len=40)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len)
    scheduler = BatchScheduler(loop, 2, draft_length=rule)
    rids = [scheduler.submit(p, 8) for p in PROMPTS[:2]]
    scheduler.step()
    assert scheduler.last_num_draft > 0  # drafted from the first step
    # a rule without ragged_seconds is one k per step: verified dense, though the loop could pack
    assert loop.verifies_ragged and scheduler.last_row_drafts is None
    while not scheduler.idle:
        scheduler.step()
    for rid, prompt in zip(rids, PROMPTS[:2]):
        assert scheduler.take(rid).tokens == reference(target, 8, prompt=prompt)
