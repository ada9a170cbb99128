"""Whole-step CUDA graphs (GPU only): compiled specc-tiny steps in the engine's loop, each batch-1
greedy chain step one graph replay. Tokens and accepted lengths equal the loop without them
(greedy, and with replayed acceptance so every drafting key occurs), through the scheduler
(steps launched ahead) and for plain AR; the graphs are captured once per key and replayed."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))

PROMPT = list(range(20, 52))


@pytest.fixture(scope="module")
def compiled():
    import bench_tree as B
    from specc.pairing import resolve_pair

    out = {}
    for method, drafter in (("dflash", "specc-tiny-dflash"), ("pard", "specc-tiny-pard")):
        pair = resolve_pair("specc-tiny", drafter, method)
        out[method] = (pair, *B.compiled_tree_steps(pair, torch.bfloat16, "cuda"))
    return out


def _system(compiled, method, step_graphs: bool, budget: int = 0):
    """The engine's loop over the shared compiled steps (a new loop rebinds their state: use one
    at a time); ``budget``: tree verification of that many drafted nodes."""
    import bench_tree as B

    pair, steps, section = compiled[method]
    loop = B.compiled_tree_system(steps, section, pair.impl.strategy, budget, 256)
    loop.step_graphs = step_graphs
    return loop


def _runs(loop, replays: list | None = None) -> list:
    """Greedy, then with replayed acceptance (chains: per position; trees: per rank). A new
    verifier drops the whole-step graphs (they hold the old one): ``replays`` gets each run's
    whole-step replay count."""
    from specc.runtime.replay import ReplayVerifier
    from specc.runtime.tree_replay import TreeReplayVerifier

    def run(n):
        out.append(loop.generate(PROMPT, n, ()))
        if replays is not None:
            replays.append(loop.graph_stats()["step"]["replays"])

    out = []
    run(64)
    if loop.tree_budget:
        loop.use_verifiers(tree=TreeReplayVerifier([[0.7, 0.15], [0.8, 0.1]], seed=4))
    else:
        loop.verifier = ReplayVerifier([0.9, 0.8, 0.7, 0.6], seed=4)
    run(96)
    return [(r.tokens, r.stats.accepted_lengths) for r in out]


@pytest.mark.parametrize("method,budget", [("dflash", 0), ("pard", 0), ("dflash", 16)])
def test_whole_step_graphs_equal_the_unfused_loop(compiled, method, budget):
    on = _system(compiled, method, True, budget)
    replays = []
    got = _runs(on, replays)
    stats = on.graph_stats()["step"]
    assert not stats["eager_reasons"], stats["eager_reasons"]
    # every decode step one replay, but the first (kernels compile) and, as drafting is capped at
    # the budget, the last ones (each smaller k first runs unfused)
    for count, (_, accepted), new in zip(replays, got, (64, 96)):
        done, capped = accepted[0], 0  # (the first entry is the prefill's token)
        for a in accepted[1:]:
            capped += new - done - 1 < on.num_draft
            done += a
        assert count >= len(accepted) - 2 - capped, (count, accepted)
    captures = stats["captures"]
    (on.tree_verifier if budget else on.verifier).reset()
    assert on.generate(PROMPT, 96, ()).stats.accepted_lengths == got[1][1]
    assert on.graph_stats()["step"]["captures"] == captures  # every key was captured at its first use
    want = _runs(_system(compiled, method, False, budget))
    assert got == want and len(set(got[1][1])) > 2


def test_plain_ar_as_one_graph_per_step(compiled):
    from specc.runtime.engine import build_loop

    _, steps, _ = compiled["dflash"]
    on = build_loop({"target": steps["target"]}, None, 0, 256)
    on.step_graphs = True
    got = on.generate(PROMPT, 40, ()).tokens
    assert on.graph_stats()["step"]["replays"] >= 37
    off = build_loop({"target": steps["target"]}, None, 0, 256)
    assert off.generate(PROMPT, 40, ()).tokens == got


def test_sampled_chain_steps_as_one_graph(compiled):
    """Speculative sampling (DFlash, top-p) through whole-step graphs: a seed gives the unfused
    loop's tokens; a later generation reuses the graphs."""
    from specc.sampling.params import SamplingParams

    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    on = _system(compiled, "dflash", True)
    got = [on.generate(PROMPT, 64, (), params).tokens for _ in range(2)]
    stats = on.graph_stats()["step"]
    assert not stats["eager_reasons"], stats["eager_reasons"]
    assert stats["replays"] >= 2 * 10 and got[0] == got[1]
    off = _system(compiled, "dflash", False)
    assert off.generate(PROMPT, 64, (), params).tokens == got[0]
