"""ReplayVerifier: accepted counts drawn from a stated acceptance model, drafts committed up to it."""

import pytest
import torch
from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier
from specc.search.acceptance import AcceptanceModel


def _logits(tokens, vocab=32):
    out = torch.zeros(*tokens.shape, vocab)
    out.scatter_(-1, tokens[..., None], 1.0)
    return out


def test_commits_drafts_up_to_the_drawn_count_then_the_targets_token():
    drafts = torch.tensor([[4, 5, 6, 7]] * 64)
    target = torch.tensor([[20, 21, 22, 23, 24]] * 64)  # disagrees with every draft
    accepted, committed = ReplayVerifier([0.7], seed=3).verify(drafts, _logits(target))
    assert accepted.min() >= 0 and accepted.max() <= 4 and len(set(accepted.tolist())) > 1
    for a, row in zip(accepted.tolist(), committed.tolist()):
        assert row[:a] == [4, 5, 6, 7][:a] and row[a] == 20 + a


def test_extremes_caps_and_no_drafts():
    drafts, target = torch.tensor([[1, 2, 3]] * 3), torch.tensor([[9, 9, 9, 9]] * 3)
    assert ReplayVerifier([1.0]).verify(drafts, _logits(target))[0].tolist() == [3, 3, 3]
    assert ReplayVerifier([0.0]).verify(drafts, _logits(target))[0].tolist() == [0, 0, 0]
    assert ReplayVerifier([1.0]).verify(drafts, _logits(target), torch.tensor([1, 0, 3]))[0].tolist() == [1, 0, 3]
    a, c = ReplayVerifier([1.0]).verify(drafts[:, :0], _logits(target[:, :1]))
    assert a.tolist() == [0, 0, 0] and c.tolist() == [[9], [9], [9]]


def test_draws_follow_the_model_and_are_seeded():
    model = AcceptanceModel.from_tau(6.55, 15)
    v = ReplayVerifier(model.alphas, seed=0)
    accepted = torch.cat([v.draw(1000, 15, "cpu") for _ in range(10)]).float()
    assert abs(float(accepted.mean()) + 1 - model.expected_tokens(15)) < 0.1
    per_position = ReplayVerifier([0.9, 0.5, 0.0], seed=1).draw(20000, 3, "cpu")
    assert per_position.max() <= 2 and abs(float((per_position >= 1).float().mean()) - 0.9) < 0.02
    assert abs(float((per_position >= 2).float().mean()) - 0.45) < 0.02
    a = ReplayVerifier([0.6], seed=5).draw(50, 7, "cpu")
    b = ReplayVerifier([0.6], seed=5)
    b.draw(3, 7, "cpu")
    b.reset()
    assert torch.equal(a, b.draw(50, 7, "cpu"))


def test_replay_in_the_device_loop(checkpoints):
    """The drafter and target run every step; only the decision is replayed."""
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["dflash"], "dflash"), 3, max_len=len(PROMPT) + 40)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, 3, eager.max_len, verifier=ReplayVerifier([1.0]))
    res = loop.generate(PROMPT, 21, ())
    assert len(res.tokens) == 21 and res.stats.accepted_lengths == [4] * 5
    loop.verifier = ReplayVerifier([0.0])
    res = loop.generate(PROMPT, 6, ())
    assert res.stats.accepted_lengths == [1] * 5 and res.stats.draft_forwards >= 4


def test_two_levels_replay_the_one_level_decision():
    """Level 1 (the first k1 drafts of every row, a new step) then level 2 (the rows that accepted
    all k1, start=k1, their row indices) accept exactly what one call with all k drafts draws."""
    alphas, k, k1, rows = [0.9, 0.8, 0.7, 0.95, 0.6, 0.85], 6, 2, 400
    drafts = torch.arange(rows * k).reshape(rows, k) % 30
    target = (drafts + 1) % 30  # disagrees everywhere: only the draws decide
    target = torch.cat([target, target[:, :1]], 1)
    caps = torch.randint(0, k + 1, (rows,), generator=torch.Generator().manual_seed(0))
    one, two = ReplayVerifier(alphas, seed=7), ReplayVerifier(alphas, seed=7)
    for _ in range(3):  # several steps: both stay in step
        full, _ = one.verify(drafts, _logits(target), caps)
        first, _ = two.verify(drafts[:, :k1], _logits(target[:, :k1 + 1]), torch.clamp(caps, max=k1))
        assert torch.equal(first, torch.clamp(full, max=k1))  # level 1's decision is the prefix of the full one
        go = torch.nonzero((first == k1) & (caps > k1)).flatten()
        second, committed = two.verify(drafts[go, k1:], _logits(target[go, k1:]), caps[go] - k1, start=k1, rows=go)
        accepted = first.clone()
        accepted[go] += second
        assert torch.equal(accepted, full)
        assert committed.shape == (len(go), k - k1 + 1)
    # the two-level draws follow the model: P(accept >= 3 | cap k) = alpha_1 alpha_2 alpha_3
    v = ReplayVerifier(alphas, seed=1)
    n = 20000
    first = v.draw(n, k1, "cpu")
    go = torch.nonzero(first == k1).flatten()
    second = v.draw(len(go), k - k1, "cpu", start=k1, row_ids=go)
    frac = float((second >= 1).sum()) / n
    assert abs(frac - 0.9 * 0.8 * 0.7) < 0.015
