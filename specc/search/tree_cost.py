"""Pricing tree verification and choosing its node budget per deployment.

A tree step makes the same drafter forward as a chain step with ``depth`` drafts (one block
forward gives every position's distribution), builds the tree on the device, runs one target verify
over ``budget + 1`` query rows (the root and the drafted nodes) with the ancestor-only mask, accepts
on the device and compacts the accepted path's K/V. The tree commits
``TreeAcceptanceModel.expected_tokens(budget, depth)`` tokens on average (formula (2) of
``tree_acceptance.py``). At bs1 on an HBM GPU a verify of 16 or 64 rows costs about one AR step, so
wide trees are nearly free in the linears; with batching verification turns compute-bound and the
best budget shrinks: the cost model finds where, per deployment.

Three costs that the chain's pricing of a causal verify of the same size does not have, measured
on the H200 (Qwen3-8B + DFlash-b16 shapes, bs1, CUDA graphs; H200 run 7, docs/benchmarks/h200-run7.md):

- the on-device tree work (plan: log-softmax, top-k, the one-launch beam, bookkeeping, ancestor
  mask; acceptance; KV compaction; each a CUDA graph) beyond the chain's acceptance, priced as
  ``TREE_STEP_LAUNCHES + TREE_LAUNCHES_PER_NODE * budget`` launch overheads of the deployment:
  0.555 ms at 31 nodes (docs/benchmarks/tree-e2e-8b-events-h200-run7.json: device time per part
  from CUDA events, plan + accept + commit - the chain's accept = 0.487 ms, plus 0.068 ms more
  between the decode steps' difference and the parts' sums), growing ~2 us per node (kernel time
  of the tree steps less the chain's and less the verify's growth, 15 / 31 / 63 nodes at GSM8K and
  MT-Bench acceptance, docs/benchmarks/tree-e2e-8b-h200-run7.json ``kernels``). Most of it is
  kernel time, not launch gaps: on a GPU other than the H200 the launch-overhead scaling is a lead;
- the tree-masked verify forward: 1.008x a causal verify of the same rows at 16 rows, 1.009x at
  32, 1.023x at 64 with the mask passed as packed bit words (``codegen/kernels/tree_mask.py``;
  device kernel time per call, docs/benchmarks/tree-loop-h200-run7.json ``alone`` / ``chain``;
  ``TREE_VERIFY_FACTOR``, interpolated in the row count); 128 rows keep the byte mask's 1.088x
  from run 3 of docs/benchmarks/tree-steps-h200.md (not re-measured with words: an upper bound);
- the verify's growth with its rows, where measured (``VERIFY_ROW_GROWTH``, per GPU at bs1): a
  causal Qwen3-8B verify at 32 / 64 rows took 1.042x / 1.126x its time at 16 rows (the same file),
  where the roofline of the uncalibrated deployment prices 1.010x / 1.030x. The tree's verify is
  priced at least at the chain verify's predicted time scaled by that measured growth, so a model
  that already prices the growth (or the row tiles past 64 rows) adds nothing. Measured at
  Qwen3-8B shapes: for other targets on the same GPU it is a lead.

Before this re-fit the tree work was 0.23 ms and the row growth unpriced, so trees were predicted
at 0.965-1.186x the chain where run 7 measured 0.917-1.041x (tests/search/test_tree_cost_run7.py
checks the re-priced figures against run 7: docs/trees.md has the table).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from specc.search.cost_model import DEFAULT_CONTEXT, CostModel, SystemPrediction
from specc.search.tree_acceptance import TreeAcceptanceModel

# Node budgets priced by default: N drafted nodes verify N + 1 rows, and N = 2^k - 1 keeps the
# rows on the linears' row-tile edges (8 .. 128). One row past an edge costs the next tile: on the
# H200 (Qwen3-8B shapes, docs/benchmarks/h200-run6.md) a 65-row verify's linears took 11.65 ms
# against 5.82 at 64 rows, and 33 rows 6.13 against 5.18 at 32. The cost model prices the tiles
# (``CostModel.weight_passes``: the weight read once per row tile), so a budget given by hand
# (``--tree 64``) is priced at its real cost and ``choose_budget`` prefers 63 to 64; the 32 -> 33
# step (a wider single tile, another config) is not priced.
BUDGETS = (7, 15, 31, 63, 127)
# The tree step's on-device work beyond the chain's acceptance, in launch overheads of the deployment
# (H200 graph node: 1.5 us): 0.555 ms at 31 nodes (decode-step difference tree 31 - chain less the
# verify parts' difference, docs/benchmarks/tree-e2e-8b-events-h200-run7.json) and 1.99 us per node
# (kernel time per step, tree 15 / 31 / 63 - chain, less the verify's growth, both acceptances of
# docs/benchmarks/tree-e2e-8b-h200-run7.json): 0.523 ms at 15 nodes, 0.619 at 63.
TREE_STEP_LAUNCHES = 329
TREE_LAUNCHES_PER_NODE = 1.33
# Tree-masked verify / causal verify at the same query rows (H200, Qwen3-8B shapes, bit-word mask;
# 16-64 rows: device kernel time per call, docs/benchmarks/tree-loop-h200-run7.json; 128: run 3).
TREE_VERIFY_FACTOR = ((16, 1.008), (32, 1.009), (64, 1.023), (128, 1.088))
# Causal verify time at R rows / at 16 rows, measured per (GPU, batch size): device kernel time per
# call of the compiled Qwen3-8B verify step, context 133 (docs/benchmarks/tree-loop-h200-run7.json,
# ``chain``: 4.631 ms at 16 rows, 4.827 at 32, 5.216 at 64). Constant past the ends; deployments
# without an entry keep the cost model's own row pricing.
VERIFY_ROW_GROWTH = {("NVIDIA H200", 1): ((16, 1.0), (32, 1.042), (64, 1.126))}


def _interpolate(points, rows: float) -> float:
    """``points`` ((rows, value), ...) interpolated linearly in the row count (constant past its ends)."""
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, f0), (r1, f1) in zip(points, points[1:]):
        if rows <= r1:
            return f0 + (f1 - f0) * (rows - r0) / (r1 - r0)
    return points[-1][1]


def tree_verify_factor(rows: int) -> float:
    """``TREE_VERIFY_FACTOR`` interpolated linearly in the row count (constant past its ends)."""
    return _interpolate(TREE_VERIFY_FACTOR, rows)


def verify_row_growth(deployment, batch_size: int):
    """The measured ``VERIFY_ROW_GROWTH`` table of ``deployment`` at ``batch_size``, or None."""
    return VERIFY_ROW_GROWTH.get((deployment.gpu, int(batch_size)))


def tree_work_seconds(model: CostModel, budget: int) -> float:
    """The on-device tree work of a ``budget``-node step beyond the chain's acceptance (module doc)."""
    return (TREE_STEP_LAUNCHES + TREE_LAUNCHES_PER_NODE * budget) * model.overhead


@dataclasses.dataclass
class TreePrediction:
    """A tree system: the SystemPrediction at the tree's verify size plus the tree's facts."""

    budget: int
    depth: int
    system: SystemPrediction
    build_s: float  # what the tree adds to the step: on-device tree work + the mask's extra verify time
    # the verify's measured growth from the chain's rows to the tree's beyond the model's (VERIFY_ROW_GROWTH)
    rows_s: float = 0.0

    @property
    def step_time(self) -> float:
        return self.system.step_time + self.build_s + self.rows_s

    @property
    def tokens_per_s(self) -> float:
        return self.system.batch_size * self.system.expected_tokens / self.step_time

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.system.ar_tokens_per_s

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "depth": self.depth, "expected_tokens": self.system.expected_tokens,
                "step_s": self.step_time, "tokens_per_s": self.tokens_per_s, "speedup": self.speedup,
                "verify_rows": self.budget + 1, "tree_work_s": self.build_s, "verify_rows_s": self.rows_s}


def predict_tree(model: CostModel, target_ir, draft_ir, method, tree: TreeAcceptanceModel, depth: int, budget: int,
                 *, context: int | None = None, batch_size: int | None = None) -> TreePrediction:
    """Price one tree configuration. ``method``: a ``specc.methods.Method`` (its draft shapes)."""
    dep = model.deployment
    b = int(batch_size or dep.batch_size)
    c = int(context if context is not None else min(max(DEFAULT_CONTEXT, dep.context_min), dep.context_max))
    ar = model.step(target_ir, {"B": b, "Q": 1, "C": c}, step="ar")
    expected = tree.expected_tokens(budget, depth)
    verify = model.step(target_ir, {"B": b, "Q": budget + 1, "C": c}, step="verify")
    committed = max(1, int(round(expected)))
    drafts = [(model.step(draft_ir, {"B": b, "C": c, **shape.values}, step="draft", role="drafter"), shape.count)
              for shape in method.draft_shapes(depth, committed)]
    system = SystemPrediction(method.name, depth, dep.name, b, c, ar, verify, drafts, expected, tree)
    mask_s = (tree_verify_factor(budget + 1) - 1.0) * verify.time
    rows_s = 0.0
    growth = verify_row_growth(dep, b)
    if growth is not None:  # at least the chain verify scaled by the measured growth with rows
        chain_verify = model.step(target_ir, {"B": b, "Q": depth + 1, "C": c}, step="verify")
        measured = chain_verify.time * _interpolate(growth, budget + 1) / _interpolate(growth, depth + 1)
        rows_s = max(0.0, measured - verify.time)
    return TreePrediction(budget, depth, system, tree_work_seconds(model, budget) + mask_s, rows_s)


def choose_budget(model: CostModel, target_ir, draft_ir, method, tree: TreeAcceptanceModel, depth: int,
                  chain: SystemPrediction, budgets: Iterable[int] = BUDGETS, **kwargs) -> tuple[int, list[dict]]:
    """The node budget with the best predicted tokens/s, or 0 when the chain (``chain``, the
    same method's chain prediction) is at least as fast. Returns (budget, table rows)."""
    rows = [{"budget": 0, "depth": chain.num_draft, "expected_tokens": chain.expected_tokens,
             "step_s": chain.step_time, "tokens_per_s": chain.tokens_per_s, "speedup": chain.speedup,
             "verify_rows": chain.num_draft + 1}]
    best, best_tps = 0, chain.tokens_per_s
    for budget in budgets:
        pred = predict_tree(model, target_ir, draft_ir, method, tree, depth, budget, **kwargs)
        rows.append(pred.to_json())
        if pred.tokens_per_s > best_tps * (1 + 1e-9):
            best, best_tps = budget, pred.tokens_per_s
    return best, rows


def tree_choice(pair, deployment, pipeline: str, depth: int, tree: TreeAcceptanceModel,
                budgets: Iterable[int] = BUDGETS, budget: int | None = None, context: int | None = None,
                irs=None) -> dict:
    """Price the chain and tree budgets for ``pair`` (a ``specc.pairing.Pair`` or anything with
    ``target.raw`` / ``drafter.raw`` / ``method``) on ``deployment`` from meta-device IRs, with the
    same tree acceptance model for both (the chain: rank 0 only). ``budget``: price that one
    budget and keep it (``--tree N``); None: choose (0 = the chain). Returns {"budget", "depth",
    "acceptance_source", "candidates": rows}. ``irs``: (target verify IR, draft IR) to price
    instead of tracing ``pipeline`` on the meta device (what `specc compile` built)."""
    from specc.search.acceptance import AcceptanceModel
    from specc.search.deployments import get_deployment
    from specc.search.meta_pair import MetaPair

    dep = get_deployment(deployment) if isinstance(deployment, str) else deployment
    if irs is not None:
        t_ir, d_ir = irs
    else:
        metas = MetaPair(pair.target.raw, pair.drafter.raw if pair.drafter else None, pair.method, dep.dtype)
        t_ir, d_ir = metas.irs(pipeline)
    model = CostModel(dep)
    chain_acc = AcceptanceModel([tree.prob(d, 0) for d in range(1, depth + 1)], source=tree.source)
    chain = model.predict(t_ir, d_ir, method=pair.method, num_draft=depth, acceptance=chain_acc, context=context)
    method = pair.impl
    chosen, rows = choose_budget(model, t_ir, d_ir, method, tree, depth, chain,
                                 budgets=(budget,) if budget else budgets, context=context)
    return {"budget": int(budget if budget else chosen), "depth": int(depth), "acceptance_source": tree.source,
            "deployment": dep.name, "candidates": rows}
