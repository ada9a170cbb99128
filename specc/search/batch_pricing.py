"""The batch's step-time curves from the cost model, for the runtime's goodput rule and the
batching choice: T(B, k) of a dense step, and the time of a ragged (packed) verify step.

``specc.runtime.adaptive.GoodputDraftLength`` picks each step's drafts from the requests'
measured acceptance and a step-time function; the runtime cannot import the cost model (it sits
below the search layer), so this module builds those functions here:

- :func:`step_seconds`: one step with k drafts per row over B rows = the method's drafter
  forwards + the target's verify forward of k + 1 tokens per row, ``CostModel.predict`` at a
  context length. The drafter shapes are priced as after a step that committed one token (the
  cost of drafting barely depends on it; the acceptance itself comes from measurement).
- :func:`ragged_verify`: one packed verify forward of T tokens over R rows, each row with its
  own token count and cache length (``ops.ragged_attention``, no padding). Every node but
  attention works on the packed tokens, so it is priced at M = T rows (B = 1, Q = T); attention
  reads each row's own cache, so each row (grouped by equal (tokens, cache length)) is priced at
  its sizes and the bytes, FLOPs and memory / compute times are summed, with the launches and
  the calibrated latency of one kernel call. Rows of equal sizes cost what the dense step of
  the same B and Q costs: the packing saves exactly the tokens a dense block would pad. A
  CUDA-graphed packed step pads its token count to a bucket (``bucket=True``): priced with them.
- :func:`ragged_step_seconds`: ``seconds(rows, tokens)``, the ``ragged_seconds`` of
  ``GoodputDraftLength``: the drafter's batched forward over the rows (dense: drafters have no
  ragged step and draft the longest row's k for every row) + the ragged verify, with the tokens
  spread as evenly as they go over the rows (so the longest row drafts ceil(tokens / rows) - 1;
  exact for one k per row, a lower bound on drafting when the rows' k differ more).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Sequence

from specc.search.cost_model import CostModel, StepPrediction, efficiency_class


def step_seconds(cost, target_ir, draft_ir, method: str, context: int) -> Callable[[int, int], float]:
    """``seconds(rows, k)``: the cost model's time of one speculative step (k = 0: an AR step)."""
    cache: dict[tuple[int, int], float] = {}

    def seconds(rows: int, k: int) -> float:
        key = (int(rows), int(k))
        if key not in cache:
            pred = cost.predict(target_ir, draft_ir if k > 0 else None, method=method if k > 0 else "ar",
                                num_draft=int(k), context=context, batch_size=int(rows))
            cache[key] = pred.step_time
        return cache[key]

    return seconds


def _sum_parts(parts, dep):
    """One attention kernel call over several row groups: sizes and times add, launches once."""
    first = parts[0]
    nbytes, flops = sum(p.bytes for p in parts), sum(p.flops for p in parts)
    return dataclasses.replace(
        first, bytes=nbytes, flops=flops, weight_bytes=sum(p.weight_bytes for p in parts),
        cache_bytes=sum(p.cache_bytes for p in parts), t_memory=sum(p.t_memory for p in parts),
        t_compute=sum(p.t_compute for p in parts), floor=max(nbytes / dep.hbm_bandwidth, flops / dep.bf16_flops))


def ragged_verify(cost: CostModel, target_ir, row_tokens: Sequence[int], row_context: Sequence[int] | int,
                  *, sync: bool = True, bucket: bool = False) -> StepPrediction:
    """The cost model's prediction of one packed verify forward: row r verifies ``row_tokens[r]``
    tokens (0: the row takes no part) over a cache of ``row_context[r]`` tokens (one int: every
    row's). Raises ValueError when no row has a token.

    ``bucket``: the forward runs as a CUDA-graphed ragged step does, its token count padded up to
    ``specc.runtime.ragged.token_bucket`` with tokens that extend the last row with a token
    (``PackedRows.of(..., bucket=True)``): those tokens are real work in every node, so a packed
    verify of 320 tokens costs one of 384."""
    tokens = [int(q) for q in row_tokens]
    contexts = [int(row_context)] * len(tokens) if isinstance(row_context, int) else [int(c) for c in row_context]
    if len(contexts) != len(tokens):
        raise ValueError(f"{len(tokens)} rows of tokens but {len(contexts)} cache lengths")
    if any(q < 0 for q in tokens) or any(c < 0 for c in contexts):
        raise ValueError("token counts and cache lengths must be >= 0")
    real = sum(tokens)
    if bucket and real:
        from specc.runtime.ragged import token_bucket

        last = max(i for i, q in enumerate(tokens) if q > 0)
        tokens[last] += token_bucket(real) - real
    groups = Counter((q, c) for q, c in zip(tokens, contexts) if q > 0)
    total = sum(q * n for (q, _), n in groups.items())
    if not total:
        raise ValueError("a ragged verify needs at least one token")
    c_max = max(c for (_, c) in groups)
    symbols = {str(s) for s in target_ir.symbols}

    def values(b, q, c):
        return {k: v for k, v in {"B": b, "Q": q, "C": c}.items() if k in symbols}

    packed = values(1, total, c_max)
    nodes = []
    for node in target_ir.graph.nodes:
        if efficiency_class(target_ir.meta(node)) == "attention":
            parts = [p for p in (cost.node_cost(target_ir, node, values(n, q, c)) for (q, c), n in groups.items())
                     if p is not None]
            if parts:
                nodes.append(_sum_parts(parts, cost.deployment))
        else:
            c = cost.node_cost(target_ir, node, packed)
            if c is not None:
                nodes.append(c)
    rows = sum(groups.values())
    return StepPrediction("ragged_verify", "target", {"B": rows, "Q": total, "C": c_max}, nodes,
                          cost.deployment.name, cost.graphs, target_ir.title,
                          cost.sync_cost(target_ir, packed, rows=rows) if sync else None)


def even_split(rows: int, tokens: int) -> list[int]:
    """``tokens`` spread over ``rows`` as evenly as they go (the first rows take one more)."""
    base, extra = divmod(int(tokens), int(rows))
    return [base + 1] * extra + [base] * (int(rows) - extra)


def draft_seconds(cost: CostModel, draft_ir, method, rows: int, k: int, context: int, committed: int = 1) -> float:
    """The method's drafter forwards of one step with ``k`` drafts for ``rows`` rows (dense).
    ``method``: a ``specc.methods.Method`` or its name."""
    from specc.methods import get_method

    impl = get_method(method) if isinstance(method, str) else method
    if draft_ir is None or k < 1 or not impl.uses_drafter:
        return 0.0
    return sum(cost.step(draft_ir, {"B": int(rows), "C": int(context), **shape.values}, step="draft",
                         role="drafter").time * shape.count for shape in impl.draft_shapes(int(k), max(1, int(committed))))


def ragged_step_seconds(cost: CostModel, target_ir, draft_ir, method, context: int,
                        k_max: int) -> Callable[[int, int], float]:
    """``seconds(rows, tokens)``: a step whose packed verify takes ``tokens`` tokens over ``rows``
    rows (each row its last committed token + its drafts, spread evenly), drafting included (the
    drafter's batched forward at the longest row's drafts, at most ``k_max``; none when every row
    verifies one token). Where the cost model prices CUDA graphs (``cost.graphs``) the packed
    verify runs graphed, padded to its token bucket (:func:`ragged_verify`'s ``bucket``);
    ``seconds(rows, rows * (k + 1))`` is then the dense step with k drafts where that count is
    a bucket's, and more where the padding adds tokens."""
    cache: dict[tuple[int, int], float] = {}

    def seconds(rows: int, tokens: int) -> float:
        key = (int(rows), int(tokens))
        if key not in cache:
            split = even_split(*key)
            verify = ragged_verify(cost, target_ir, split, context, bucket=cost.graphs).time
            k = min(int(k_max), max(split) - 1)
            cache[key] = verify + (draft_seconds(cost, draft_ir, method, key[0], k, context) if k > 0 else 0.0)
        return cache[key]

    return seconds
