"""compare_outputs / PrefixLogits: two greedy outputs may differ only at a numerical tie (the
reference's top-2 margin within the tolerance), which is reported; any other difference fails."""

from __future__ import annotations

import math

import torch
from helpers import greedy_by_prefix

from specc.bench.shapes import build_causal, target_config
from specc.verify import PrefixLogits, compare_outputs

PROMPTS = [[5, 17, 33, 2], [9, 1, 4]]


def _fixed(margin, fp32=None):
    calls = []

    def margins(prompt, tokens, position, got):
        calls.append((tuple(prompt), position, got))
        return margin, fp32

    return margins, calls


def test_equal_outputs_measure_nothing():
    margins, calls = _fixed(0.0)
    report = compare_outputs(PROMPTS, [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]], margins, 1e-3)
    assert report.passed and not report.ties and not calls and report.requests == 2


def test_a_difference_within_the_tolerance_is_a_tie_at_the_first_difference_only():
    margins, calls = _fixed(0.01, 0.002)
    report = compare_outputs(PROMPTS, [[1, 2, 3, 4], [4, 5]], [[1, 2, 9, 9], [4, 5]], margins, 0.25)
    assert report.passed and not report.failures
    (tie,) = report.ties
    assert (tie.request, tie.position, tie.expected, tie.got, tie.margin, tie.fp32_margin) == (0, 2, 3, 9, 0.01, 0.002)
    assert calls == [(tuple(PROMPTS[0]), 2, 9)]  # later positions are not comparable after a tie
    assert tie.to_json()["position"] == 2


def test_a_difference_above_the_tolerance_fails():
    margins, _ = _fixed(3.0)
    report = compare_outputs(PROMPTS, [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]], margins, 0.25)
    assert not report.passed and not report.ties
    assert (report.failures[0].request, report.failures[0].position) == (1, 1)
    assert "request 1 position 1" in report.summary()


def test_non_finite_margins_and_truncated_outputs_fail():
    nan, _ = _fixed(math.nan)
    assert not compare_outputs(PROMPTS[:1], [[1, 2]], [[1, 3]], nan, 1e9).passed
    small, _ = _fixed(0.0)
    assert not compare_outputs(PROMPTS[:1], [[1, 2]], [[1]], small, 1e9).passed  # ended early
    assert not compare_outputs(PROMPTS[:1], [[1, 2]], [[1, 2, 7]], small, 1e9).passed  # ran on



@torch.inference_mode()
def test_prefix_logits_measures_the_reference_margin_and_finds_a_real_tie():
    model = build_causal(target_config("tiny-qwen3"), torch.float32, torch.device("cpu"), seed=1)
    prompt = PROMPTS[0]
    tokens = greedy_by_prefix(model, prompt, 4)
    probe = PrefixLogits(model)
    logits = PrefixLogits.logits(model, prompt, tokens, 2)
    top = logits.topk(2)
    margin, fp32_gap = probe(prompt, tokens, 2, int(top.indices[1]))
    assert margin == float(top.values[0] - top.values[1]) > 0
    assert fp32_gap == margin  # fp32 model: the gap between the top two is the margin itself
    # a real tie: the runner-up's LM-head row made equal to the winner's, so their logits are equal
    tied_model = build_causal(target_config("tiny-qwen3"), torch.float32, torch.device("cpu"), seed=1)
    winner, other = int(top.indices[0]), int((top.indices[0] + 1) % logits.shape[0])
    tied_model.lm_head.weight[other] = tied_model.lm_head.weight[winner]
    flipped = tokens[:2] + [other, 0]
    report = compare_outputs([prompt], [tokens], [flipped], PrefixLogits(tied_model), 1e-3)
    assert report.passed and report.ties[0].position == 2 and report.ties[0].margin == 0.0
    # the same difference in the untied model is a bug
    report = compare_outputs([prompt], [tokens], [flipped], probe, 1e-3)
    assert not report.passed and report.failures[0].margin > 1e-3
