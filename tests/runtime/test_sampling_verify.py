"""Speculative sampling is lossless in distribution: the first generated tokens of thousands of
seeded runs (rows of one batch through the production device loop, one seed per row) follow
the target's exact sampling distribution (``distribution.exact_joint``: enumerated with HF's
model and processors) for chains and trees, several temperatures, top-k / top-p / min-p /
repetition penalty, and drafters that agree with the target fully, partly and not at all. The
same statistic rejects deliberately biased acceptance rules (the test has power). Plus:
temperature 0 is greedy, a seed reproduces a run, alone or inside a batch, and rows of one batch
with different params each follow their own distribution."""

from __future__ import annotations

import functools

import pytest
import torch
from distribution import ALPHA, exact_joint, g_test
from helpers import hf_model
from model_factory import make_dflash_checkpoint, make_hf_model, perturbed, save

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.sampling_verify import SamplingChainVerifier, SamplingTreeVerifier
from specc.sampling import SamplingParams, rng

VOCAB = 12
PROMPT = [5, 7, 2, 8, 9, 1, 4]
ROWS = 3000  # seeded runs per configuration
STEPS = 3  # generated tokens whose joint distribution is compared (12^3 outcomes)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 12-token target and drafters of different agreement (AR drafters and PARD drafters)."""
    target = make_hf_model("qwen3", seed=0, vocab_size=VOCAB, eos_token_id=VOCAB - 1, num_hidden_layers=2)
    partial = perturbed(target, 2.0, seed=1)
    other = make_hf_model("qwen3", seed=7, vocab_size=VOCAB, eos_token_id=VOCAB - 1, num_hidden_layers=2)
    with torch.no_grad():  # a peaked, unrelated distribution: its drafts are the target's rare tokens
        other.lm_head.weight.mul_(30.0)
    pard = {"pard_token": 3}
    dflash = make_dflash_checkpoint(target, tmp_path_factory, "sv-dflash", seed=3, layer_ids=(0, 1), scale=0.3)
    return {"dflash": dflash,"target": save(target, tmp_path_factory, "sv-target"),
            "ar_full": save(target, tmp_path_factory, "sv-ar-full"),
            "ar_partial": save(partial, tmp_path_factory, "sv-ar-partial"),
            "ar_none": save(other, tmp_path_factory, "sv-ar-none"),
            "pard_partial": save(target, tmp_path_factory, "sv-pard", pard),
            "pard_perturbed": save(partial, tmp_path_factory, "sv-pard-perturbed", pard),
            "pard_none": save(other, tmp_path_factory, "sv-pard-none", pard)}


@functools.lru_cache(maxsize=None)
def _eager(target, drafter, method):
    return build_eager(resolve_pair(target, drafter, method), 3 if drafter else None, max_len=len(PROMPT) + 16)


def _loop(tiny, drafter_key, tree=0, cap=True, verifier=None):
    method = "ar" if drafter_key is None else {"ar": "ar-draft", "pard": "pard", "dflash": "dflash"}[drafter_key.split("_")[0]]
    eager = _eager(tiny["target"], tiny.get(drafter_key), method)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len,
                                    cap_to_budget=cap, tree_budget=tree)
    return loop


def _run(loop, params, rows=ROWS, first_seed=0, chain_verifier=None, tree_verifier=None, steps=STEPS):
    import specc.runtime.policy as policy

    orig = policy.SamplingPolicy.__init__

    def init(self, *args, **kw):
        orig(self, *args, **kw)
        self.chain = chain_verifier or self.chain
        self.tree = tree_verifier or self.tree

    policy.SamplingPolicy.__init__ = init
    try:
        out = loop.generate_batch([PROMPT] * rows, steps, (), params, seeds=list(range(first_seed, first_seed + rows)))
    finally:
        policy.SamplingPolicy.__init__ = orig
    return out


@functools.lru_cache(maxsize=None)
def _exact(target, params, steps=STEPS):
    return exact_joint(hf_model(target), PROMPT, steps, params)


def _acceptance(loop, params) -> float:
    """Fraction of drafts accepted in the steps that drafted all ``num_draft`` (200 rows of 12
    tokens; not the 3-token runs, whose last step is clipped)."""
    loop.cap_to_budget = True
    results = loop.generate_batch([PROMPT] * 200, 12, (), params, seeds=list(range(10 ** 6, 10 ** 6 + 200)))
    steps = [n for r in results for n in r.stats.accepted_lengths[:-1]]
    return (sum(steps) - len(steps)) / (len(steps) * loop.num_draft)


CHAIN = [  # drafter, cap_to_budget (True: 1 draft + the bonus; False: 3 drafts), params, agreement
    ("ar_full", True, SamplingParams(temperature=1.0), "full"),
    ("ar_full", False, SamplingParams(temperature=0.7, top_k=6), "full"),
    ("ar_partial", True, SamplingParams(temperature=0.7), "partial"),
    ("ar_partial", False, SamplingParams(temperature=1.0), "partial"),
    ("ar_partial", False, SamplingParams(temperature=1.5, top_p=0.8), "partial"),
    ("ar_none", False, SamplingParams(temperature=1.0, top_k=5), "none"),
    ("ar_none", True, SamplingParams(temperature=1.5), "none"),
    ("pard_perturbed", False, SamplingParams(temperature=1.0, min_p=0.1, repetition_penalty=1.3), "partial"),
    (None, True, SamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.2), "none"),
]

TREE = [  # drafter, tree budget, params, agreement
    ("pard_partial", 6, SamplingParams(temperature=1.0), "partial"),
    ("pard_partial", 4, SamplingParams(temperature=0.7, top_p=0.9), "partial"),
    ("pard_perturbed", 6, SamplingParams(temperature=1.5, top_k=6), "partial"),
    ("pard_none", 5, SamplingParams(temperature=1.0, repetition_penalty=1.3, min_p=0.05), "none"),
]


def _check_agreement(loop, params, agreement):
    """The drafter agrees with the target as the case says (fully, partly, not at all)."""
    rate = _acceptance(loop, params)
    if agreement == "full":
        assert rate > 0.99, rate
    elif agreement == "partial":
        assert 0.15 < rate < 0.9, rate
    else:
        assert rate < 0.15, rate


@pytest.mark.parametrize("drafter,cap,params,agreement", CHAIN)
def test_chain_output_distribution_is_the_targets(tiny, drafter, cap, params, agreement):
    loop = _loop(tiny, drafter, cap=cap)
    results = _run(loop, params)
    p, what = g_test([r.tokens for r in results], _exact(tiny["target"], params))
    assert p > ALPHA, what
    if drafter is not None:
        _check_agreement(loop, params, agreement)


@pytest.mark.parametrize("drafter,budget,params,agreement", TREE)
def test_tree_output_distribution_is_the_targets(tiny, drafter, budget, params, agreement):
    loop = _loop(tiny, drafter, tree=budget, cap=False)
    assert loop.tree_budget == budget
    results = _run(loop, params)
    assert all(r.stats.tree_nodes for r in results)
    p, what = g_test([r.tokens for r in results], _exact(tiny["target"], params))
    assert p > ALPHA, what
    _check_agreement(loop, params, agreement)


@pytest.mark.parametrize("tree", [0, 5])
def test_rows_with_different_params_in_one_batch_follow_their_own(tiny, tree):
    """One batch whose rows alternate two sets of params (a partly agreeing PARD drafter, chain
    and tree steps): each set's rows follow that set's exact distribution."""
    a = SamplingParams(temperature=1.0, top_k=6)
    b = SamplingParams(temperature=0.7, min_p=0.05, repetition_penalty=1.3)
    loop = _loop(tiny, "pard_perturbed", tree=tree, cap=False)
    results = loop.generate_batch([PROMPT] * ROWS, STEPS, (), [a, b] * (ROWS // 2), seeds=list(range(ROWS)))
    assert _exact(tiny["target"], a).ne(_exact(tiny["target"], b)).any()
    for params, rows in ((a, results[0::2]), (b, results[1::2])):
        p, what = g_test([r.tokens for r in rows], _exact(tiny["target"], params))
        assert p > ALPHA, (params, what)


def _accept_if_drafter_likes_it_more(u, p_x, q_x):
    return q_x >= p_x


def _accept_with_target_probability(u, p_x, q_x):
    return u < p_x


@pytest.mark.parametrize("rule", [_accept_if_drafter_likes_it_more, _accept_with_target_probability])
def test_biased_chain_rules_fail_the_same_test(tiny, rule):
    params = SamplingParams(temperature=1.0)
    loop = _loop(tiny, "ar_partial", cap=False)
    results = _run(loop, params, chain_verifier=SamplingChainVerifier(rule))
    p, what = g_test([r.tokens for r in results], _exact(tiny["target"], params))
    assert p < ALPHA, f"a biased acceptance rule passed: {what}"


class _OneUniformPerStep(SamplingTreeVerifier):
    """A tree rule with an RNG bug: every depth of a step reuses the first depth's uniform."""

    def verify_tree(self, tree, p, seeds, start, max_drafts=None, depth=None):
        u = rng.uniform(seeds, start[:, None].expand_as(tree.depths), rng.TARGET)
        return self._walk.verify_tree_tokens(tree, rng.sample(p, u), max_drafts, depth)


def test_biased_tree_rule_fails_the_same_test(tiny):
    params = SamplingParams(temperature=1.0)
    results = _run(_loop(tiny, "pard_partial", tree=6, cap=False), params, tree_verifier=_OneUniformPerStep())
    p, what = g_test([r.tokens for r in results], _exact(tiny["target"], params))
    assert p < ALPHA, f"a biased tree rule passed: {what}"


def test_temperature_zero_is_greedy(tiny):
    loop = _loop(tiny, "ar_partial", cap=False)
    greedy = loop.generate(PROMPT, 6).tokens
    assert loop.generate(PROMPT, 6, (), SamplingParams(temperature=0.0, top_k=3, seed=5)).tokens == greedy
    assert loop.generate(PROMPT, 6, (), SamplingParams(temperature=None)).tokens == greedy
    tree = _loop(tiny, "pard_partial", tree=4, cap=False)
    assert tree.generate(PROMPT, 6, (), SamplingParams()).tokens == tree.generate(PROMPT, 6).tokens


@pytest.mark.parametrize("drafter,tree", [("ar_partial", 0), ("pard_perturbed", 5), (None, 0)])
def test_seed_reproduces_alone_and_in_a_batch(tiny, drafter, tree):
    loop = _loop(tiny, drafter, tree=tree, cap=False)
    params = SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.1, seed=11)
    alone = loop.generate(PROMPT, 8, (), params).tokens
    assert loop.generate(PROMPT, 8, (), params).tokens == alone
    rows = loop.generate_batch([PROMPT] * 5, 8, (), params, seeds=[3, 11, 4, 11, 9])
    assert rows[1].tokens == alone and rows[3].tokens == alone
    assert len({tuple(r.tokens) for r in rows}) > 2  # other seeds, other tokens


def test_seeds_must_match_rows(tiny):
    loop = _loop(tiny, "ar_partial")
    with pytest.raises(ValueError, match="seeds"):
        loop.generate_batch([PROMPT] * 2, 3, (), SamplingParams(temperature=1.0), seeds=[1])


@pytest.mark.parametrize("drafter,tree", [("ar_partial", 0), ("pard_perturbed", 0), ("pard_partial", 5)])
def test_eager_reference_loop_draws_the_same_tokens(tiny, drafter, tree):
    """The eager reference loop and the device loop run the same policy on the same models."""
    loop = _loop(tiny, drafter, tree=tree)
    eager = _eager(tiny["target"], tiny[drafter], {"ar": "ar-draft", "pard": "pard"}[drafter.split("_")[0]])
    eager.tree_budget = tree
    try:
        for seed in range(4):
            params = SamplingParams(temperature=1.0, top_k=8, repetition_penalty=1.2, seed=seed)
            assert eager.generate(PROMPT, 10, (), params).tokens == loop.generate(PROMPT, 10, (), params).tokens
    finally:
        eager.tree_budget = 0


def test_tree_covering_the_vocabulary_always_accepts(tiny):
    """Full agreement for a tree: one drafted position (the budget caps drafting at 1) and a node
    for every token, so the target's draw is always a child: every row accepts, and the output is
    still the target's distribution."""
    loop = _loop(tiny, "pard_partial", tree=VOCAB, cap=True)
    params = SamplingParams(temperature=1.0, top_k=8)
    results = _run(loop, params)
    assert {tuple(r.stats.accepted_lengths) for r in results} == {(2,)}  # 1 draft accepted + the bonus
    p, what = g_test([r.tokens for r in results], _exact(tiny["target"], params))
    assert p > ALPHA, what


def test_parallel_drafts_in_one_batch_equal_position_by_position(tiny):
    """The batched draw of a parallel drafter's drafts equals the per-position draw."""
    from specc.runtime.policy import SamplingPolicy

    loop = _loop(tiny, "pard_perturbed")
    drafter = loop.drafter
    seq = torch.tensor([PROMPT + [0] * 8] * 4)
    lengths = torch.full((4,), len(PROMPT) - 1)
    policy = SamplingPolicy(SamplingParams(temperature=1.2, top_p=0.9), torch.arange(4), seq[:, :7], VOCAB)
    drafter.setup(32, 4)
    drafter.reset_rows([len(PROMPT)] * 4, None)
    batched, q = policy.draft(drafter, seq, [len(PROMPT)] * 4, 3, lengths)
    drafter.reset_rows([len(PROMPT)] * 4, None)
    stepwise, q2 = drafter.propose_sampled_rows(seq, [len(PROMPT)] * 4, 3, _stepwise_pick(policy, lengths + 1))
    assert torch.equal(batched, stepwise) and torch.equal(q, q2)


def _stepwise_pick(policy, start):
    def pick(logits, j, rows=None):
        q = policy.probs(logits, None)
        return rng.sample(q, rng.uniform(policy.seeds, start + j, rng.DRAFT)), q
    return pick


@pytest.mark.parametrize("tree,params", [(0, SamplingParams(temperature=1.0)),
                                         (5, SamplingParams(temperature=0.7, top_p=0.9))])
def test_dflash_first_speculative_token_is_the_targets(tiny, tree, params):
    """DFlash rows of one batch must accept alike (ragged DFlash contexts are not batched yet), so
    this checks the first two tokens: the prefill's and the one the first verification decides
    (accepted draft or residual draw), over 3000 rows."""
    loop = _loop(tiny, "dflash", tree=tree, cap=False)
    results = _run(loop, params, steps=2)
    p, what = g_test([r.tokens for r in results], _exact(tiny["target"], params, 2))
    assert p > ALPHA, what


def test_a_capped_row_commits_what_the_same_row_with_k_equal_to_its_cap_commits():
    """A row capped at c < k drafts (its budget in a batch whose k is larger) must draw exactly
    the tokens it draws alone with k = c: drafts past the cap count as not drafted (bonus from p)."""
    from specc.runtime.sampling_verify import SamplingChainVerifier

    gen = torch.Generator().manual_seed(5)
    bsz, k, vocab = 64, 6, 12
    q = torch.rand(bsz, k, vocab, generator=gen).softmax(-1)
    p = torch.rand(bsz, k + 1, vocab, generator=gen).mul(3).softmax(-1)
    drafts = torch.multinomial(q.flatten(0, 1), 1, generator=gen).view(bsz, k)
    seeds, start = torch.arange(bsz), torch.full((bsz,), 40)
    verifier = SamplingChainVerifier()
    for cap in range(k):
        capped = verifier.verify(drafts, q, p, seeds, start, torch.full((bsz,), cap))
        alone = verifier.verify(drafts[:, :cap], q[:, :cap] if cap else None, p[:, :cap + 1], seeds, start)
        assert torch.equal(capped.accepted, alone.accepted)
        rows = torch.arange(bsz)
        assert torch.equal(capped.committed[rows, capped.accepted], alone.committed[rows, alone.accepted])
