"""The batch's step-time curve T(B, k) from the cost model, for the runtime's goodput rule.

``specc.runtime.adaptive.GoodputDraftLength`` picks each step's drafts k from the requests'
measured acceptance and a step-time function; the runtime cannot import the cost model (it sits
below the search layer), so this module builds that function here: one step with k drafts per
row over B rows = the method's drafter forwards + the target's verify forward of k + 1 tokens
per row, predicted by ``CostModel.predict`` for the deployment at a context length. The drafter
shapes are priced as after a step that committed one token (the cost of drafting barely depends
on it; the acceptance itself comes from measurement, not from here).
"""

from __future__ import annotations

from typing import Callable


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
