"""TreeReplayVerifier: the accepted root path drawn from a per-rank model; the tree shaped by it."""

import pytest
import torch
from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier
from specc.runtime.tree_replay import TreeReplayVerifier, draw_ranks, sibling_ranks
from specc.runtime.trees import DraftTree
from specc.search.tree_acceptance import TreeAcceptanceModel

ROWS, DEPTH, VOCAB = 4000, 5, 40


def _planned(verifier, budget, topk=None, rows=ROWS, depth=DEPTH, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, depth, VOCAB, generator=g)
    root = torch.randint(0, VOCAB, (rows,), generator=g)
    tokens, parents, depths, _, mask = verifier.plan(logits, root, torch.zeros(rows, dtype=torch.long), budget, topk)
    return DraftTree.planned(tokens, parents, depths, mask)


def _targets(tree, seed=1):
    return torch.randint(0, VOCAB, tree.tokens.shape, generator=torch.Generator().manual_seed(seed))


def test_sibling_and_drawn_ranks():
    parents = torch.tensor([[-1, 0, 0, 1, 0, 1, 3]])
    assert sibling_ranks(parents).tolist() == [[0, 0, 1, 0, 2, 1, 0]]
    cdf = torch.tensor([[0.5, 0.8], [0.9, 0.9]])
    u = torch.tensor([[0.1, 0.95], [0.6, 0.3], [0.85, 0.9]])
    assert draw_ranks(u, cdf).tolist() == [[0, -1], [1, 0], [-1, -1]]


@pytest.mark.parametrize("budget", [4, 16])
def test_tokens_per_step_follow_the_model(budget):
    """The replayed tree commits what formula (2) predicts for the model's best tree."""
    model = TreeAcceptanceModel([[0.55, 0.2, 0.1], [0.7, 0.15], [0.75, 0.1, 0.05]])
    v = TreeReplayVerifier.from_model(model, seed=3)
    tree = _planned(v, budget)
    res = v.verify_tree_tokens(tree, _targets(tree), None, DEPTH)
    assert float(res.accepted.float().mean()) + 1 == pytest.approx(model.expected_tokens(budget, DEPTH), abs=0.06)


def test_picked_rank_frequencies_tell_models_apart():
    """At depth 1 the accepted child's rank among its siblings is drawn from p[1]: rank 1 of a
    uniform-over-ranks model is taken a third of the time, and never under a rank-0-only model."""
    freqs = {}
    for name, p in {"uniform": [[1 / 3, 1 / 3, 1 / 3]], "rank0": [[0.9]]}.items():
        v = TreeReplayVerifier(p, seed=5)
        tree = _planned(v, 8, depth=1)
        res = v.verify_tree_tokens(tree, _targets(tree), None, 1)
        first = res.path[:, 1]
        sib = sibling_ranks(tree.parents).gather(1, first.clamp(min=0)[:, None])[:, 0]
        freqs[name] = [float(((first >= 0) & (sib == r)).float().mean()) for r in range(3)]
    assert freqs["uniform"] == pytest.approx([1 / 3] * 3, abs=0.03)
    assert freqs["rank0"] == pytest.approx([0.9, 0.0, 0.0], abs=0.03)


def test_planning_logits_keep_the_drafters_rank_order():
    """The named ranks outrank every other token, even when the unnamed mass per token is larger
    than a named rank's probability, so a node's i-th child is the drafter's rank-i candidate."""
    v = TreeReplayVerifier([[0.1, 0.001, 0.0], [0.5, 0.2]])
    logits = torch.randn(3, 4, VOCAB, generator=torch.Generator().manual_seed(4))
    planned = v.plan_logits(logits)
    assert torch.equal(planned.topk(2, dim=-1).indices, logits.topk(2, dim=-1).indices)
    probs = planned.softmax(-1)
    assert probs[:, 1].amax(-1).tolist() == pytest.approx([0.5] * 3, abs=1e-4)  # depth 2: rank 0 keeps its 0.5


def test_paths_caps_and_committed_tokens():
    v = TreeReplayVerifier([[0.6, 0.3], [0.8, 0.15]], seed=7)
    tree = _planned(v, 12, rows=500)
    targets = _targets(tree)
    caps = torch.randint(0, DEPTH + 1, (500,), generator=torch.Generator().manual_seed(2))
    res = v.verify_tree_tokens(tree, targets, caps, DEPTH)
    assert (res.accepted <= caps).all() and (res.accepted >= 0).all()
    assert len(set(res.accepted.tolist())) > 2  # the draws are not degenerate
    for b in range(500):
        a, path = int(res.accepted[b]), res.path[b].tolist()
        assert path[0] == 0 and all(x == -1 for x in path[a + 1:]) and all(x >= 0 for x in path[: a + 1])
        for d in range(1, a + 1):  # a root path: each node's parent is the previous one, at depth d
            assert int(tree.parents[b, path[d]]) == path[d - 1] and int(tree.depths[b, path[d]]) == d
        committed = res.committed[b].tolist()
        assert committed[:a] == [int(tree.tokens[b, path[d]]) for d in range(1, a + 1)]
        assert committed[a] == int(targets[b, path[a]])  # the target's own token at the last node
    uncapped = TreeReplayVerifier([[0.6, 0.3], [0.8, 0.15]], seed=7).verify_tree_tokens(tree, targets, None, DEPTH)
    assert torch.equal(res.accepted, torch.minimum(uncapped.accepted, caps))


def test_chain_shaped_tree_agrees_with_the_chain_replay():
    alphas = [0.9, 0.7, 0.5, 0.8, 0.6]
    v = TreeReplayVerifier([[a] for a in alphas])
    tree = _planned(v, 16, topk=1)
    assert tree.num_nodes == DEPTH + 1  # one candidate per position: a chain
    # by construction: the same uniforms accept the same drafts
    u = torch.rand(ROWS, DEPTH, generator=torch.Generator().manual_seed(9))
    res = v.decide(tree, _targets(tree), u, None, DEPTH)
    chain = (u < torch.tensor(alphas)).long().cumprod(1).sum(1)
    assert torch.equal(res.accepted, chain)
    # and statistically, with each verifier's own draws
    tree_mean = float(v.verify_tree_tokens(tree, _targets(tree), None, DEPTH).accepted.float().mean())
    chain_mean = float(ReplayVerifier(alphas, seed=4).draw(ROWS, DEPTH, "cpu").float().mean())
    assert tree_mean == pytest.approx(chain_mean, abs=0.1)


def test_draws_are_seeded_and_reset_in_place():
    v = TreeReplayVerifier([[0.5, 0.3]], seed=11)
    a, b = v.uniforms(8, 4, "cpu"), v.uniforms(8, 4, "cpu")
    assert not torch.equal(a, b)  # the step counter advances
    counter = v._counters["cpu"]
    v.reset()
    assert v._counters["cpu"] is counter and torch.equal(v.uniforms(8, 4, "cpu"), a)
    v.reset(seed=12)
    assert not torch.equal(v.uniforms(8, 4, "cpu"), a)
    with pytest.raises(ValueError):
        TreeReplayVerifier([[0.7, 0.5]])


def test_draws_made_under_inference_mode_reset_outside_it():
    """A loop draws under inference mode; a benchmark resets (or re-seeds) the verifier outside
    it, in place: its counters and row seeds must be normal tensors."""
    v = TreeReplayVerifier([[0.5, 0.3]], seed=3)
    with torch.inference_mode():
        first = v.uniforms(4, 3, "cpu")
        v.uniforms(4, 3, "cpu")
    v.reset(seed=3)
    with torch.inference_mode():
        assert torch.equal(v.uniforms(4, 3, "cpu"), first)


def test_tree_replay_in_the_device_loop(checkpoints):
    """The drafter, the tree verify forward and the KV compaction run every step; only the
    decision (and the tree's shape) is replayed."""
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["dflash"], "dflash"), 3,
                        max_len=len(PROMPT) + 40, tree_budget=6)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, 3, eager.max_len, tree_budget=6)
    loop.use_verifiers(tree=TreeReplayVerifier([[1.0]]))
    res = loop.generate(PROMPT, 21, ())
    assert len(res.tokens) == 21 and res.stats.accepted_lengths == [4] * 5 and set(res.stats.tree_nodes) == {7}
    loop.use_verifiers(tree=TreeReplayVerifier([[0.0]]))
    res = loop.generate(PROMPT, 6, ())
    assert res.stats.accepted_lengths == [1] * 5 and res.stats.draft_forwards >= 4
    model = TreeAcceptanceModel([[0.5, 0.3, 0.1]])
    loop.use_verifiers(tree=TreeReplayVerifier.from_model(model, seed=1))
    lengths = []
    for seed in range(3):
        lengths += loop.generate(PROMPT[:4 + seed], 30, ()).stats.accepted_lengths[:-1]  # the last step is capped
    assert max(lengths) > 1 and sum(lengths) / len(lengths) == pytest.approx(model.expected_tokens(6, 3), abs=0.6)


def test_plan_and_decision_have_no_host_sync():
    """What the graphed plan and accept functions run traces as one graph (no host sync, no
    data-dependent Python), and the step counter still advances inside it."""
    v = TreeReplayVerifier([[0.5, 0.3], [0.6, 0.2]], seed=1)
    logits, root, base = torch.randn(2, 4, VOCAB), torch.zeros(2, dtype=torch.long), torch.full((2,), 5)
    targets, caps = torch.randint(0, VOCAB, (2, 9)), torch.tensor([4, 2])

    def step(logits, root, base, targets, caps):
        tokens, parents, depths, _, mask = v.plan(logits, root, base, 8)
        res = v.verify_tree_tokens(DraftTree.planned(tokens, parents, depths, mask), targets, caps, 4)
        return res.accepted, res.committed, res.path

    step(logits, root, base, targets, caps)  # the model's tables are built on the host first (a graph's warm-up)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    v.reset()
    eager = [step(logits, root, base, targets, caps) for _ in range(3)]
    v.reset()
    traced = [compiled(logits, root, base, targets, caps) for _ in range(3)]
    for e, t in zip(eager, traced):
        assert all(torch.equal(x, y) for x, y in zip(e, t))
    assert int(v._counters["cpu"]) == 3


def test_graphed_tree_accept_draws_once_a_step(checkpoints, monkeypatch):
    """On CUDA the tree step's accept function is a ``GraphedStep``. It advances the replay
    verifier's draw counter, so warm-up calls before its capture would skip draws and the graphed
    loop would replay another acceptance than the unfused one (found by the GPU test of whole
    step graphs). Here GraphedStep's protocol runs on the CPU (``cpu_graphs``, capture by a
    stand-in that undoes the counter, as a CUDA capture records without running; plan and commit
    run eagerly here): after N steps the counter reads N, and the accepted lengths equal the
    ungraphed loop's."""
    from cpu_graphs import CpuGraphedStep

    import specc.runtime.graphs as graphs

    class Captured(CpuGraphedStep):  # a capture records without running: no draw is spent there
        def _on_device(self, tensor) -> bool:  # the accept function only (plan / commit run eagerly)
            return getattr(self.step, "__name__", "") == "_accept_tree"

        def _capture(self, args, key):
            for _ in range(self.warmup):  # warm-ups run (and draw), as on a GPU
                self._run(*[a.clone() if torch.is_tensor(a) else a for a in args])
            warmup, self.warmup = self.warmup, 0
            before = {k: c.clone() for k, c in verifier_of[0]._counters.items()}
            entry = super()._capture(args, key)
            for k, c in verifier_of[0]._counters.items():
                c.copy_(before[k])
            self.warmup = warmup
            return entry

    verifier_of = []

    def run(graphed: bool):
        eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["dflash"], "dflash"), 3,
                            max_len=len(PROMPT) + 40, tree_budget=6)
        loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, 3, eager.max_len, tree_budget=6)
        verifier = TreeReplayVerifier([[0.6, 0.3], [0.7, 0.2]], seed=5)
        verifier_of[:] = [verifier]
        loop.use_verifiers(tree=verifier)
        if graphed:
            monkeypatch.setattr(graphs, "GraphedStep", Captured)
            loop.capture_shapes = True
        res = loop.generate(PROMPT, 30, ())
        monkeypatch.setattr(graphs, "GraphedStep", GraphedStepOriginal)
        return res.stats.accepted_lengths, verifier.step, len(res.stats.accepted_lengths)

    GraphedStepOriginal = graphs.GraphedStep
    got, count, steps = run(True)
    want, _, _ = run(False)
    assert count == steps and got == want and len(set(got)) > 1
