"""Whole-step graphs at batch 1 (``specc.runtime.step_graphs``): each greedy chain step as one
replay of draft, verify, accept and commit, launched ahead of the scheduler's bookkeeping.

On the CPU a stand-in plays the CUDA graph: capturing records the step's body without running
it, and each replay runs the body with the loop's host mirrors (committed counts, the drafter's
lengths and context) replaced by garbage, so a body that read a host value where a real graph
would have frozen it gives other tokens or fails. Every run must equal the unfused loop: tokens,
accepted lengths and drafter forwards, greedy and with replayed acceptance (so every drafting
key occurs), across EOS, budgets and requests that follow each other in the slot."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.graphs import GraphedStep, unwrapped
from specc.runtime.replay import ReplayVerifier

QWEN3 = pytest.mark.parametrize("family", ["qwen3"], indirect=True)
DRAFTERS = [("dflash", "dflash", 3), ("pard_same", "pard", 4), ("ar_perturbed", "ar-draft", 3)]
_GARBAGE = 10 ** 6


class _Recorded:
    """A CPU stand-in of a captured CUDA graph of ``body`` (see the module doc)."""

    def __init__(self, body, loop):
        self.body, self.loop = body, loop
        loop.recorded = getattr(loop, "recorded", 0) + 1

    def replay(self):
        loop, drafter = self.loop, self.loop.drafter
        saved = [(loop, "n", loop.n)]
        if drafter is not None:
            saved += [(drafter, name, getattr(drafter, name)) for name in ("lengths", "context_lens", "context")
                      if hasattr(drafter, name)]
        for owner, name, value in saved:
            setattr(owner, name, None if name == "context" else [_GARBAGE] * len(value))
        try:
            self.body()
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)


def _loop(checkpoints, key, method, k, graphs: bool, cap_to_budget: bool = True, new: int = 48):
    if key is None:  # plain AR
        eager = build_eager(resolve_pair(checkpoints["target"], None, "ar"), 0, max_len=len(PROMPT) + new)
    else:
        eager = build_eager(resolve_pair(checkpoints["target"], checkpoints[key], method), k, max_len=len(PROMPT) + new)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len,
                                    cap_to_budget=cap_to_budget)
    loop.step_graphs = graphs
    loop.step_graph_capture = lambda body, pool, lp=loop: _Recorded(body, lp)
    return loop


def _replays(loop) -> int:
    stats = loop.graph_stats().get("step")
    if stats is None:
        return 0
    assert not stats["eager_reasons"], stats["eager_reasons"]
    return stats["replays"]


def _same(got, want):
    assert got.tokens == want.tokens
    assert got.stats.accepted_lengths == want.stats.accepted_lengths
    assert got.finished_by == want.finished_by


@QWEN3
@pytest.mark.parametrize("cap_to_budget", [True, False])
@pytest.mark.parametrize("key,method,k", DRAFTERS + [(None, "ar", 0)])
def test_whole_step_graphs_give_the_unfused_tokens(checkpoints, key, method, k, cap_to_budget):
    on = _loop(checkpoints, key, method, k, True, cap_to_budget)
    off = _loop(checkpoints, key, method, k, False, cap_to_budget)
    got, want = on.generate(PROMPT, 23, ()), off.generate(PROMPT, 23, ())
    _same(got, want)
    assert got.tokens == reference(checkpoints["target"], 23)
    steps = len(got.stats.accepted_lengths) - 1  # decode steps (the first token is the prefill's)
    # unfused: the first decode step (kernels compile; DFlash: the prompt's context), and with
    # drafting capped at the budget the last ones (each smaller k first runs unfused)
    assert _replays(on) >= steps - 1 - 2 * cap_to_budget
    assert "step" not in off.graph_stats()
    if key is not None:
        assert on.drafter.forwards == off.drafter.forwards
    # requests one after another in the slot, budgets ending mid-step, an EOS inside a block
    prompts, budgets = [PROMPT, PROMPT[:4], PROMPT[2:]], [11, 3, 17]
    got = on.generate_batch(prompts, budgets, (), batch_size=1)
    want = off.generate_batch(prompts, budgets, (), batch_size=1)
    for g, w in zip(got, want):
        _same(g, w)
    eos = want[0].tokens[6]
    _same(on.generate(PROMPT, 23, (eos,)), off.generate(PROMPT, 23, (eos,)))


@QWEN3
@pytest.mark.parametrize("key,method,k", DRAFTERS)
def test_every_drafting_key_under_replayed_acceptance(checkpoints, key, method, k):
    """Replayed acceptance varies the accepted count, so the next draft's key (DFlash: context
    entries; PARD: tokens to feed) takes several values; all of them are captured at once."""
    loops = [_loop(checkpoints, key, method, k, graphed, cap_to_budget=False) for graphed in (True, False)]
    for loop in loops:
        loop.verifier = ReplayVerifier([0.9, 0.5, 0.8, 0.6][:k], seed=5)
    got, want = (loop.generate(PROMPT, 40, ()) for loop in loops)
    _same(got, want)
    assert len(set(got.stats.accepted_lengths[1:])) > 1
    graphs = loops[0]._step_graphs
    assert graphs.captures >= 2 and graphs.replays >= len(got.stats.accepted_lengths) - 4
    assert loops[0].recorded == graphs.captures  # captured once each, never again


@QWEN3
def test_steps_are_launched_ahead_of_the_scheduler(checkpoints):
    """Through the scheduler (``runs_ahead``) the next step's graph is on its way when a step
    returns; a request that ends drops it; a call that does not match it is refused."""
    loop = _loop(checkpoints, "dflash", "dflash", 3, True, cap_to_budget=False)
    assert loop.runs_ahead
    scheduler = BatchScheduler(loop, 1)
    scheduler.submit(PROMPT, 30, ())
    scheduler.admit()
    launched = 0
    while not scheduler.idle:
        scheduler.decode()
        launched += loop._ahead_step is not None
    assert launched >= 3 and loop._ahead_step is None  # the finished request dropped the last one
    scheduler = BatchScheduler(loop, 1)
    scheduler.submit(PROMPT, 30, ())
    scheduler.admit()
    while loop._ahead_step is None:
        scheduler.decode()
    with pytest.raises(RuntimeError, match="launched ahead"):
        loop.speculate([30], 2)  # another k than the step launched for it


@QWEN3
def test_no_whole_step_graphs_where_they_do_not_apply(checkpoints):
    """Batches, per-part profiles and the CPU without a capture stand-in run unfused."""
    loop = _loop(checkpoints, "pard_same", "pard", 4, True)
    want = _loop(checkpoints, "pard_same", "pard", 4, False)
    results = loop.generate_batch([PROMPT, PROMPT[:3]], [12, 9], (), batch_size=2)
    expected = want.generate_batch([PROMPT, PROMPT[:3]], [12, 9], (), batch_size=2)
    assert [r.tokens for r in results] == [r.tokens for r in expected] and _replays(loop) == 0
    loop.profile = True
    _same(loop.generate(PROMPT, 12, ()), want.generate(PROMPT, 12, ()))
    assert _replays(loop) == 0 and set(loop.part_seconds) >= {"draft", "verify", "accept"}
    loop.profile, loop.step_graph_capture = False, None  # CPU tensors: no CUDA graphs to make
    _same(loop.generate(PROMPT, 12, ()), want.generate(PROMPT, 12, ()))
    assert _replays(loop) == 0


def test_a_hybrid_target_keeps_its_recurrent_state_exact(tmp_path_factory):
    """AR on a hybrid (GDN + attention) target: the graph commits the recurrent state's snapshot
    like the unfused step; tokens equal plain greedy decoding."""
    from hybrid_factory import load_hybrid

    from specc.runtime.eager import EagerSpeculativeDecoder

    _, _, target = load_hybrid(tmp_path_factory, seed=0, name="hy-step-graphs")
    prompt = [5, 17, 33, 2, 61, 40, 8, 71, 12]
    plain = EagerSpeculativeDecoder(target, None, 0, 48).generate(prompt, 14).tokens
    loop = DeviceSpeculativeDecoder(target, None, 0, 48)
    loop.step_graphs = True
    loop.step_graph_capture = lambda body, pool: _Recorded(body, loop)
    assert loop.generate(prompt, 14).tokens == plain
    assert _replays(loop) >= 10


def test_unwrapped_steps():
    step = torch.nn.Identity()
    graphed = GraphedStep(step)
    assert unwrapped(graphed) == graphed._run and unwrapped(step) is step


@QWEN3
@pytest.mark.parametrize("key,method,k", DRAFTERS[:2])
def test_with_graphed_steps_as_on_a_gpu(checkpoints, key, method, k):
    """The loop as ``engine.build_loop`` makes it on CUDA: steps wrapped in (CPU stand-ins of)
    ``GraphedStep``, every drafting shape captured up front, drafting not capped at the budget.
    The whole-step graph calls the wrapped steps themselves, never their graphs."""
    from cpu_graphs import CpuGraphedStep

    def graphed(step_graphs):
        loop = _loop(checkpoints, key, method, k, step_graphs, cap_to_budget=False)
        loop.target = CpuGraphedStep(loop.target, max_tokens=k + 1)
        drafter = loop.drafter
        attr = "drafter" if method == "dflash" else "model"
        setattr(drafter, attr, CpuGraphedStep(getattr(drafter, attr), max_tokens=2 * k + 2))
        loop.capture_shapes = True
        loop.verifier = ReplayVerifier([0.9, 0.6, 0.8, 0.7][:k], seed=2)
        return loop

    on, off = graphed(True), graphed(False)
    got, want = on.generate(PROMPT, 30, ()), off.generate(PROMPT, 30, ())
    _same(got, want)
    assert _replays(on) >= len(got.stats.accepted_lengths) - 3
    inner = on.target.replays
    steps = len(on.generate(PROMPT, 30, ()).stats.accepted_lengths) - 1
    # the target's own graph replays only in the first decode step (the drafter has not read the
    # prompt yet: unfused); whole steps call the wrapped step inside their own graphs
    assert on.target.replays == inner + 1 and _replays(on) >= steps - 1


@QWEN3
@pytest.mark.parametrize("key,method,k", DRAFTERS[:2])
def test_tree_steps_as_one_graph(checkpoints, key, method, k):
    """A tree step (plan, tree verify, acceptance, the accepted path's KV compaction, DFlash's
    context along the path) as one graph gives the unfused tree step's tokens, greedy and with a
    replayed per-rank acceptance whose paths leave the top-1 chain."""
    from specc.runtime.tree_replay import TreeReplayVerifier

    def tree_loop(graphs):
        eager = build_eager(resolve_pair(checkpoints["target"], checkpoints[key], method), k,
                            max_len=len(PROMPT) + 48, tree_budget=6)
        loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, k, eager.max_len, cap_to_budget=False,
                                        tree_budget=6)
        loop.step_graphs = graphs
        loop.step_graph_capture = lambda body, pool: _Recorded(body, loop)
        return loop

    on, off = tree_loop(True), tree_loop(False)
    got, want = on.generate(PROMPT, 30, ()), off.generate(PROMPT, 30, ())
    _same(got, want)
    assert got.stats.tree_nodes == want.stats.tree_nodes and set(got.stats.tree_nodes) == {7}
    assert got.tokens == reference(checkpoints["target"], 30)
    assert _replays(on) >= len(got.stats.accepted_lengths) - 3
    for loop in (on, off):
        loop.use_verifiers(tree=TreeReplayVerifier([[0.6, 0.3], [0.7, 0.2]], seed=3))
    assert on._step_graphs is None  # dropped with the old verifier
    got, want = on.generate(PROMPT, 40, ()), off.generate(PROMPT, 40, ())
    _same(got, want)
    assert len(set(got.stats.accepted_lengths)) > 1 and _replays(on) >= len(got.stats.accepted_lengths) - 3


@pytest.mark.parametrize("budget", [0, 8])
def test_shipped_hybrid_pair_chain_and_tree(budget):
    """specc-tiny-hybrid (GDN + attention) with its DFlash drafter, real weights: whole chain and
    tree steps commit the recurrent state's snapshot and DFlash's context as the unfused steps do
    (the same tokens, which accept several drafts per step)."""
    from specc.models.loading import ZOO_DIR

    if not (ZOO_DIR / "specc-tiny-hybrid-dflash" / "config.json").is_file():
        pytest.skip("hybrid zoo models not shipped")
    from specc.runtime.eager import build_device_loop

    prompt = [int(t) for t in torch.randint(10, 8000, (24,), generator=torch.Generator().manual_seed(0))]
    runs = []
    for graphs in (True, False):
        loop = build_device_loop(resolve_pair("specc-tiny-hybrid", "specc-tiny-hybrid-dflash", "dflash"), 15,
                                 max_len=96, tree_budget=budget)
        loop.cap_to_budget = False
        loop.step_graphs = graphs
        loop.step_graph_capture = lambda body, pool, lp=loop: _Recorded(body, lp)
        runs.append((loop.generate(prompt, 40, ()), _replays(loop)))
    (got, replays), (want, _) = runs
    _same(got, want)
    assert max(got.stats.accepted_lengths) > 1 and replays >= len(got.stats.accepted_lengths) - 3


@QWEN3
@pytest.mark.parametrize("key,method,k", DRAFTERS[:2] + [(None, "ar", 0)])
def test_sampled_chain_steps_as_one_graph(checkpoints, key, method, k):
    """Speculative sampling at batch 1 (a parallel drafter, or plain AR): each step's draws,
    rejection test and commit in one graph give the unfused step's tokens for the same seeds.
    The loop keeps its SamplingPolicy across generations (``restart``), so the graphs captured
    over its tensors serve the next generation; a processor newly in use (top-k) is another
    key; a repetition penalty (a seen set) runs unfused."""
    from specc.sampling.params import SamplingParams

    on = _loop(checkpoints, key, method, k, True, cap_to_budget=False)
    off = _loop(checkpoints, key, method, k, False, cap_to_budget=False)
    top_p = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    for params in (top_p, SamplingParams(temperature=0.7, seed=8), top_p):
        _same(on.generate(PROMPT, 24, (), params), off.generate(PROMPT, 24, (), params))
    assert on._step_graphs.policy is on.policy and _replays(on) >= 3 * (23 - 2) // (k + 1)
    captures = on._step_graphs.captures
    _same(on.generate(PROMPT, 24, (), top_p), off.generate(PROMPT, 24, (), top_p))
    assert on._step_graphs.captures == captures  # a new generation, the same graphs
    top_k = SamplingParams(temperature=1.2, top_k=5, seed=9)
    _same(on.generate(PROMPT, 24, (), top_k), off.generate(PROMPT, 24, (), top_k))
    assert on._step_graphs.captures > captures  # top-k in use: new keys
    replays = _replays(on)
    penalty = SamplingParams(temperature=0.8, repetition_penalty=1.3, seed=3)
    _same(on.generate(PROMPT, 24, (), penalty), off.generate(PROMPT, 24, (), penalty))
    assert _replays(on) == replays
    _same(on.generate(PROMPT, 24, ()), off.generate(PROMPT, 24, ()))  # greedy again


def test_step_graphs_are_on_unless_turned_off(monkeypatch):
    """Whole-step graphs are the engine's default on CUDA; SPECC_STEP_GRAPHS=0 turns them off
    and a value that is neither on nor off is refused."""
    from specc.runtime.step_graphs import ENV, step_graphs_enabled

    monkeypatch.delenv(ENV, raising=False)
    assert step_graphs_enabled()
    for value, on in (("", True), ("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False),
                      ("false", False)):
        monkeypatch.setenv(ENV, value)
        assert step_graphs_enabled() is on, value
    monkeypatch.setenv(ENV, "2")
    with pytest.raises(ValueError, match="SPECC_STEP_GRAPHS"):
        step_graphs_enabled()
