"""The tree row of `specc bench`: an artifact compiled with a tree budget, or ``--tree N`` on a
checkpoint or named shapes.

One system holds both verify steps (chain and tree), so the bench times its chain (the
``specc-<method>`` row, the tree switched off) and its tree (``specc-<method>-tree<N>``) with the
same drafter, weights and prompts. With ``--acceptance`` both are replayed from one stated
model: the chain from its rank-0 column (``ReplayVerifier``), the tree from all its ranks
(``specc.runtime.tree_replay.TreeReplayVerifier``); without, the target decides both. Beside the
measured row: the cost model's tree prediction (``specc.search.tree_cost.predict_tree``) for the
stated model (real acceptance: the model `specc compile --tree auto` measured, kept in the
manifest, when there is one) and the tree's speedup over the chain, measured and predicted.
"""

from __future__ import annotations

from specc.search.tree_acceptance import TreeAcceptanceModel


def manifest_tree_model(manifest: dict) -> TreeAcceptanceModel | None:
    """The per-rank model `specc compile --tree auto` measured, or None."""
    data = (manifest.get("tree") or {}).get("acceptance")
    if not isinstance(data, dict):
        return None
    return TreeAcceptanceModel.from_json(data, source=data.get("source") or "measured at compile (manifest)")


def record_tree_row(record, loop, device, chain_name: str, setup, irs, cost, context: int,
                    stated: TreeAcceptanceModel | None, seed: int, chain_row: dict) -> dict:
    """Time ``loop`` in tree mode (its ``tree_budget``) through ``record`` (the bench's timer) and
    add the prediction and the comparison with ``chain_row``. ``stated``: the model to replay
    (None: real acceptance)."""
    from specc.bench.systems import LoopSystem
    from specc.runtime.tree_replay import TreeReplayVerifier
    from specc.runtime.verifiers import TreeVerifier
    from specc.search.tree_cost import predict_tree

    budget, k = int(loop.tree_budget), int(setup.k)
    name = f"{chain_name}-tree{budget}"
    replay = stated is not None
    loop.use_verifiers(tree=TreeReplayVerifier.from_model(stated, seed=seed) if replay else TreeVerifier())
    try:
        extra = {"num_draft": k, "tree_budget": budget, "replay": replay,
                 "acceptance": stated.source if replay else "real (the target decides)"}
        row = record(name, LoopSystem(loop, device, name), "specc", extra)
    finally:
        loop.use_verifiers(tree=TreeVerifier())
    model = stated if replay else (manifest_tree_model(setup.engine.manifest) if setup.engine is not None else None)
    if model is not None:
        pred = predict_tree(cost, irs[0], irs[1], setup.impl, model, k, budget, context=context, batch_size=1)
        row["prediction"] = {"tokens_per_s": pred.tokens_per_s, "step_s": pred.step_time,
                             "expected_tokens_per_step": pred.system.expected_tokens,
                             "tree_work_s": pred.build_s, "verify_rows_s": pred.rows_s,
                             "acceptance": model.source}
        if replay:
            row["acceptance_model"] = model.to_json()
            row["expected_tokens_per_step"] = model.expected_tokens(budget, k)
    versus = {"measured": row["tokens_per_s"] / chain_row["tokens_per_s"] if chain_row["tokens_per_s"] else None}
    chain_pred = (chain_row.get("prediction") or {}).get("tokens_per_s")
    if model is not None and chain_pred:
        versus["predicted"] = row["prediction"]["tokens_per_s"] / chain_pred
    row["tree_vs_chain"] = versus
    return row
