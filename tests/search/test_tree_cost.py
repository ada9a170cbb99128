"""Tree budgets priced with the linears' row tiles: N + 1 rows one past a tile edge cost a tile."""

from __future__ import annotations

import pytest

from specc.search.tree_acceptance import TreeAcceptanceModel


@pytest.fixture(scope="module")
def dflash8b():
    """(target verify IR, DFlash draft IR, method) of Qwen3-8B + DFlash-b16 on the meta device."""
    from real_configs import QWEN3_8B, QWEN3_8B_DFLASH

    from specc.ir import trace
    from specc.methods import get_method

    loaded = get_method("dflash").load_meta(QWEN3_8B, QWEN3_8B_DFLASH)
    return trace(loaded.target, "verify"), trace(loaded.draft, "draft"), get_method("dflash")


# ranks past 0 carry mass deep into the tree: 64 nodes commit a little more than 63
RICH = TreeAcceptanceModel([[0.8, 0.1, 0.05, 0.03]] * 4 + [[0.7, 0.15, 0.05, 0.03]] * 11)


@pytest.mark.parametrize("deployment", ["h200-bs1", "h100-bs1"])
def test_choose_budget_takes_63_nodes_over_64_with_triton_linears(dflash8b, deployment):
    from specc.search.acceptance import AcceptanceModel
    from specc.search.cost_model import CostModel
    from specc.search.tree_cost import choose_budget, predict_tree

    t_ir, d_ir, method = dflash8b
    ruled = CostModel(deployment)  # the GPU's stated rule lowers 65+ rows to cuBLAS: one weight pass
    r63, r64 = (predict_tree(ruled, t_ir, d_ir, method, RICH, 15, b) for b in (63, 64))
    assert r64.system.verify.time < 1.2 * r63.system.verify.time
    model = CostModel(deployment)
    model.linear_choice = None  # Triton linears everywhere: their 64-row tiles read the weight twice at 65
    chain = model.predict(t_ir, d_ir, method="dflash", num_draft=15, acceptance=AcceptanceModel([0.8, 0.7]))
    at63, at64 = (predict_tree(model, t_ir, d_ir, method, RICH, 15, b) for b in (63, 64))
    assert at64.system.expected_tokens > at63.system.expected_tokens  # 64 commits more...
    assert at64.system.verify.time > 1.5 * at63.system.verify.time  # ...but verifies two row tiles
    for budgets in ((63, 64), (64, 63), (31, 32, 63, 64, 65)):
        best, rows = choose_budget(model, t_ir, d_ir, method, RICH, 15, chain, budgets=budgets)
        assert best not in (64, 65), (budgets, rows)
        tps = {r["budget"]: r["tokens_per_s"] for r in rows}
        assert tps[63] > tps[64]
