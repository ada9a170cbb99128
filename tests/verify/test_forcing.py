"""Token forcing: passes for a lossless system, fails (and says where) for a broken one."""

import pytest
import torch
from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime.eager import build_eager
from specc.verify import calibration_prompts, run_stock_reference, verify_system


@pytest.mark.parametrize("drafter_key", [None, "pard_same", "dflash"])
def test_eager_system_passes(checkpoints, drafter_key):
    pair = resolve_pair(checkpoints["target"], checkpoints.get(drafter_key))
    prompts = [PROMPT] + calibration_prompts(None, 96, count=2)
    runs = run_stock_reference(pair, prompts, 16)
    system = build_eager(pair, None, max_len=64)
    report = verify_system(system, runs, tolerance=1e-3)
    assert report.passed, report.summary()
    assert report.positions == sum(len(r.tokens) for r in runs) > 0 and not report.ties


def test_broken_system_fails_with_position(checkpoints):
    pair = resolve_pair(checkpoints["target"])
    runs = run_stock_reference(pair, [PROMPT], 16)
    system = build_eager(pair, None, max_len=64)
    with torch.no_grad():
        system.target.layers[1].mlp.down_proj.weight.mul_(-3.0)
    report = verify_system(system, runs, tolerance=1e-3)
    assert not report.passed
    assert report.failures and report.failures[0].prompt_index == 0
    assert "FAIL" in report.summary() and "position" in report.summary()


def test_tie_tolerance_turns_mismatches_into_ties(checkpoints):
    """With a huge tolerance every mismatch is a tie: ties are counted, not silently dropped."""
    pair = resolve_pair(checkpoints["target"])
    runs = run_stock_reference(pair, [PROMPT], 16)
    system = build_eager(pair, None, max_len=64)
    with torch.no_grad():
        system.target.layers[1].mlp.down_proj.weight.mul_(-3.0)
    report = verify_system(system, runs, tolerance=1e9)
    assert report.ties and not report.failures
    assert report.to_json()["ties"][0]["margin"] >= 0
