"""Shared by the ragged-verify and two-level tests: a spy on the loop's packed verify calls, a
draft-length rule with fixed per-request choices, and a loop / scheduler run over tiny checkpoints."""

from specc.pairing import resolve_pair
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager

PROMPTS = [[5, 17, 33, 2, 8, 9, 41], [7, 3], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [40, 41, 6, 1, 23]]
BUDGETS = [12, 4, 22, 8]  # the third outlives the others: free slots at the end


class StepSpy:
    """Wraps a ragged step and records each packed call's per-row token counts and cache lengths."""

    def __init__(self, step):
        self.step, self.calls = step, []

    def __getattr__(self, name):
        return getattr(self.__dict__["step"], name)

    def __call__(self, ids, positions, cache_len, *, row_slots, row_starts):
        counts = (row_starts[1:] - row_starts[:-1]).tolist()
        self.calls.append((row_slots.tolist(), counts, cache_len.tolist()))
        assert ids.shape == (1, sum(counts)) and positions.shape == ids.shape
        return self.step(ids, positions, cache_len, row_slots=row_slots, row_starts=row_starts)


class RowPattern:
    """A draft-length rule that cycles through fixed per-request choices (0 included), so a
    step's rows ask for different numbers of drafts whatever their acceptance."""

    def __init__(self, patterns):
        self.patterns, self.step, self.asked = patterns, 0, []

    def choose_rows(self, alphas, caps, rows):
        pattern = self.patterns[self.step % len(self.patterns)]
        self.step += 1
        chosen = [pattern[i % len(pattern)] for i in range(len(alphas))]
        self.asked.append(chosen)
        return chosen

    def choose(self, alphas, caps, rows):
        self.asked.append("choose")
        return max(self.patterns[0])


def make_loop(checkpoints, method, target_key, drafter_key, num_draft, cap=True):
    pair = resolve_pair(checkpoints[target_key], checkpoints.get(drafter_key), method)
    eager = build_eager(pair, num_draft, max_len=40)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, cap_to_budget=cap)
    loop.ragged_target = StepSpy(loop.ragged_target)
    return loop


def run_requests(loop, rule, capacity=3, prompts=PROMPTS, budgets=None):
    """Submit ``prompts`` (``budgets``: default ``BUDGETS``) to a scheduler over ``loop`` with the
    draft-length ``rule``; step until idle. Returns (results in order, per-step ``last_row_drafts``)."""
    scheduler = BatchScheduler(loop, capacity, draft_length=rule)
    rids = [scheduler.submit(p, m) for p, m in zip(prompts, budgets or BUDGETS)]
    rows = []
    while not scheduler.idle:
        scheduler.step()
        rows.append(scheduler.last_row_drafts)
        if scheduler.last_row_drafts is not None:  # each running request's own k, free slots none
            assert len(scheduler.last_request_drafts) <= capacity
            assert sorted(k for k in scheduler.last_request_drafts if k) == \
                sorted(k for k in scheduler.last_row_drafts if k)
    return [scheduler.take(rid) for rid in rids], rows
