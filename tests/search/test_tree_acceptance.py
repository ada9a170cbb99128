"""The tree acceptance model: formula (2), the best tree under a budget, and its sources."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from specc.errors import UserError
from specc.runtime.trees import build_tree
from specc.search.acceptance import AcceptanceModel
from specc.search.tree_acceptance import TreeAcceptanceModel

P = [[0.6, 0.2, 0.1], [0.5, 0.25, 0.05], [0.4, 0.3, 0.1]]


def all_paths(p, max_depth):
    out = []
    for d in range(1, max_depth + 1):
        for ranks in itertools.product(range(len(p[0])), repeat=d):
            out.append((ranks, math.prod(p[min(i, len(p) - 1)][r] for i, r in enumerate(ranks))))
    return out


@pytest.mark.parametrize("budget", [1, 2, 5, 10, 20, 39])
def test_best_tree_is_the_top_paths(budget):
    model = TreeAcceptanceModel(P)
    tree = model.best_tree(budget, 3)
    want = sorted((prob for _, prob in all_paths(P, 3)), reverse=True)[:budget]
    assert [round(x, 12) for x in sorted((t[2] for t in tree), reverse=True)] == [round(x, 12) for x in want]
    assert model.expected_tokens(budget, 3) == pytest.approx(1 + sum(want))
    for i, (parent, ranks, _) in enumerate(tree):
        assert parent < i
        assert (parent == -1) == (len(ranks) == 1)
        if parent >= 0:
            assert tree[parent][1] == ranks[:-1]


def test_chain_model_reduces_to_formula_1():
    chain = AcceptanceModel([0.8, 0.6, 0.5, 0.4])
    tree = TreeAcceptanceModel.from_chain(chain, 4)
    assert tree.expected_tokens(4, 4) == pytest.approx(chain.expected_tokens(4))
    assert tree.expected_tokens(64, 4) == pytest.approx(chain.expected_tokens(4))  # ranks > 0 add nothing
    assert "never measured" in tree.source


def test_same_shape_as_the_runtime_builder():
    """The cost model's static tree and the runtime's tree from the same log-probabilities agree."""
    model = TreeAcceptanceModel(P)
    logp = torch.tensor(P).log()[None]
    built = build_tree(logp, torch.tensor([0]), 12, topk=3)
    ranks_of = {}
    sorted_tok = torch.tensor(P).argsort(dim=-1, descending=True)
    for i in range(1, built.num_nodes):
        path, node = [], i
        while node > 0:
            d = int(built.depths[0, node]) - 1
            path.append(int((sorted_tok[d] == built.tokens[0, node]).nonzero()))
            node = int(built.parents[0, node])
        ranks_of[tuple(reversed(path))] = True
    assert set(ranks_of) == {ranks for _, ranks, _ in model.best_tree(12, 3)}


def test_from_rank_counts_and_json_roundtrip(tmp_path):
    model = TreeAcceptanceModel.from_rank_counts([[60, 20, 20], [30, 10, 20], [0, 0, 0]], source="measured")
    assert model.p == [[0.6, 0.2], [0.5, 1 / 6]]
    assert model.reached == [100, 60]
    path = tmp_path / "tree.json"
    path.write_text(__import__("json").dumps(model.to_json()))
    again = TreeAcceptanceModel.from_file(path)
    assert again.p == model.p


def test_bad_rows_are_user_errors(tmp_path):
    with pytest.raises(UserError):
        TreeAcceptanceModel([[0.7, 0.5]])
    with pytest.raises(UserError):
        TreeAcceptanceModel.from_json({"alphas": [0.5]})
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        TreeAcceptanceModel.from_file(bad)


def test_measure_rank_acceptance_on_tiny_pairs(checkpoints):
    from specc.pairing import resolve_pair
    from specc.search.measure_tree import measure_rank_acceptance

    prompts = [[5, 9, 13, 2, 7], [11, 4, 4, 8]]
    # PARD drafter with the target's own weights: its first draft reads exactly the target's
    # next-token logits, so depth 1 is always rank 0.
    same = resolve_pair(str(checkpoints["target"]), str(checkpoints["pard_same"]), "pard")
    model = measure_rank_acceptance(same, prompts, 12, depth=4, ranks=4)
    assert model.p[0][0] == 1.0 and model.reached[0] > 0
    assert model.expected_tokens(1, 4) == pytest.approx(2.0)
    # a constant drafter never proposes the target's tokens at rank 0
    const = resolve_pair(str(checkpoints["target"]), str(checkpoints["const_pard"]), "pard")
    model = measure_rank_acceptance(const, prompts, 12, depth=4, ranks=4)
    assert model.p[0][0] < 0.5
    # DFlash: counts are consistent (each reached depth's hits + misses = samples reaching it)
    dflash = resolve_pair(str(checkpoints["target"]), str(checkpoints["dflash"]))
    model = measure_rank_acceptance(dflash, prompts, 12, depth=3, ranks=4)
    assert sum(model.counts[0]) == model.reached[0] > 0
    for d in range(1, len(model.counts)):
        assert model.reached[d] <= sum(model.counts[d - 1][:-1])


def test_tree_cost_prefers_trees_at_bs1_on_a_gpu_deployment():
    """Qwen3-8B + DFlash-b16 shapes on h200-bs1: verifying 33 rows costs about one AR step, so
    with a model whose ranks > 0 carry mass the chosen budget is a tree; with the chain-only
    model (ranks never measured) it stays a chain."""
    from specc.methods import get_method
    from specc.search.acceptance import AcceptanceModel
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment
    from specc.search.tree_cost import choose_budget, predict_tree
    from real_configs import QWEN3_8B, QWEN3_8B_DFLASH
    from specc.ir import trace

    loaded = get_method("dflash").load_meta(QWEN3_8B, QWEN3_8B_DFLASH)
    t_ir, d_ir = trace(loaded.target, "verify"), trace(loaded.draft, "draft")
    model = CostModel(get_deployment("h200-bs1"))
    method = get_method("dflash")
    chain_acc = AcceptanceModel([0.8, 0.7, 0.6, 0.5])
    chain = model.predict(t_ir, d_ir, method="dflash", num_draft=15, acceptance=chain_acc)
    rich = TreeAcceptanceModel([[0.8, 0.1, 0.05], [0.7, 0.15, 0.05], [0.6, 0.2, 0.05], [0.5, 0.2, 0.1]])
    budget, rows = choose_budget(model, t_ir, d_ir, method, rich, 15, chain)
    assert budget > 0 and rows[0]["budget"] == 0 and len(rows) == 6
    poor = TreeAcceptanceModel.from_chain(chain_acc, 15)
    assert choose_budget(model, t_ir, d_ir, method, poor, 15, chain)[0] == 0
    pred = predict_tree(model, t_ir, d_ir, method, rich, 15, 32)
    assert pred.system.verify.values["Q"] == 33 and pred.step_time > pred.system.step_time


def test_tree_verify_factor_interpolates_the_measured_points():
    from specc.search.tree_cost import TREE_VERIFY_FACTOR, tree_verify_factor

    (r0, f0), (r1, f1) = TREE_VERIFY_FACTOR[0], TREE_VERIFY_FACTOR[1]
    assert tree_verify_factor(1) == f0 and tree_verify_factor(r0) == f0
    assert abs(tree_verify_factor((r0 + r1) // 2) - (f0 + f1) / 2) < 1e-9
    assert tree_verify_factor(10 ** 6) == TREE_VERIFY_FACTOR[-1][1]
    assert all(tree_verify_factor(r) >= 1.0 for r in range(1, 300))


def test_tree_step_prices_the_work_and_the_mask_on_top_of_the_causal_verify():
    """build_s = launches of the tree work + (factor - 1) x the verify step: grows with the budget."""
    from specc.methods import get_method
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment
    from specc.search.tree_cost import TREE_LAUNCHES_PER_NODE, TREE_STEP_LAUNCHES, predict_tree, tree_verify_factor
    from real_configs import QWEN3_8B, QWEN3_8B_DFLASH
    from specc.ir import trace

    loaded = get_method("dflash").load_meta(QWEN3_8B, QWEN3_8B_DFLASH)
    t_ir, d_ir = trace(loaded.target, "verify"), trace(loaded.draft, "draft")
    model = CostModel(get_deployment("h200-bs1"))
    tree = TreeAcceptanceModel([[0.8, 0.1], [0.7, 0.15]])
    small, big = (predict_tree(model, t_ir, d_ir, get_method("dflash"), tree, 15, b) for b in (16, 128))
    for pred, b in ((small, 16), (big, 128)):
        want = (TREE_STEP_LAUNCHES + TREE_LAUNCHES_PER_NODE * b) * model.overhead \
            + (tree_verify_factor(b + 1) - 1) * pred.system.verify.time
        assert abs(pred.build_s - want) < 1e-12
    assert big.build_s > small.build_s > 0
