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


def _broken(pair):
    system = build_eager(pair, None, max_len=64)
    with torch.no_grad():
        system.target.layers[1].mlp.down_proj.weight.mul_(-3.0)
    return system


def test_fp32_audit_moves_only_mismatches_within_stock_error(checkpoints):
    """An audited tie needs fp32 to prefer stock's token by no more than stock's own error (or
    to prefer the system's); it is listed apart from the ordinary ties, with both numbers, and
    every other mismatch still fails."""
    pair = resolve_pair(checkpoints["target"])
    runs = run_stock_reference(pair, [PROMPT], 16)
    plain = verify_system(_broken(pair), runs, tolerance=1e-3)
    assert plain.failures
    inside = verify_system(_broken(pair), runs, tolerance=1e-3, referee=lambda *a: (0.1, 0.2))
    assert not inside.failures and len(inside.audited_ties) == len(plain.failures) and inside.passed
    assert inside.audited_ties[0].fp32_margin == 0.1 and inside.audited_ties[0].stock_error == 0.2
    assert "fp32-audited ties" in inside.summary() and inside.to_json()["audited_ties"]
    outside = verify_system(_broken(pair), runs, tolerance=1e-3, referee=lambda *a: (0.3, 0.2))
    assert len(outside.failures) == len(plain.failures) and not outside.audited_ties and not outside.passed
    assert outside.failures[0].fp32_margin == 0.3 and "fp32 audit: on" in outside.summary()
    # fp32 prefers the system's token by more than stock's error: stock's pick was the rounding artifact
    system_right = verify_system(_broken(pair), runs, tolerance=1e-3, referee=lambda *a: (-0.3, 0.2))
    assert len(system_right.audited_ties) == len(plain.failures) and system_right.passed


def test_ties_carry_fp32_numbers_and_the_report_says_whether_it_audited(checkpoints):
    """With a referee the ordinary ties get the fp32 numbers too (they stay ties); the report
    says whether the audit ran and, when an fp32 copy of stock does not fit, why not."""
    from specc.stock.runner import StockSystem
    from specc.verify import fp32_referee

    pair = resolve_pair(checkpoints["target"])
    runs = run_stock_reference(pair, [PROMPT], 16)
    ties = verify_system(_broken(pair), runs, tolerance=1e9, referee=lambda *a: (5.0, 0.1))
    assert ties.ties and not ties.audited_ties and not ties.failures
    assert all(m.fp32_margin == 5.0 and m.stock_error == 0.1 for m in ties.ties)
    assert verify_system(_broken(pair), runs, tolerance=1e9).audit is None
    stock = StockSystem(pair, None, torch.bfloat16, "cpu")
    referee, note = fp32_referee(stock.target, free_bytes=1024)
    assert referee is None and note.startswith("fp32 audit: off") and "GiB free" in note
    report = verify_system(_broken(pair), runs, tolerance=1e-3, audit=note)
    assert report.failures and note in report.summary() and report.to_json()["audit"] == note
    referee, note = fp32_referee(stock.target, free_bytes=2**40)
    assert referee is not None and note.startswith("fp32 audit: on")
    assert next(referee.fp32.parameters()).dtype == torch.float32
    assert fp32_referee(StockSystem(pair, None, torch.float32, "cpu").target)[0] is None  # fp32 stock


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp32_referee_measures_margin_and_stock_error(checkpoints, dtype):
    from specc.stock.runner import StockSystem
    from specc.verify import Fp32Referee

    pair = resolve_pair(checkpoints["target"])
    stock = StockSystem(pair, None, dtype, "cpu")
    runs = run_stock_reference(pair, [PROMPT], 8, stock=stock)
    referee = Fp32Referee(stock.target)
    run = runs[0]
    ids = torch.tensor([PROMPT + run.tokens])
    with torch.inference_mode():
        low = stock.target(input_ids=ids).logits[0].float()
        ref = referee.fp32(input_ids=ids).logits[0].float()
    row = len(PROMPT) + 2 - 1
    e, g = run.tokens[2], int(ref[row].argsort()[-2])
    margin, error = referee(0, run, 2, e, g)
    assert margin == pytest.approx((ref[row, e] - ref[row, g]).item(), abs=1e-6)
    assert error == pytest.approx(max(abs(low[row, e] - ref[row, e]).item(), abs(low[row, g] - ref[row, g]).item()),
                                  abs=1e-6)
    if dtype == torch.float32:
        assert error == 0.0  # an fp32 stock is its own reference: the audit can never apply
    else:
        assert error > 0.0


def test_top2_margins_of_given_logits():
    """Margins of the logits stock decoded with (generate's own), NaN where a row is not finite."""
    import math

    from specc.verify.forcing import top2_margins

    logits = torch.tensor([[1.0, 3.0, 2.5], [0.0, -1.0, 0.0], [float("nan"), 1.0, 0.0]], dtype=torch.bfloat16)
    got = top2_margins(logits)
    assert got[:2] == [0.5, 0.0] and math.isnan(got[2])
