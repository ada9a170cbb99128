"""The chain step's accept + commit as one CUDA graph (GPU only): the graphed loop gives the
eager loop's tokens and accepted counts, greedy and replayed, and ``graph_stats`` shows replays."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier
from specc.runtime.verifiers import ChainVerifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
QWEN3 = pytest.mark.parametrize("family", ["qwen3"], indirect=True)


def _loop(checkpoints, graphed: bool, drafter_key="ar_perturbed", method="ar-draft", k=3):
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints[drafter_key], method), k,
                        max_len=len(PROMPT) + 48, device="cuda")
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, cap_to_budget=False)
    loop.capture_shapes = graphed
    return loop


def _replays(loop) -> int:
    stats = loop.graph_stats()["chain_accept"]
    assert not stats["eager_reasons"], stats["eager_reasons"]
    return stats["replays"]


@QWEN3
def test_graphed_greedy_chain_equals_the_eager_loop(checkpoints):
    graphed, eager = _loop(checkpoints, True), _loop(checkpoints, False)
    got, want = graphed.generate(PROMPT, 40, ()), eager.generate(PROMPT, 40, ())
    assert got.tokens == want.tokens and got.stats.accepted_lengths == want.stats.accepted_lengths
    assert _replays(graphed) == len(got.stats.accepted_lengths) - 1  # the first call of a shape runs eagerly
    assert "chain_accept" not in eager.graph_stats()
    prompts, budgets = [PROMPT, PROMPT[:4], PROMPT[2:], PROMPT[1:6]], [30, 5, 22, 12]
    got = graphed.generate_batch(prompts, budgets, (), batch_size=3)  # free slots, refills
    want = eager.generate_batch(prompts, budgets, (), batch_size=3)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.stats.accepted_lengths for r in got] == [r.stats.accepted_lengths for r in want]
    assert _replays(graphed) > 0


@QWEN3
@pytest.mark.parametrize("by_position", [False, True])
def test_graphed_replay_draws_fresh_numbers_every_step(checkpoints, by_position):
    """The replay's step counter (or the rows' lengths) advances inside the graph: the replayed
    counts vary from step to step and equal the eager loop's, alone and batched; a reset restarts
    the captured draws."""
    loops = [_loop(checkpoints, graphed, "pard_same", "pard", 4) for graphed in (True, False)]
    for loop in loops:
        loop.verifier = ReplayVerifier([0.9, 0.6, 0.8, 0.5], seed=3,
                                       lengths=(lambda lp=loop: lp.state.lengths) if by_position else None)
    (graphed, eager) = loops
    got, want = graphed.generate(PROMPT, 40, ()), eager.generate(PROMPT, 40, ())
    assert got.stats.accepted_lengths == want.stats.accepted_lengths and got.tokens == want.tokens
    assert len(set(got.stats.accepted_lengths)) > 2 and _replays(graphed) > 0
    graphed.verifier.reset()
    assert graphed.generate(PROMPT, 40, ()).stats.accepted_lengths == got.stats.accepted_lengths
    graphed.verifier.reset()
    eager.verifier.reset()
    prompts, budgets = [PROMPT, PROMPT[:4], PROMPT[2:], PROMPT[1:6]], [30, 5, 22, 12]
    got = graphed.generate_batch(prompts, budgets, (), batch_size=3)
    want = eager.generate_batch(prompts, budgets, (), batch_size=3)
    assert [r.stats.accepted_lengths for r in got] == [r.stats.accepted_lengths for r in want]


@QWEN3
def test_recording_replay_runs_the_chain_accept_eagerly_and_says_why(checkpoints):
    """``record=True`` keeps a clone per call, which a replay would not make: the capture is
    refused, the function runs eagerly and every step is recorded."""
    loop = _loop(checkpoints, True, "pard_same", "pard", 4)
    loop.verifier = ReplayVerifier([0.9, 0.6], seed=1, record=True)
    res = loop.generate(PROMPT, 24, ())
    stats = loop.graph_stats()["chain_accept"]
    assert stats["replays"] == 0 and any("record" in r for r in stats["eager_reasons"].values())
    assert len(loop.verifier.history) == len(res.stats.accepted_lengths)


def test_chain_verifiers_make_no_host_sync():
    drafts = torch.randint(0, 50, (3, 5), device="cuda")
    logits = torch.randn(3, 6, 50, device="cuda")
    caps = torch.tensor([5, 2, 0], device="cuda")
    lengths = torch.tensor([4, 9, 1], device="cuda")
    replays = [ReplayVerifier([0.7], seed=2), ReplayVerifier([0.7], seed=2, lengths=lambda: lengths)]
    for v in replays:
        v.verify(drafts, logits, caps)  # first call: its tables land on the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for v in (ChainVerifier(), *replays):
            accepted, _ = v.verify(drafts, logits, caps)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(accepted[2]) == 0 and int(accepted[1]) <= 2
