"""Two-level verification in the device loop (``two_level_k1``): level 1 verifies the first k1
drafts of every row, level 2 (packed) the rest only for rows that accepted all of level 1.
Lossless: every request's tokens equal HF greedy alone (qwen3 and llama x AR, PARD, DFlash, k1
= 1 and 2, per-request draft lengths); at temperature > 0 the tokens equal one-level
verification's for the same seeds; fewer tokens are verified than in one level when drafts are
rejected early; a hybrid target (no ragged step) verifies in one level with the same tokens."""

import pytest
from lossless import reference
from ragged_helpers import PROMPTS, RowPattern, StepSpy, make_loop, run_requests

from specc.runtime.batching import BatchScheduler
from specc.sampling import SamplingParams

BUDGETS = [12, 5, 16, 8]

SCENARIOS = [  # (method, target key, drafter key, drafts per step)
    ("ar-draft", "target", "ar_perturbed", 3),
    ("pard", "target", "pard_same", 4),
    ("dflash", "target", "dflash", 3),  # drafts rejected at once: level 2 never runs
    ("dflash", "const_target", "const_dflash", 3),  # drafts accepted: every row goes on to level 2
]


def count_verified_tokens(loop):
    """Wrap the loop's dense and packed target calls; returns a list that collects token counts."""
    seen = []
    dense = loop._target_rows

    def counted(ids):
        seen.append(ids.numel())
        return dense(ids)

    loop._target_rows = counted
    spy = loop.ragged_target
    if isinstance(spy, StepSpy):
        spy.calls.clear()
    return seen


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,k1", [
    (*SCENARIOS[0], 1), (*SCENARIOS[0], 2), (*SCENARIOS[1], 1), (*SCENARIOS[1], 2), (*SCENARIOS[2], 1),
    (*SCENARIOS[3], 1), (*SCENARIOS[3], 2)])
def test_two_level_equals_each_prompt_alone(checkpoints, method, target_key, drafter_key, num_draft, k1):
    target = checkpoints[target_key]
    loop = make_loop(checkpoints, method, target_key, drafter_key, num_draft)
    loop.two_level_k1 = k1
    results, _ = run_requests(loop, RowPattern([[num_draft, 0, k1 + 1], [num_draft, num_draft, 1]]),
                              budgets=BUDGETS)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(target, budget, prompt=prompt)
    level2 = sum(r.stats.level2_steps for r in results)
    if drafter_key == "dflash":
        assert level2 == 0
    else:
        assert level2 > 0
        assert any(r.stats.to_json().get("level2_steps") for r in results)
        # level 2 packs the rows that go on, written right after their k1 + 1 level-1 entries
        assert any(min(counts) >= 1 and all(c <= num_draft - k1 for c in counts)
                   for _, counts, _ in loop.ragged_target.calls)


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,k1", [(*SCENARIOS[0], 1), (*SCENARIOS[1], 2)])
def test_two_level_verifies_fewer_tokens_for_the_same_steps(checkpoints, method, target_key, drafter_key, num_draft,
                                                            k1):
    """Greedy steps do not depend on how verification is split, so one- and two-level runs make
    the same steps; the two-level run verifies fewer tokens (rows rejected in level 1 skip the
    rest) and says how many of its steps went to level 2. (PARD with the target's own weights
    always gets its first draft right, so its level 1 checks two.)"""
    want, verified, level2 = [], [], []
    for k1 in (None, k1):
        loop = make_loop(checkpoints, method, target_key, drafter_key, num_draft)
        loop.two_level_k1 = k1
        dense = count_verified_tokens(loop)
        results, _ = run_requests(loop, RowPattern([[num_draft]]), budgets=BUDGETS)
        want.append([(r.tokens, r.stats.accepted_lengths) for r in results])
        verified.append(sum(dense) + sum(sum(c) for _, c, _ in loop.ragged_target.calls))
        level2.append(sum(r.stats.level2_steps for r in results))
    assert want[0] == want[1]
    assert verified[1] < verified[0]
    assert level2[0] == 0 and level2[1] > 0


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,k1", [
    (*SCENARIOS[0], 2), (*SCENARIOS[1], 1), (*SCENARIOS[3], 1)])
def test_two_level_sampling_gives_the_one_level_tokens(checkpoints, method, target_key, drafter_key, num_draft, k1):
    """At temperature > 0 the verifier sees the same logits and the same per-position random
    numbers in one and two levels: the same tokens for every seed (repetition penalty included).
    (PARD's later sampled drafts are rarely accepted by these random models: k1 = 1 for it.)"""
    params = SamplingParams(temperature=0.6, top_k=8, repetition_penalty=1.1, seed=3)
    seeds = [3, 8, 21, 5]
    runs = []
    for two_level in (None, k1):
        loop = make_loop(checkpoints, method, target_key, drafter_key, num_draft)
        loop.two_level_k1 = two_level
        results = loop.generate_batch(PROMPTS, BUDGETS, (), params, seeds=seeds, batch_size=3)
        runs.append(results)
    assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]]
    assert len({tuple(r.tokens) for r in runs[0]}) == len(PROMPTS)
    assert sum(r.stats.level2_steps for r in runs[1]) > 0


def test_hybrid_target_verifies_in_one_level(tmp_path_factory):
    """A hybrid (GDN + attention) target has no ragged step: two-level verification and per-request
    draft lengths fall back to one dense level, with plain AR greedy's tokens."""
    from hybrid_factory import ScriptedDrafter, load_hybrid

    from specc.runtime.batching import BatchScheduler
    from specc.runtime.device_loop import DeviceSpeculativeDecoder
    from specc.runtime.eager import EagerSpeculativeDecoder

    _, _, target = load_hybrid(tmp_path_factory, seed=0, name="hy-two-level")
    prompts, budgets = [[5, 17, 33, 2, 61, 40, 8], [9, 3, 44]], [10, 9]
    plain = [EagerSpeculativeDecoder(target, None, 0, 40).generate(p, m).tokens for p, m in zip(prompts, budgets)]
    drafter = ScriptedDrafter([p + t for p, t in zip(prompts, plain)], [(4, 9), (4, 1), (4, 0)])
    loop = DeviceSpeculativeDecoder(target, drafter, 4, 40, two_level_k1=1)
    assert loop.ragged_target is None and not loop.verifies_ragged
    rule = RowPattern([[4, 1]])
    scheduler = BatchScheduler(loop, 2, draft_length=rule)
    rids = [scheduler.submit(p, m) for p, m in zip(prompts, budgets)]
    while not scheduler.idle:
        scheduler.step()
        assert loop.last_level2_rows == []
    results = [scheduler.take(rid) for rid in rids]
    assert [r.tokens for r in results] == plain
    assert set(rule.asked) == {"choose"} and all(r.stats.level2_steps == 0 for r in results)
    assert {1, 2, 5} <= {n for r in results for n in r.stats.accepted_lengths}


def test_two_level_at_batch_one(checkpoints):
    """One request alone: level 1 dense, level 2 a packed block of one row; HF greedy's tokens."""
    loop = make_loop(checkpoints, "ar-draft", "target", "ar_perturbed", 4)
    loop.two_level_k1 = 2
    result = loop.generate(PROMPTS[2], 14)
    assert result.tokens == reference(checkpoints["target"], 14, prompt=PROMPTS[2])
    assert result.stats.level2_steps > 0 and loop.ragged_target.calls
    assert all(slots == [0] and cache_len[0] >= len(PROMPTS[2]) + 3 for slots, _, cache_len in loop.ragged_target.calls)


def test_two_level_k1_must_be_a_positive_integer(checkpoints):
    loop = make_loop(checkpoints, "pard", "target", "pard_same", 4)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="two_level_k1"):
            loop.two_level_k1 = bad
    loop.two_level_k1 = None
    assert loop.two_level_k1 is None


def test_level_two_asks_the_verifier_for_the_rows_that_went_on(checkpoints):
    """Greedy: level 1's decision stands for rows that stopped there; the verifier sees only the
    remaining drafts of the rows that went on, with their block position (start = k1) and their
    indices (what a verifier drawing per row and position, ``ReplayVerifier``, needs)."""
    from specc.runtime.verifiers import ChainVerifier

    class Recording(ChainVerifier):
        calls = []

        def verify(self, drafts, target_logits, max_drafts=None, *, start=0, rows=None):
            self.calls.append((drafts.shape[1], start, None if rows is None else rows.tolist()))
            return super().verify(drafts, target_logits, max_drafts)

    target = checkpoints["target"]
    loop = make_loop(checkpoints, "ar-draft", "target", "ar_perturbed", 4)
    loop.verifier = Recording()
    loop.two_level_k1 = 1
    level2 = []
    scheduler = BatchScheduler(loop, 3)
    rids = [scheduler.submit(p, m) for p, m in zip(PROMPTS, BUDGETS)]
    while not scheduler.idle:
        scheduler.step()
        level2.append(list(loop.last_level2_rows))
    for rid, prompt, budget in zip(rids, PROMPTS, BUDGETS):
        assert scheduler.take(rid).tokens == reference(target, budget, prompt=prompt)
    second = [(width, rows) for width, start, rows in Recording.calls if start == 1]
    assert second and [rows for _, rows in second] == [rows for rows in level2 if rows]
    assert all(1 <= width <= 3 for width, _ in second)  # k - k1 remaining drafts (k shrinks near the budgets)
    assert all(start in (0, 1) for _, start, _ in Recording.calls)


def test_batch_invariant_mode_verifies_dense_in_one_level(checkpoints):
    """With batch-invariant kernels a request alone verifies dense, so a batch must too (the
    ragged kernel tiles otherwise): no packed call, one level, per-row k as caps, same tokens."""
    from specc.codegen.kernels.batch_invariant import batch_invariant

    method, target_key, drafter_key, num_draft = SCENARIOS[1]
    loop = make_loop(checkpoints, method, target_key, drafter_key, num_draft)
    loop.two_level_k1 = 1
    assert loop.verifies_ragged
    with batch_invariant():
        assert not loop.verifies_ragged
        loop.ragged_target.calls.clear()
        results, _ = run_requests(loop, RowPattern([[num_draft, 0, 2], [num_draft, num_draft, 1]]), budgets=BUDGETS)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(checkpoints[target_key], budget, prompt=prompt)
    assert not loop.ragged_target.calls
    assert sum(r.stats.level2_steps for r in results) == 0
