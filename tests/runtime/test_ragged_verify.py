"""Ragged verify and per-request draft lengths (specc.runtime.ragged, the device loop's packed
verify): rows verify their own numbers of tokens (0 drafts for some, rows capped at their
budget, free slots none) in one packed forward, and every request's tokens equal that prompt
alone and HF greedy, for qwen3 and llama targets with AR, PARD and DFlash drafters."""

import pytest
from lossless import reference
from ragged_helpers import BUDGETS, PROMPTS, RowPattern, make_loop, run_requests

from specc.runtime.batching import BatchScheduler

SCENARIOS = [  # (method, target key, drafter key, drafts per step)
    ("ar-draft", "target", "ar_perturbed", 3),
    ("pard", "target", "pard_same", 4),
    ("dflash", "target", "dflash", 3),
    ("dflash", "const_target", "const_dflash", 3),
]


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", SCENARIOS)
def test_per_request_drafts_verify_ragged_and_equal_each_prompt_alone(checkpoints, method, target_key, drafter_key,
                                                                     num_draft):
    """Per-request k (0 for some rows), prompts of different lengths, small budgets (rows capped
    at their budget) and more requests than slots (free slots, joins): the packed verifies take
    each row's own token count, and every request equals HF greedy alone."""
    target = checkpoints[target_key]
    loop = make_loop(checkpoints, method, target_key, drafter_key, num_draft)
    assert loop.verifies_ragged
    rule = RowPattern([[num_draft, 0, 2], [1, num_draft, 0], [2, 2, num_draft]])
    results, rows = run_requests(loop, rule)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(target, budget, prompt=prompt)
        assert result.finished_by == "length"
    assert "choose" not in rule.asked  # the scheduler asked per request
    assert any(r is not None and 0 in r and max(r) > 0 for r in rows)
    counts = [c for _, cs, _ in loop.ragged_target.calls for c in cs]
    assert loop.ragged_target.calls and len(set(counts)) > 2  # rows verified 1, 2, ... tokens in one forward
    assert any(len(slots) < loop.batch for slots, _, _ in loop.ragged_target.calls)  # free slots took none


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", SCENARIOS[1:2])
def test_uncapped_loop_and_a_loop_without_a_ragged_step(checkpoints, method, target_key, drafter_key, num_draft):
    """cap_to_budget off: a ragged verify still takes only what a row can use. Without a ragged
    step the scheduler asks one k for the batch (``choose``) and the tokens are the same."""
    target = checkpoints[target_key]
    uncapped = make_loop(checkpoints, method, target_key, drafter_key, num_draft, cap=False)
    results, _ = run_requests(uncapped, RowPattern([[num_draft, 1, 0]]))
    want = [reference(target, budget, prompt=prompt) for prompt, budget in zip(PROMPTS, BUDGETS)]
    assert [r.tokens for r in results] == want
    for _, counts, _ in uncapped.ragged_target.calls:
        assert max(counts) <= num_draft + 1

    dense = make_loop(checkpoints, method, target_key, drafter_key, num_draft)
    dense.ragged_target = None
    assert not dense.verifies_ragged
    rule = RowPattern([[num_draft, 1, 0]])
    results, rows = run_requests(dense, rule)
    assert [r.tokens for r in results] == want
    assert set(rule.asked) == {"choose"} and all(r is None for r in rows)


def test_speculate_takes_one_draft_length_per_slot(checkpoints):
    """``speculate(budgets, [k_b])`` directly: row 0 drafts 3, row 1 none, row 2 is capped by its
    budget (2 tokens left: at most 1 draft); each row's packed block has its own length."""
    loop = make_loop(checkpoints, "pard", "target", "pard_same", 4)
    prompts = PROMPTS[:3]
    loop.open_slots(3)
    firsts = [loop.prefill_slot(slot, prompt) for slot, prompt in enumerate(prompts)]
    lengths = [len(p) for p in prompts]
    host, nodes = loop.speculate([10, 10, 2], [3, 0, 4])
    assert nodes == 0
    slots, counts, cache_len = loop.ragged_target.calls[-1]
    assert slots == [0, 1, 2] and counts == [4, 1, 2] and cache_len == lengths
    assert host[1][0] == 0 and host[2][0] <= 1
    for slot, prompt in enumerate(prompts):
        got = [firsts[slot]] + host[slot][1:host[slot][0] + 2]
        assert got == reference(checkpoints["target"], len(got), prompt=prompt)
    with pytest.raises(ValueError, match="3 slots"):
        loop.speculate([10, 10, 2], [3, 0])


def test_goodput_rule_chooses_per_request_with_a_ragged_curve(checkpoints):
    """``GoodputDraftLength(..., ragged_seconds=)`` through the scheduler: each request gets its
    own k from its own measured acceptance (different k in one step), tokens stay HF greedy's."""
    from specc.runtime.adaptive import GoodputDraftLength

    target = checkpoints["target"]
    loop = make_loop(checkpoints, "ar-draft", "target", "ar_perturbed", 4)
    rule = GoodputDraftLength(lambda rows, k: 1.0 + 0.2 * k, loop.num_draft,
                              ragged_seconds=lambda rows, tokens: 1.0 + 0.08 * tokens)
    chosen = []
    choose_rows = rule.choose_rows
    rule.choose_rows = lambda *args: chosen.append(choose_rows(*args)) or chosen[-1]
    results, _ = run_requests(loop, rule)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(target, budget, prompt=prompt)
    assert any(len(set(ks)) > 1 for ks in chosen)  # requests of one step drafted different numbers


@pytest.mark.parametrize("method,drafter_key", [("pard", "pard_same"), ("ar-draft", "ar_perturbed")])
def test_sampling_with_per_request_drafts_equals_each_request_alone_at_its_k(checkpoints, method, drafter_key):
    """At temperature > 0 each random number is a function of (seed, position), and drafts past a
    row's cap count as not drafted: a request verified ragged with its own k in a batch draws
    exactly the tokens it draws alone in a loop whose k is its own."""
    from specc.sampling import SamplingParams

    params = SamplingParams(temperature=0.8, top_k=20, seed=1)
    own_k = [3, 0, 1, 2]
    seeds = [5, 6, 7, 8]
    loop = make_loop(checkpoints, method, "target", drafter_key, 3)

    class OwnK:
        def choose_rows(self, alphas, caps, rows):
            return [own_k[rid] for rid in scheduler.running]

    scheduler = BatchScheduler(loop, 3, draft_length=OwnK(), sampling=params)
    rids = [scheduler.submit(p, m, seed=s) for p, m, s in zip(PROMPTS, BUDGETS, seeds)]
    while not scheduler.idle:
        scheduler.step()
    batched = [scheduler.take(rid).tokens for rid in rids]
    for prompt, budget, seed, k, got in zip(PROMPTS, BUDGETS, seeds, own_k, batched):
        alone = make_loop(checkpoints, method, "target", drafter_key, k) if k else make_loop(
            checkpoints, "ar", "target", None, 0)
        assert got == alone.generate_batch([prompt], budget, (), params, seeds=[seed])[0].tokens
    assert any(len({c for c in counts}) > 1 for _, counts, _ in loop.ragged_target.calls)
