"""Deployments, the analytic cost model, calibration and the search driver.

    from specc.search import CostModel, AcceptanceModel, choose_pipeline, Search
    choice = choose_pipeline(resolve_pair(model, drafter), "h200-bs1")   # cheap: no compilation
    result = Search(model, drafter, deployment="h200-bs1").run(rounds=3)

docs/cost-model.md and docs/search.md have the long form. Heavy modules load lazily.
"""

from specc.search.deployments import BUILTIN, Deployment, deployment_names, get_deployment

_LAZY = {
    "AcceptanceModel": "specc.search.acceptance",
    "measure_stock": "specc.search.acceptance",
    "CostModel": "specc.search.cost_model",
    "GapReport": "specc.search.cost_model",
    "NodeCost": "specc.search.cost_model",
    "StepPrediction": "specc.search.cost_model",
    "SystemPrediction": "specc.search.cost_model",
    "register_launches": "specc.search.cost_model",
    "Calibration": "specc.search.calibrate",
    "calibrate": "specc.search.calibrate",
    "calibration_for": "specc.search.calibrate",
    "write_calibration": "specc.search.calibrate",
    "Memory": "specc.search.memory",
    "MemoryEntry": "specc.search.memory",
    "Candidate": "specc.search.proposers",
    "Proposer": "specc.search.proposers",
    "BuiltinProposer": "specc.search.proposers",
    "MemoryProposer": "specc.search.proposers",
    "LLMProposer": "specc.search.llm_proposer",
    "Choice": "specc.search.choose",
    "choose_pipeline": "specc.search.choose",
    "MetaPair": "specc.search.meta_pair",
    "Evaluated": "specc.search.evaluated",
    "Reporter": "specc.search.evaluated",
    "SearchError": "specc.search.evaluated",
    "SearchResult": "specc.search.evaluated",
    "Search": "specc.search.driver",
    "search": "specc.search.driver",
}

__all__ = ["BUILTIN", "Deployment", "deployment_names", "get_deployment", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specc.search' has no attribute {name!r}")
