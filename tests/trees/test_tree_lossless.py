"""Tree decoding is lossless: greedy output == HF greedy AR, token for token, for every target
family x parallel drafter (PARD, DFlash), with full / partial / zero acceptance, EOS and
max_new_tokens inside an accepted path; the device loop's tree mode == the eager loop's."""

from __future__ import annotations

import pytest
from helpers import PROMPT
from lossless import eos_inside_accepted_block, reference

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager

MAX_NEW = 20
# (method, target key, drafter key, num_draft)
TREE_SCENARIOS = [
    ("pard", "target", "pard_same", 4),
    ("pard", "const_target", "const_pard", 4),
    ("dflash", "target", "dflash", 3),
    ("dflash", "const_target", "const_dflash", 3),
]


def _eager(method, target, drafter, num_draft, budget, max_new, cap=True, prompt=PROMPT, topk=None):
    dec = build_eager(resolve_pair(target, drafter, method), num_draft, max_len=len(prompt) + max_new,
                      tree_budget=budget)
    dec.cap_to_budget, dec.tree_topk = cap, topk
    return dec


def _device(eager, cap=True, batch=1):
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len,
                                    cap_to_budget=cap, tree_budget=eager.tree_budget, batch=batch,
                                    tree_topk=eager.tree_topk)


@pytest.mark.parametrize("budget", [3, 12])
@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", TREE_SCENARIOS)
def test_tree_decoding_equals_ar_greedy(checkpoints, method, target_key, drafter_key, num_draft, budget):
    """The constant drafters' distributions are nearly flat (best-first makes wide, shallow trees):
    their full-acceptance case uses one candidate per position (a chain-shaped tree)."""
    target, drafter = checkpoints[target_key], checkpoints[drafter_key]
    want = reference(target, MAX_NEW)
    full = target_key == "const_target"
    if full:
        budget = max(budget, num_draft)
    topk = 1 if full else None
    eager = _eager(method, target, drafter, num_draft, budget, MAX_NEW, topk=topk)
    got = eager.generate(PROMPT, MAX_NEW)
    assert got.tokens == want
    nodes = min(budget, num_draft) if full else budget
    assert got.stats.tree_nodes[0] == nodes + 1 and max(got.stats.tree_nodes) == nodes + 1
    assert sum(got.stats.accepted_lengths) == MAX_NEW - 1
    dev = _device(_eager(method, target, drafter, num_draft, budget, MAX_NEW, topk=topk)).generate(PROMPT, MAX_NEW)
    assert dev.tokens == want
    assert dev.stats.accepted_lengths == got.stats.accepted_lengths
    assert dev.stats.draft_forwards == got.stats.draft_forwards
    lengths = got.stats.accepted_lengths[:-1]
    if full:
        assert all(n == num_draft + 1 for n in lengths), got.stats.accepted_lengths
    assert "tree" in got.to_json()["stats"]


def test_tree_acceptance_partial_and_zero(checkpoints):
    """The random DFlash drafter's top-1 chain is never accepted; its tree sometimes is, and
    PARD on the same target is partial: a mix of accepted path lengths."""
    target = checkpoints["target"]
    pard = _eager("pard", target, checkpoints["pard_same"], 4, 12, MAX_NEW).generate(PROMPT, MAX_NEW)
    lengths = pard.stats.accepted_lengths[:-1]
    assert any(n > 1 for n in lengths) and any(n < 5 for n in lengths), pard.stats.accepted_lengths
    zero = _eager("dflash", target, checkpoints["dflash"], 3, 1, MAX_NEW).generate(PROMPT, MAX_NEW)
    assert zero.tokens == reference(target, MAX_NEW)


@pytest.mark.parametrize("method,drafter_key,num_draft,budget", [("pard", "pard_same", 4, 8), ("dflash", "dflash", 3, 64)])
def test_eos_inside_accepted_path(checkpoints, method, drafter_key, num_draft, budget):
    target = checkpoints["const_target" if drafter_key.startswith("const") else "target"]
    drafter = checkpoints[drafter_key]
    topk = 1 if drafter_key.startswith("const") else None
    free = _eager(method, target, drafter, num_draft, budget, MAX_NEW, topk=topk).generate(PROMPT, MAX_NEW)
    eos = eos_inside_accepted_block(free)
    assert eos is not None, f"no EOS candidate inside an accepted path: {free.stats.accepted_lengths}"
    want = reference(target, MAX_NEW, eos=eos)
    assert want[-1] == eos and len(want) < MAX_NEW
    eager = _eager(method, target, drafter, num_draft, budget, MAX_NEW, topk=topk)
    for loop in (eager, _device(_eager(method, target, drafter, num_draft, budget, MAX_NEW, topk=topk))):
        got = loop.generate(PROMPT, MAX_NEW, (eos,))
        assert got.tokens == want and got.finished_by == "eos"
        assert sum(got.stats.accepted_lengths) == len(want) - 1


@pytest.mark.parametrize("method,drafter_key,num_draft", [("pard", "const_pard", 4), ("dflash", "const_dflash", 3)])
def test_max_new_tokens_inside_accepted_path(checkpoints, method, drafter_key, num_draft):
    target, drafter = checkpoints["const_target"], checkpoints[drafter_key]
    max_new = num_draft + 4  # 1 (prefill) + a full path + part of the next
    want = reference(target, max_new)
    for cap in (True, False):
        eager = _eager(method, target, drafter, num_draft, 8, max_new, cap=cap, topk=1)
        for loop in (eager, _device(_eager(method, target, drafter, num_draft, 8, max_new, cap=cap, topk=1), cap=cap)):
            got = loop.generate(PROMPT, max_new)
            assert got.tokens == want and got.finished_by == "length"
            if not cap:
                assert got.stats.accepted_lengths == [num_draft + 1, 2]


def test_tree_batch_rows_equal_single_rows(checkpoints):
    target, drafter = checkpoints["target"], checkpoints["pard_same"]
    prompts = [PROMPT, [7, 3, 19, 40, 2, 11, 6]]
    loop = _device(_eager("pard", target, drafter, 4, 10, MAX_NEW), batch=2)
    rows = loop.generate_batch(prompts, MAX_NEW)
    for prompt, row in zip(prompts, rows):
        assert row.tokens == reference(target, MAX_NEW, prompt=prompt)
