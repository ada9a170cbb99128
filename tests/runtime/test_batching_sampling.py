"""Per-request sampling in a continuous batch: requests with different temperatures, top-k /
top-p / min-p, repetition penalties and seeds, greedy ones among them, decoded together with
requests joining and leaving, each give exactly the tokens they give alone (the counter-based
random numbers make this exact), for chain and tree steps, PARD, DFlash and AR drafters; greedy
requests give HF's greedy tokens."""

import pytest
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.policy import SamplingPolicy
from specc.sampling import SamplingParams

PROMPTS = [[5, 6, 7, 8], [7, 3], [9], [11, 4, 60, 2, 8, 31, 17], [40, 41, 6, 1, 23]]
BUDGETS = [10, 8, 12, 6, 9]
MIXED = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=11),
    None,  # greedy
    SamplingParams(temperature=1.2, top_k=20, seed=12),
    SamplingParams(temperature=0.7, min_p=0.05, repetition_penalty=1.3, seed=13),  # joins once others run
    SamplingParams(temperature=1.0, seed=14),
]

SCENARIOS = [  # (method, drafter key, drafts per step, tree budget)
    ("pard", "pard_same", 4, 0),
    ("pard", "pard_same", 4, 6),
    ("dflash", "dflash", 3, 0),
    ("dflash", "dflash", 3, 5),
    ("ar-draft", "ar_perturbed", 3, 0),
]


@pytest.fixture
def qwen3(checkpoints, family):
    if family != "qwen3":
        pytest.skip("one family is enough: the sampling is the policy's, not the model's")
    return checkpoints


def _loop(checkpoints, method, drafter_key, num_draft, tree):
    pair = resolve_pair(checkpoints["target"], checkpoints[drafter_key], method)
    eager = build_eager(pair, num_draft, max_len=32)
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, tree_budget=tree)


@pytest.mark.parametrize("method,drafter_key,num_draft,tree", SCENARIOS)
def test_mixed_batch_equals_each_request_alone(qwen3, method, drafter_key, num_draft, tree):
    loop = _loop(qwen3, method, drafter_key, num_draft, tree)
    # capacity 3 < 5 requests: requests join between steps into slots freed by finished ones
    batched = loop.generate_batch(PROMPTS, BUDGETS, (), sampling=MIXED, batch_size=3)
    assert loop.capacity == 3 and isinstance(loop.policy, SamplingPolicy)
    alone = [loop.generate(p, n, (), s) for p, n, s in zip(PROMPTS, BUDGETS, MIXED)]
    for prompt, budget, params, got, want in zip(PROMPTS, BUDGETS, MIXED, batched, alone):
        assert got.tokens == want.tokens, (prompt, params)
        assert len(got.tokens) == budget
        if tree:
            assert got.stats.tree_nodes
    assert batched[1].tokens == reference(qwen3["target"], BUDGETS[1], prompt=PROMPTS[1])  # the greedy row
    greedy = [reference(qwen3["target"], n, prompt=p) for p, n in zip(PROMPTS, BUDGETS)]
    assert sum(r.tokens != g for r, g in zip(batched, greedy)) >= 3  # the sampled rows did sample


def test_seeds_and_scheduler_default(qwen3):
    """``seeds`` override the params' seed per prompt; a request submitted without params takes
    the scheduler's default, one with its own keeps them (greedy included)."""
    loop = _loop(qwen3, "pard", "pard_same", 4, 0)
    hot = SamplingParams(temperature=1.1, top_p=0.95, seed=3)
    two = loop.generate_batch([PROMPTS[0]] * 2, 10, (), sampling=hot, seeds=[3, 4])
    assert two[0].tokens == loop.generate(PROMPTS[0], 10, (), hot).tokens
    seed4 = SamplingParams(temperature=1.1, top_p=0.95, seed=4)
    assert two[1].tokens == loop.generate(PROMPTS[0], 10, (), seed4).tokens
    assert two[0].tokens != two[1].tokens

    scheduler = BatchScheduler(loop, 2, sampling=hot)
    rids = [scheduler.submit(PROMPTS[0], 10, ()), scheduler.submit(PROMPTS[1], 8, (), sampling=SamplingParams()),
            scheduler.submit(PROMPTS[2], 9, (), seed=4)]
    while not scheduler.idle:
        scheduler.step()
    got = [scheduler.take(r).tokens for r in rids]
    assert got[0] == two[0].tokens
    assert got[1] == reference(qwen3["target"], 8, prompt=PROMPTS[1])
    assert got[2] == loop.generate(PROMPTS[2], 9, (), seed4).tokens


def test_bad_sampling_is_refused(qwen3):
    loop = _loop(qwen3, "pard", "pard_same", 4, 0)
    with pytest.raises(ValueError, match="sampling: 1 params given for 2 prompts"):
        loop.generate_batch(PROMPTS[:2], 4, (), sampling=[None])
    scheduler = BatchScheduler(loop, 2)
    with pytest.raises(TypeError, match="SamplingParams"):
        scheduler.submit(PROMPTS[0], 4, (), sampling={"temperature": 1.0})
