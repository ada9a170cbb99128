"""Lossless proof on CPU: stock loops and eager specc.models loops == HF greedy AR, token for
token, for every target family x drafter, with full / partial / zero acceptance, EOS inside an
accepted block and max_new_tokens inside a block."""

import pytest
from lossless import SCENARIOS, eos_inside_accepted_block, reference, run_eager, run_stock

MAX_NEW = 24


def _check_acceptance(stats, expected, num_draft):
    lengths = stats.accepted_lengths[:-1]  # the last step may be clipped
    if expected == "full":
        assert lengths and all(n == num_draft + 1 for n in lengths), stats.accepted_lengths
    elif expected == "zero":
        assert all(n == 1 for n in stats.accepted_lengths), stats.accepted_lengths
    elif expected == "partial":
        assert any(n > 1 for n in lengths) and any(n < num_draft + 1 for n in lengths), stats.accepted_lengths


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,expected", SCENARIOS)
def test_stock_and_eager_equal_hf_greedy(checkpoints, method, target_key, drafter_key, num_draft, expected):
    target, drafter = checkpoints[target_key], checkpoints.get(drafter_key)
    want = reference(target, MAX_NEW)
    stock = run_stock(method, target, drafter, num_draft, MAX_NEW)
    eager = run_eager(method, target, drafter, num_draft, MAX_NEW)
    assert stock.tokens == want
    assert eager.tokens == want
    assert eager.stats.accepted_lengths == stock.stats.accepted_lengths
    assert eager.stats.target_forwards == stock.stats.target_forwards
    assert eager.stats.draft_forwards == stock.stats.draft_forwards
    assert sum(stock.stats.accepted_lengths) == MAX_NEW - 1
    _check_acceptance(stock.stats, expected, num_draft)


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,expected",
                         [s for s in SCENARIOS if s[4] in ("full", "partial") and s[1] == "target"])
def test_eos_inside_accepted_block(checkpoints, method, target_key, drafter_key, num_draft, expected):
    target, drafter = checkpoints[target_key], checkpoints[drafter_key]
    free = run_stock(method, target, drafter, num_draft, MAX_NEW)
    eos = eos_inside_accepted_block(free)
    assert eos is not None, "fixture produced no usable EOS candidate"
    want = reference(target, MAX_NEW, eos=eos)
    assert want[-1] == eos and len(want) < MAX_NEW
    for run in (run_stock, run_eager):
        got = run(method, target, drafter, num_draft, MAX_NEW, eos=(eos,))
        assert got.tokens == want
        assert got.finished_by == "eos"
        assert sum(got.stats.accepted_lengths) == len(want) - 1


@pytest.mark.parametrize("method,drafter_key", [("ar-draft", "ar_same"), ("pard", "const_pard")])
def test_max_new_tokens_inside_block(checkpoints, method, drafter_key):
    """Drafting uncapped (as PARD publishes): the last block is clipped at max_new_tokens."""
    target = checkpoints["const_target" if method == "pard" else "target"]
    drafter = checkpoints[drafter_key]
    max_new = 8  # 1 (prefill) + 5 (full block) + 2 of the next block of 5
    want = reference(target, max_new)
    for run in (run_stock, run_eager):
        got = run(method, target, drafter, 4, max_new, cap=False)
        assert got.tokens == want
        assert got.stats.accepted_lengths == [5, 2]
        assert got.finished_by == "length"


def test_single_token_budget(checkpoints):
    for method, drafter in (("ar", None), ("dflash", checkpoints["dflash"])):
        got = run_stock(method, checkpoints["target"], drafter, 3, 1)
        assert got.tokens == reference(checkpoints["target"], 1)
        assert got.stats.steps == 0
