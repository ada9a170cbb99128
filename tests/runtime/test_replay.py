"""ReplayVerifier: accepted counts drawn from a stated acceptance model, drafts committed up to it."""

import pytest
import torch
from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier
from specc.sampling.rng import ACCEPT, uniform
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


def test_with_lengths_a_verify_is_a_function_of_its_inputs_so_two_levels_compose():
    """The device loop's two-level verification runs the verifier on level 1 (the first k1
    drafts) and again on both levels: with the rows' lengths the draws depend on the absolute
    positions only, so the second call repeats level 1's decision as its prefix and equals what a
    one-level run draws."""
    alphas, k, k1, rows = [0.9, 0.8, 0.7, 0.95, 0.6, 0.85], 6, 2, 400
    drafts = torch.arange(rows * k).reshape(rows, k) % 30
    target = (drafts + 1) % 30  # disagrees everywhere: only the draws decide
    target = torch.cat([target, target[:, :1]], 1)
    caps = torch.randint(0, k + 1, (rows,), generator=torch.Generator().manual_seed(0))
    lengths = torch.randint(5, 50, (rows,), generator=torch.Generator().manual_seed(1))
    one = ReplayVerifier(alphas, seed=7, lengths=lambda: lengths)
    two = ReplayVerifier(alphas, seed=7, lengths=lambda: lengths)
    for _ in range(3):  # several steps, the lengths advancing by what each row committed
        full, _ = one.verify(drafts, _logits(target), caps)
        first, _ = two.verify(drafts[:, :k1], _logits(target[:, :k1 + 1]), torch.clamp(caps, max=k1))
        assert torch.equal(first, torch.clamp(full, max=k1))  # level 1's decision is the prefix of the full one
        again, _ = two.verify(drafts, _logits(target), caps)
        assert torch.equal(again, full)
        lengths = lengths + full + 1
    with pytest.raises(ValueError, match="rows but lengths"):
        one.verify(drafts[:3], _logits(target[:3]))


@pytest.mark.parametrize("by_position", [False, True])
def test_level_two_with_start_and_rows_continues_the_step(by_position):
    """The loop's greedy two-level protocol: level 1 over the first k1 drafts (a new step), level 2
    over the rows that accepted all k1 with start=k1 and their indices: the one-level decision."""
    alphas, k, k1, rows = [0.9, 0.8, 0.7, 0.95, 0.6, 0.85], 6, 2, 400
    drafts = torch.arange(rows * k).reshape(rows, k) % 30
    target = torch.cat([(drafts + 1) % 30, drafts[:, :1]], 1)
    caps = torch.randint(0, k + 1, (rows,), generator=torch.Generator().manual_seed(0))
    lengths = torch.randint(5, 50, (rows,), generator=torch.Generator().manual_seed(1))
    source = (lambda: lengths) if by_position else None
    one, two = ReplayVerifier(alphas, seed=7, lengths=source), ReplayVerifier(alphas, seed=7, lengths=source)
    for _ in range(3):
        full, _ = one.verify(drafts, _logits(target), caps)
        first, _ = two.verify(drafts[:, :k1], _logits(target[:, :k1 + 1]), torch.clamp(caps, max=k1))
        assert torch.equal(first, torch.clamp(full, max=k1))
        go = torch.nonzero((first == k1) & (caps > k1)).flatten()
        second, committed = two.verify(drafts[go, k1:], _logits(target[go, k1:]), caps[go] - k1, start=k1, rows=go)
        accepted = first.clone()
        accepted[go] += second
        assert torch.equal(accepted, full) and committed.shape == (len(go), k - k1 + 1)
        lengths = lengths + full + 1


def test_replay_by_position_follows_the_model_over_steps():
    """A position is tested up to its first rejection and the next step starts after it, so the
    draws by position stay unbiased step after step."""
    alphas = [0.9, 0.7, 0.8, 0.5]
    model = AcceptanceModel(alphas)
    lengths = torch.zeros(2000, dtype=torch.long)
    v = ReplayVerifier(alphas, seed=3, lengths=lambda: lengths)
    counts = []
    for _ in range(10):
        accepted = v.draw(2000, 4, "cpu")
        counts.append(accepted)
        lengths = lengths + accepted + 1
    accepted = torch.cat(counts).float()
    assert abs(float(accepted.mean()) + 1 - model.expected_tokens(4)) < 0.03
    assert abs(float((accepted >= 2).float().mean()) - 0.63) < 0.015


@pytest.mark.parametrize("family", ["qwen3"], indirect=True)
def test_replay_composes_with_the_loops_two_level_verification(checkpoints):
    """Through the device loop: a two-level run replays exactly the one-level run's acceptance."""
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["pard_same"], "pard"), 4, max_len=48)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, 4, eager.max_len)
    if not hasattr(loop, "two_level_k1") or not getattr(loop, "verifies_ragged", False):
        pytest.skip("this runtime has no two-level verification")
    loop.verifier = ReplayVerifier([0.9, 0.6, 0.8, 0.7], seed=2, lengths=lambda: loop.state.lengths)
    prompts, budgets = [PROMPT, PROMPT[:5], PROMPT[2:9]], [14, 9, 17]
    one = loop.generate_batch(prompts, budgets, (), batch_size=3)
    loop.two_level_k1 = 2
    two = loop.generate_batch(prompts, budgets, (), batch_size=3)
    assert [r.stats.accepted_lengths for r in two] == [r.stats.accepted_lengths for r in one]
    assert sum(r.stats.level2_steps for r in two) > 0 and len({n for r in one for n in r.stats.accepted_lengths}) > 2


def _former_draws(alphas, seed, rows, k, steps):
    """The draws without ``lengths`` as the documented formula gives them: u from (seed, step),
    (row << 12) + draft position, the step counting from 1; accepted = leading u < alpha."""
    out = []
    alpha = torch.tensor([alphas[min(i, len(alphas) - 1)] for i in range(k)])
    for step in range(1, steps + 1):
        seeds = torch.full((rows,), (seed & 0x7FFFFFFF) << 32 | step, dtype=torch.long)
        u = uniform(seeds, (torch.arange(rows)[:, None] << 12) + torch.arange(1, k + 1)[None], ACCEPT)
        out.append((u < alpha).long().cumprod(1).sum(1).tolist())
    return out


def test_step_draws_differ_across_steps_and_keep_their_values():
    """The step counter lives on the device now (a graph replay advances it): the draws are
    still the formula's, step after step, and pinned values of a fixed seed do not move."""
    v = ReplayVerifier([0.8, 0.7, 0.6], seed=11)
    draws = [v.draw(6, 5, "cpu").tolist() for _ in range(4)]
    assert draws == [[1, 1, 1, 2, 2, 1], [1, 0, 4, 1, 0, 3], [3, 2, 0, 1, 5, 5], [1, 1, 0, 1, 1, 2]]
    assert draws == _former_draws([0.8, 0.7, 0.6], 11, 6, 5, 4) and v.step == 4
    by_position = ReplayVerifier([0.8, 0.7, 0.6], seed=11, lengths=lambda: torch.tensor([3, 9, 20, 4]))
    assert by_position.draw(4, 5, "cpu").tolist() == [2, 1, 1, 2]


def test_reset_restarts_and_reseeds_the_device_words_in_place():
    v = ReplayVerifier([0.5], seed=1)
    first = [v.draw(64, 6, "cpu") for _ in range(3)]
    counter, word = v._device_words(torch.device("cpu"))
    v.reset()
    assert v.step == 0 and all(torch.equal(a, v.draw(64, 6, "cpu")) for a in first)
    v.reset(seed=9)
    assert v._device_words(torch.device("cpu")) == (counter, word)  # the same tensors: graphs keep them
    fresh = ReplayVerifier([0.5], seed=9)
    assert torch.equal(v.draw(64, 6, "cpu"), fresh.draw(64, 6, "cpu"))
    assert not torch.equal(v.draw(64, 6, "cpu"), first[1])
    lengths = torch.arange(64)
    by_position = ReplayVerifier([0.5], seed=1, lengths=lambda: lengths)
    before = by_position.draw(64, 6, "cpu")
    by_position.reset(seed=9)
    assert torch.equal(by_position.draw(64, 6, "cpu"), ReplayVerifier([0.5], seed=9, lengths=lambda: lengths).draw(64, 6, "cpu"))
    by_position.reset(seed=1)
    assert torch.equal(by_position.draw(64, 6, "cpu"), before)


def test_draws_started_in_inference_mode_reset_outside_it():
    """Benchmarks warm a loop up under inference mode and reset its replay outside it."""
    v = ReplayVerifier([0.6], seed=2)
    with torch.inference_mode():
        first = v.draw(8, 4, "cpu")
    v.reset(seed=2)
    assert torch.equal(v.draw(8, 4, "cpu"), first)
    with torch.inference_mode():
        v.draw(8, 4, "cpu")
    assert v.step == 2
