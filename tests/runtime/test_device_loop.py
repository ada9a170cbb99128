"""The device-resident loop (the engine's) equals the eager reference loop: tokens and stats."""

import pytest
import torch
from lossless import SCENARIOS, reference, run_eager
from helpers import PROMPT, SignatureSpy

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder, greedy_accept
from specc.runtime.eager import build_eager


def _device_loop(method, target, drafter, num_draft, max_new, eos=(), cap=True):
    eager = build_eager(resolve_pair(target, drafter, method), num_draft or None, max_len=len(PROMPT) + max_new)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, cap_to_budget=cap)
    return loop.generate(PROMPT, max_new, eos)


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,expected", SCENARIOS)
def test_device_loop_equals_eager_loop(checkpoints, method, target_key, drafter_key, num_draft, expected):
    target, drafter = checkpoints[target_key], checkpoints.get(drafter_key)
    want = run_eager(method, target, drafter, num_draft, 20)
    got = _device_loop(method, target, drafter, num_draft, 20)
    assert got.tokens == want.tokens == reference(target, 20)
    assert got.stats.accepted_lengths == want.stats.accepted_lengths
    assert got.stats.draft_forwards == want.stats.draft_forwards


def test_device_loop_eos_and_uncapped_budget(checkpoints):
    target, drafter = checkpoints["target"], checkpoints["ar_same"]
    free = reference(target, 20)
    eos = free[3]
    got = _device_loop("ar-draft", target, drafter, 4, 20, eos=(eos,))
    assert got.tokens == reference(target, 20, eos=eos) and got.finished_by == "eos"
    got = _device_loop("ar-draft", target, drafter, 4, 8, cap=False)
    assert got.tokens == reference(target, 8) and got.stats.accepted_lengths == [5, 2]


def test_greedy_accept_kernel_semantics():
    drafts = torch.tensor([[4, 5, 6, 7]])
    posterior = torch.tensor([[4, 5, 9, 7, 1]])
    a, committed = greedy_accept(drafts, posterior)
    assert a.tolist() == [2] and committed[0, :3].tolist() == [4, 5, 9]
    a, committed = greedy_accept(drafts, torch.tensor([[4, 5, 6, 7, 8]]))
    assert a.tolist() == [4] and committed[0].tolist() == [4, 5, 6, 7, 8]
    a, committed = greedy_accept(drafts[:, :0], torch.tensor([[3]]))
    assert a.tolist() == [0] and committed[0].tolist() == [3]


@pytest.mark.parametrize("method,drafter_key,num_draft", [("pard", "pard_same", 4), ("dflash", "dflash", 3),
                                                          ("ar-draft", "ar_perturbed", 3)])
def test_capture_shapes_covers_every_drafter_shape(checkpoints, method, drafter_key, num_draft):
    """With capture_shapes on, every drafter call of the generation that fits a graph
    (token dimension <= 2k + 2) has a shape the up-front capture already produced, the capture
    happens once per decoder, and the junk it writes into the drafter cache changes no token."""
    target = checkpoints["target"]
    eager = build_eager(resolve_pair(target, checkpoints[drafter_key], method), num_draft, max_len=len(PROMPT) + 24)
    attr = "drafter" if method == "dflash" else "model"
    recorder = SignatureSpy(getattr(eager.drafter, attr))  # its .shapes: what GraphedStep keys on
    setattr(eager.drafter, attr, recorder)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, cap_to_budget=False)
    loop.capture_shapes = True
    k = eager.num_draft
    got = loop.generate(PROMPT, 24)
    assert got.tokens == reference(target, 24)
    captured = set(recorder.shapes[:k + 1])
    later = recorder.shapes[k + 2:]  # after the first real call, over the prompt (GraphedStep.eager)
    graphable = [s for s in later if all(len(d) < 2 or d[1] <= 2 * k + 2 for d in s)]
    assert len(captured) == k + 1 and graphable
    assert set(graphable) <= captured
    before = len(recorder.shapes)
    again = loop.generate(PROMPT, 24)
    assert again.tokens == got.tokens
    assert len(recorder.shapes) - before == again.stats.draft_forwards
