"""The loop's calls of the compiled tree verify step keep one input signature at every step, within
the token bound ``engine.build_loop`` graphs it for, so a CUDA graph captured once serves every
step (a varying shape would miss the graph and run eagerly, a cost the standalone step timings
never see); under graphs the step replays one capture and runs nothing eagerly."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

from helpers import SignatureSpy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))

BUDGET = 16
PROMPT = list(range(20, 52))


def _loops(device: str, dtype):
    import bench_tree as B
    from specc.pairing import resolve_pair

    pair = resolve_pair("specc-tiny", "specc-tiny-dflash", "dflash")
    steps, section = B.compiled_tree_steps(pair, dtype, device)
    loops = [B.compiled_tree_system(steps, section, pair.impl.strategy, budget, 256) for budget in (0, BUDGET)]
    for loop in loops:  # the tree verify step's own calls and graph (whole-step graphs call it inside theirs)
        loop.step_graphs = False
    return loops


def _check_calls(tree, chain, new_tokens: int, lossless: bool = True) -> SignatureSpy:
    """``lossless``: also compare with the chain's tokens (fp32; bf16 trees and chains may part
    at numerical ties, as bench_tree's margins show)."""
    spy = SignatureSpy(tree.tree_target)  # stands in for the loop's tree step
    tree.tree_target = spy
    tokens = tree.generate(PROMPT, new_tokens, ()).tokens
    tree.generate(PROMPT[:20], new_tokens, ())  # another prompt length: still the same signature
    tree.tree_target = spy.step
    if lossless:
        assert tokens == chain.generate(PROMPT, new_tokens, ()).tokens
    rows = BUDGET + 1
    assert len(spy.signatures) >= 4 and len(set(spy.signatures)) == 1
    tokens_sig, positions_sig, cache_len_sig, mask_sig = spy.signatures[0]
    assert tokens_sig == ((1, rows), torch.long) and positions_sig == ((1, rows), torch.long)
    assert cache_len_sig == ((1,), torch.long) and mask_sig == ((1, rows, rows), torch.bool)
    return spy


def test_tree_verify_calls_keep_one_signature_cpu():
    chain, tree = _loops("cpu", torch.float32)
    _check_calls(tree, chain, 24)


@pytest.mark.gpu
def test_tree_verify_replays_one_graph_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    chain, tree = _loops("cuda", torch.bfloat16)
    tree.generate(PROMPT, 32, ())  # warm-up: the capture
    before = tree.graph_stats()["target_tree"]
    spy = _check_calls(tree, chain, 32, lossless=False)
    after = tree.graph_stats()["target_tree"]
    assert tree.steps["target_tree"].max_tokens == BUDGET + 1
    assert after["captures"] == before["captures"] == 1 and after["eager_calls"] == before["eager_calls"]
    assert after["replays"] - before["replays"] == len(spy.signatures)
    assert not after["eager_reasons"]
