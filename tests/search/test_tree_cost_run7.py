"""The tree pricing against H200 run 7 (issue #17): Qwen3-8B + DFlash-b16 shapes, random weights,
acceptance replayed from the GSM8K and MT-Bench rank models, bs1, CUDA graphs.

- docs/benchmarks/tree-e2e-8b-events-h200-run7.json: chain and tree 31, device time per part from
  CUDA events (the cleanest step figures);
- docs/benchmarks/tree-e2e-8b-h200-run7.json: chain and trees of 15 / 31 / 63 nodes at both
  acceptances (8 prompts; this run's chain step was 0.4 ms slower than the events run's: noisier).

Every expected figure is read from those files; the tolerances are stated beside each check.
The predictions are made as ``examples/bench_tree.py --e2e-8b`` made them (the files' deployment,
pipeline and context), from meta-device IRs instead of the built ones (the same graphs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# measured before run 28 (residual-norm pairs, drafting ahead at batch): priced as they ran (tests/search/conftest.py)
pytestmark = pytest.mark.usefixtures("as_measured_before_run28")

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
EVENTS = json.loads((BENCH / "tree-e2e-8b-events-h200-run7.json").read_text())
RUN7 = json.loads((BENCH / "tree-e2e-8b-h200-run7.json").read_text())
RANKS = BENCH / "tiny-dflash-ranks.json"

# Tree step - chain step (ms): the events run within 0.1 ms (its decode-step and device-part
# differences were 0.80 / 0.73 ms; the model before the re-fit said 0.30), the 8-prompt run within
# 0.25 ms (at 31 nodes its differences were 0.14-0.16 ms above the events run's).
STEP_TOL_MS = {"events": 0.10, "run7": 0.25}
# Tree / chain speedup: within 0.05 of the measured ratio (the replayed tokens per step differ from
# the acceptance model's expectation by up to 4%: e.g. GSM8K tree 15 committed 4% more than the
# chain where the model expects the same), and on the same side of 1.
SPEEDUP_TOL = 0.05


def _spec(measured_spec: str) -> str:
    """The file's acceptance spec with the rank file of this checkout (the run recorded its path)."""
    chain, _, _ = measured_spec.partition("+ranks:")
    return f"{chain}+ranks:{RANKS}"


@pytest.fixture(scope="module")
def priced(meta8b):
    """Per (file, spec): the chain prediction and the tree predictions by budget, as bench_tree made them."""
    from specc.bench.acceptance import parse_tree_acceptance
    from specc.methods import get_method
    from specc.search.acceptance import AcceptanceModel
    from specc.search.cost_model import CostModel
    from specc.search.tree_cost import predict_tree

    out = {}
    for name, data in (("events", EVENTS), ("run7", RUN7)):
        t_ir, d_ir = meta8b.irs(data["pipeline"])
        cost, k, ctx = CostModel(data["deployment"]), data["num_draft"], data["context_for_prediction"]
        for run in data["runs"]:
            tree = parse_tree_acceptance(_spec(run["spec"]), k)
            chain_acc = AcceptanceModel([tree.prob(d, 0) for d in range(1, k + 1)], measured_k=k)
            chain = cost.predict(t_ir, d_ir, method="dflash", num_draft=k, acceptance=chain_acc, context=ctx,
                                 batch_size=1)
            trees = {r["budget"]: predict_tree(cost, t_ir, d_ir, get_method("dflash"), tree, k, r["budget"],
                                               context=ctx, batch_size=1)
                     for r in run["rows"] if r["budget"]}
            out[(name, run["spec"])] = (chain, trees, {r["system"]: r for r in run["rows"]})
    return out


def test_tree_minus_chain_step_matches_run7(priced):
    checked = 0
    for (name, spec), (chain, trees, rows) in priced.items():
        measured_chain = rows["chain"]["decode_step_ms"]
        for budget, pred in trees.items():
            measured = rows[f"tree {budget}"]["decode_step_ms"] - measured_chain
            predicted = (pred.step_time - chain.step_time) * 1e3
            assert abs(predicted - measured) <= STEP_TOL_MS[name], (name, spec, budget, predicted, measured)
            checked += 1
    assert checked == 7  # events: tree 31; run 7: 15 / 31 / 63 at two acceptances
    # the events run's device parts: every part the tree adds, without the host's share
    (chain, trees, rows), = [v for (name, _), v in priced.items() if name == "events"]
    parts = {s: sum(rows[s]["profile"]["device_part_ms_per_step"].values()) for s in ("chain", "tree 31")}
    predicted = (trees[31].step_time - chain.step_time) * 1e3
    assert abs(predicted - (parts["tree 31"] - parts["chain"])) <= STEP_TOL_MS["events"]


def test_tree_speedups_match_run7(priced):
    for (name, spec), (chain, trees, rows) in priced.items():
        for budget, pred in trees.items():
            measured = rows[f"tree {budget}"]["speedup_vs_chain"]["measured"]
            predicted = pred.tokens_per_s / chain.tokens_per_s
            assert abs(predicted - measured) <= SPEEDUP_TOL, (name, spec, budget, predicted, measured)
            assert (predicted > 1) == (measured > 1), (name, spec, budget, predicted, measured)


@pytest.mark.parametrize("dataset", ["gsm8k", "mt-bench"])
def test_tree_auto_picks_what_run7_measured_fastest(meta8b, dataset):
    """`--tree auto` at h200-bs1 (compile's default context): the chain at GSM8K acceptance, a tree at
    MT-Bench's, as run 7 measured (its best tree / chain ratio read from the file)."""
    import types

    from specc.bench.acceptance import parse_tree_acceptance
    from specc.methods import get_method
    from specc.search.tree_cost import tree_choice

    run = next(r for r in RUN7["runs"] if r["spec"].split(":")[1].split("+")[0] == dataset)
    best = max(run["rows"], key=lambda r: r["speedup_vs_chain"]["measured"])
    k = RUN7["num_draft"]
    tree = parse_tree_acceptance(_spec(run["spec"]), k)
    pair = types.SimpleNamespace(method="dflash", impl=get_method("dflash"))
    choice = tree_choice(pair, RUN7["deployment"], RUN7["pipeline"], k, tree, irs=meta8b.irs(RUN7["pipeline"]))
    assert (choice["budget"] > 0) == (best["budget"] > 0), (choice, best["system"])


def test_row_growth_is_priced_only_where_measured(meta8b):
    """The verify's measured growth with rows applies at bs1 on the H200 (``VERIFY_ROW_GROWTH``);
    a tree step is the chain system at budget + 1 rows + the tree work + the mask + that growth."""
    from specc.methods import get_method
    from specc.search.cost_model import CostModel
    from specc.search.tree_acceptance import TreeAcceptanceModel
    from specc.search.tree_cost import VERIFY_ROW_GROWTH, predict_tree

    t_ir, d_ir = meta8b.irs(RUN7["pipeline"])
    tree = TreeAcceptanceModel([[0.8, 0.1], [0.7, 0.15]])
    at = {dep: predict_tree(CostModel(dep), t_ir, d_ir, get_method("dflash"), tree, 15, 63, context=256)
          for dep in ("h200-bs1", "h200-bs16", "h100-bs1")}
    assert ("NVIDIA H200", 1) in VERIFY_ROW_GROWTH and at["h200-bs1"].rows_s > 0
    assert at["h200-bs16"].rows_s == 0 and at["h100-bs1"].rows_s == 0
    for pred in at.values():
        assert abs(pred.step_time - (pred.system.step_time + pred.build_s + pred.rows_s)) < 1e-12
