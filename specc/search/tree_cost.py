"""Pricing tree verification and choosing its node budget per deployment.

A tree step makes the same drafter forward as a chain step with ``depth`` drafts (one block
forward gives every position's distribution), builds the tree on the device (a few small top-k
launches, priced as launches), and runs one target verify over ``budget + 1`` query rows (the
root and the drafted nodes) with the ancestor-only mask, which costs what a causal verify of
the same row count costs. The tree commits ``TreeAcceptanceModel.expected_tokens(budget, depth)``
tokens on average (formula (2) of ``tree_acceptance.py``). At bs1 on an HBM GPU a verify of 16
or 64 rows costs about one AR step, so wide trees are nearly free; with batching verification
turns compute-bound and the best budget shrinks: the cost model finds where, per deployment.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from specc.search.cost_model import DEFAULT_CONTEXT, CostModel, SystemPrediction
from specc.search.tree_acceptance import TreeAcceptanceModel

BUDGETS = (8, 16, 32, 64, 128)
# Launches of the on-device tree construction (log-softmax, top-k per position, the beam's
# top-k per depth, the final top-k and gathers): priced as fixed launch overhead per depth.
TREE_BUILD_LAUNCHES_PER_DEPTH = 3


@dataclasses.dataclass
class TreePrediction:
    """A tree system: the SystemPrediction at the tree's verify size plus the tree's facts."""

    budget: int
    depth: int
    system: SystemPrediction
    build_s: float

    @property
    def step_time(self) -> float:
        return self.system.step_time + self.build_s

    @property
    def tokens_per_s(self) -> float:
        return self.system.batch_size * self.system.expected_tokens / self.step_time

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.system.ar_tokens_per_s

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "depth": self.depth, "expected_tokens": self.system.expected_tokens,
                "step_s": self.step_time, "tokens_per_s": self.tokens_per_s, "speedup": self.speedup,
                "verify_rows": self.budget + 1}


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
    build_s = TREE_BUILD_LAUNCHES_PER_DEPTH * depth * model.overhead
    return TreePrediction(budget, depth, system, build_s)


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
