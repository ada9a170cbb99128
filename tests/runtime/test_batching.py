"""Continuous batching (specc.runtime.batching): prompts of any lengths, per-request budgets and
EOS, requests joining and leaving between steps with slots reused. Every request's tokens equal
HF greedy on that prompt alone, for every target family x drafter."""

import pytest
from helpers import PROMPT
from lossless import eos_inside_accepted_block, reference

from specc.pairing import resolve_pair
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager

PROMPTS = [PROMPT, [7, 3], [9], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [40, 41, 6, 1, 23]]
BUDGETS = [12, 9, 14, 5, 10]

SCENARIOS = [  # (method, target key, drafter key, drafts per step)
    ("ar", "target", None, 0),
    ("ar-draft", "target", "ar_perturbed", 3),
    ("pard", "target", "pard_same", 4),
    ("pard", "const_target", "const_pard", 4),
    ("dflash", "target", "dflash", 3),
    ("dflash", "const_target", "const_dflash", 3),
]


def _loop(checkpoints, method, target_key, drafter_key, num_draft, cap=True, tree=0):
    pair = resolve_pair(checkpoints[target_key], checkpoints.get(drafter_key), method)
    eager = build_eager(pair, num_draft or None, max_len=32)
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len,
                                    cap_to_budget=cap, tree_budget=tree)


class _RaggedProbe:
    """Wraps a drafter and records whether some step drafted live rows that differ in what they
    feed (a causal drafter's lag, DFlash's new context count), and whether some row drafted alone."""

    def __init__(self, drafter):
        self.drafter, self.ragged, self.calls = drafter, False, 0

    def __getattr__(self, name):
        return getattr(self.__dict__["drafter"], name)

    def _probe(self, n, active):
        d = self.drafter
        live = [b for b in range(len(n)) if active is None or active[b]]
        pending = d.context_lens if hasattr(d, "context_lens") else [nb - lb for nb, lb in zip(n, d.lengths)]
        self.ragged |= len({pending[b] for b in live}) > 1
        self.calls += 1

    def propose_rows(self, seq, n, k, active=None):
        self._probe(n, active)
        return self.drafter.propose_rows(seq, n, k, active)

    def propose_logits_rows(self, seq, n, k, active=None):
        self._probe(n, active)
        return self.drafter.propose_logits_rows(seq, n, k, active)


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", SCENARIOS)
@pytest.mark.parametrize("capacity", [5, 2])
def test_batch_of_ragged_prompts_equals_each_alone(checkpoints, method, target_key, drafter_key, num_draft, capacity):
    """Different prompt lengths (down to one token) and budgets; capacity 2 < 5 prompts makes
    requests join between steps into slots freed by finished ones."""
    target = checkpoints[target_key]
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft)
    if loop.drafter is not None:
        loop.drafter = probe = _RaggedProbe(loop.drafter)
    results = loop.generate_batch(PROMPTS, BUDGETS, batch_size=capacity)
    assert loop.capacity == capacity and loop.batch <= capacity  # batch buckets: the width at the end
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(target, budget, prompt=prompt)
        assert result.finished_by == "length" and sum(result.stats.accepted_lengths) == budget - 1
    if loop.drafter is not None:  # rows did feed the drafter different amounts in one step, except where they
        # can stay alike: a joining row's prompt is read at its prefill, so it starts one token (DFlash: one
        # context entry) behind, and rows that joined together, or that never accept a draft, feed alike
        alike = capacity >= len(PROMPTS) or all(set(r.stats.accepted_lengths) <= {1} for r in results)
        assert probe.ragged or alike
    alone = loop.generate(PROMPTS[3], BUDGETS[3])  # the same loop, back to one row
    assert loop.batch == 1 and alone.tokens == results[3].tokens


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", SCENARIOS)
def test_per_request_eos_inside_an_accepted_block(checkpoints, method, target_key, drafter_key, num_draft):
    """Each request has its own EOS (one of them inside a multi-token step) and budget; they
    finish at different steps and the others go on."""
    target = checkpoints[target_key]
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft)
    solo = loop.generate(PROMPTS[0], 14)
    eos0 = eos_inside_accepted_block(solo) or solo.tokens[4]
    eos2 = reference(target, 14, prompt=PROMPTS[2])[2]
    scheduler = BatchScheduler(loop, 3)
    rids = [scheduler.submit(PROMPTS[0], 14, (eos0,)), scheduler.submit(PROMPTS[1], 11, ()),
            scheduler.submit(PROMPTS[2], 14, eos2), scheduler.submit(PROMPTS[4], 6, (eos0, eos2))]
    finished_at = {}
    streamed = {rid: [] for rid in rids}
    steps = 0
    while not scheduler.idle:
        steps += 1
        for event in scheduler.step():
            streamed[event.rid] += event.tokens
            if event.finished:
                finished_at[event.rid] = steps
    results = [scheduler.take(rid) for rid in rids]
    wants = [reference(target, 14, eos=eos0, prompt=PROMPTS[0]), reference(target, 11, prompt=PROMPTS[1]),
             reference(target, 14, eos=eos2, prompt=PROMPTS[2]), reference(target, 6, eos=[eos0, eos2], prompt=PROMPTS[4])]
    for rid, result, want in zip(rids, results, wants):
        assert result.tokens == want == streamed[rid]
    assert results[0].finished_by == "eos" and results[2].finished_by == "eos"
    assert len(set(finished_at.values())) > 1  # they left at different steps


def test_slots_are_reused_and_cancel_frees_one(checkpoints):
    target = checkpoints["target"]
    loop = _loop(checkpoints, "pard", "target", "pard_same", 4)
    scheduler = BatchScheduler(loop, 2)
    a = scheduler.submit(PROMPTS[0], 20)
    b = scheduler.submit(PROMPTS[1], 3)
    c = scheduler.submit(PROMPTS[3], 8)
    first = scheduler.step()
    assert [e.rid for e in first] == [a, b] and scheduler.queued == [c]  # c waits for a free slot
    while c not in scheduler.running:
        scheduler.step()
    assert scheduler.running == [a, c]  # c took b's slot (slot 1)
    assert scheduler.cancel(a) and not scheduler.cancel(a)
    assert scheduler.running == [c]
    d = scheduler.submit(PROMPTS[4], 7)
    while not scheduler.idle:
        scheduler.step()
    partial = scheduler.take(a)
    assert partial.finished_by == "cancelled" and partial.tokens == reference(target, 20, prompt=PROMPTS[0])[:len(partial.tokens)]
    assert scheduler.take(b).tokens == reference(target, 3, prompt=PROMPTS[1])
    assert scheduler.take(c).tokens == reference(target, 8, prompt=PROMPTS[3])
    assert scheduler.take(d).tokens == reference(target, 7, prompt=PROMPTS[4])
    with pytest.raises(KeyError):
        scheduler.take(d)


def test_uncapped_drafting_and_zero_budget(checkpoints):
    """cap_to_budget off (the CUDA setting: one verify shape, the surplus clipped) and a request
    with max_new_tokens 0 (finishes at admission with no tokens, no prefill)."""
    target = checkpoints["const_target"]
    loop = _loop(checkpoints, "dflash", "const_target", "const_dflash", 3, cap=False)
    results = loop.generate_batch(PROMPTS[:4], [7, 0, 5, 9], batch_size=3)
    assert results[1].tokens == [] and results[1].stats.target_forwards == 0
    for i in (0, 2, 3):
        assert results[i].tokens == reference(target, [7, 0, 5, 9][i], prompt=PROMPTS[i])


@pytest.mark.parametrize("method,drafter_key,num_draft,budget", [("pard", "pard_same", 4, 8), ("dflash", "const_dflash", 3, 12)])
def test_tree_steps_in_a_ragged_batch(checkpoints, method, drafter_key, num_draft, budget):
    target_key = "const_target" if method == "dflash" else "target"
    target = checkpoints[target_key]
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft, tree=budget)
    assert loop.tree_budget == budget
    results = loop.generate_batch(PROMPTS, BUDGETS, batch_size=3)
    for prompt, want_len, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(target, want_len, prompt=prompt)
        assert result.stats.tree_nodes


def test_bad_requests_are_refused(checkpoints):
    loop = _loop(checkpoints, "ar", "target", None, 0)
    scheduler = BatchScheduler(loop, 2)
    with pytest.raises(ValueError, match="empty prompt"):
        scheduler.submit([], 4)
    with pytest.raises(ValueError, match="exceeds max_len"):
        scheduler.submit(PROMPT, 40)
    with pytest.raises(ValueError, match="max_new_tokens"):
        scheduler.submit(PROMPT, -1)
    with pytest.raises(ValueError, match="capacity"):
        BatchScheduler(loop, 0)
    with pytest.raises(TypeError, match="not text"):
        scheduler.submit("def f():", 4)
    with pytest.raises(TypeError, match="token ids are integers, got 1.5"):
        scheduler.submit([3, 1.5], 4)
    with pytest.raises(ValueError, match="token ids are >= 0, got -2"):
        scheduler.submit([3, -2], 4)
    loop.vocab_size = 50  # an engine sets it from the artifact's model
    with pytest.raises(ValueError, match=r"token id 50 is outside the vocabulary \(0..49\)"):
        scheduler.submit([3, 50], 4)
    assert scheduler.idle and scheduler.step() == []


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", [SCENARIOS[2], SCENARIOS[5], SCENARIOS[1]])
def test_random_joins_leaves_and_cancels(checkpoints, method, target_key, drafter_key, num_draft):
    """A seeded random schedule: requests of random lengths and budgets arrive between steps,
    some are cancelled while queued or running; every finished request equals HF greedy alone,
    every cancelled one is a prefix of it."""
    import random

    rng = random.Random(7)
    target = checkpoints[target_key]
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft)
    scheduler = BatchScheduler(loop, 3)
    asked, cancelled = {}, set()
    for _ in range(40):
        if len(asked) < 9 and rng.random() < 0.5:
            prompt = [rng.randrange(4, 90) for _ in range(rng.randint(1, 12))]
            budget = rng.randint(1, 14)
            asked[scheduler.submit(prompt, budget)] = (prompt, budget)
        live = scheduler.running + scheduler.queued
        if live and rng.random() < 0.25:
            rid = rng.choice(live)
            assert scheduler.cancel(rid)
            cancelled.add(rid)
        scheduler.step()
    while not scheduler.idle:
        scheduler.step()
    assert len(asked) >= 6 and cancelled and len(asked) - len(cancelled) >= 4
    for rid, (prompt, budget) in asked.items():
        got, want = scheduler.take(rid), reference(target, budget, prompt=prompt)
        if rid in cancelled:
            assert got.finished_by == "cancelled" and got.tokens == want[:len(got.tokens)]
        else:
            assert got.tokens == want


class _RowScripted:
    """A drafter that finds each row's reference continuation by its prompt (rows change owners
    as requests come and go) and makes planned mistakes: plan[i] = (drafts, wrong index)."""

    name, needs_target_hidden, supports_tree, forwards = "row-scripted", False, True, 0

    def __init__(self, references, plan, vocab=96):
        self.references, self.plan, self.vocab, self.step = references, plan, vocab, 0
        self.device = "cpu"

    def setup(self, max_len, batch=1): ...
    def open_rows(self, rows): ...
    def reset_slot(self, slot, prompt_len, context): ...
    def release_slot(self, slot): ...
    def accepted_rows(self, n, accepted, k, context): ...

    def _row(self, seq, nb, k, b):
        ref = next((r for p, r in self.references if seq[b, :len(p)].tolist() == p), [])
        count, wrong = self.plan[self.step % len(self.plan)]
        self.step += 1
        right = [ref[nb + j] if nb + j < len(ref) else 0 for j in range(k)]
        drafts = list(right)
        if wrong < min(count, k):
            drafts[wrong] = (drafts[wrong] + 1) % self.vocab
        return drafts, right

    def propose_logits_rows(self, seq, n, k, active=None):
        import torch

        self.forwards += 1
        logits = torch.zeros(len(n), k, self.vocab)
        for b, nb in enumerate(n):
            drafts, right = self._row(seq, nb, k, b)
            for j in range(k):
                logits[b, j, right[j]] = 4.0
                logits[b, j, drafts[j]] = 5.0
        return logits

    def propose_rows(self, seq, n, k, active=None):
        return self.propose_logits_rows(seq, n, k, active).argmax(-1)


@pytest.mark.parametrize("tree", [0, 6])
def test_hybrid_target_ragged_continuous_batch(tmp_path_factory, tree):
    """A hybrid (GDN + attention) target: prompts of different lengths join slots freed by
    finished requests (a new request's recurrent state starts from zero in its slot), with
    planned draft mistakes per row (in tree mode, accepted paths off the top-1 chain). Every
    request equals plain AR greedy alone."""
    from hybrid_factory import load_hybrid

    from specc.runtime.eager import EagerSpeculativeDecoder

    _, _, target = load_hybrid(tmp_path_factory, seed=0, name=f"hy-batch-{tree}")
    prompts = [[5, 17, 33, 2, 61, 40, 8, 71, 12], [9, 3], [44, 12, 7, 70, 1], [30]]
    budgets = [14, 9, 12, 7]
    plain = [EagerSpeculativeDecoder(target, None, 0, 48).generate(p, m).tokens for p, m in zip(prompts, budgets)]
    drafter = _RowScripted([(p, p + t) for p, t in zip(prompts, plain)], [(4, 9), (4, 1), (4, 0), (2, 1)])
    loop = DeviceSpeculativeDecoder(target, drafter, 4, 48, tree_budget=tree)
    results = loop.generate_batch(prompts, budgets, batch_size=2)
    assert [r.tokens for r in results] == plain
    lengths = {n for r in results for n in r.stats.accepted_lengths}
    # chains: zero, partial and full steps; trees: the right token is the second candidate, so a
    # wrong draft still lets the path go on (off the top-1 chain)
    assert ({1, 2, 5} <= lengths) if tree == 0 else (5 in lengths and all(r.stats.tree_nodes for r in results))
