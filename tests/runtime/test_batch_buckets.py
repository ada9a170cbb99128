"""Batch buckets (``BatchScheduler(buckets=True)``, the default): a step runs over the first
width(running) slots of the allocation, the running requests moved there (``move_slots``), so a
step's cost follows the requests running rather than the slots allocated. Every request still
equals HF greedy alone, for every target family x drafter, the hybrid target included."""

import pytest
from lossless import reference
from test_batching import SCENARIOS

from specc.pairing import resolve_pair
from specc.runtime.batching import BatchScheduler
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.sampling.params import SamplingParams

# slots 0 and 2 finish first, so slot 3's request moves to slot 0 before the width drops to 2
PROMPTS = [[7, 3], [9], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [40, 41, 6, 1, 23]]
BUDGETS = [3, 16, 2, 14]


def _loop(checkpoints, method, target_key, drafter_key, num_draft, tree=0):
    pair = resolve_pair(checkpoints[target_key], checkpoints.get(drafter_key), method)
    eager = build_eager(pair, num_draft or None, max_len=32)
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, tree_budget=tree)


@pytest.fixture(autouse=True)
def always_narrow(monkeypatch):
    """The width trajectories below assume every narrowing is taken: the measured-gain check
    (``BatchScheduler._narrowing_pays``) would follow the CPU's step times, which at these toy
    sizes hardly depend on the width. ``test_narrowing_follows_measured_steps`` tests the check."""
    monkeypatch.setattr(BatchScheduler, "_narrowing_pays", lambda self, wanted: True)


class _Widths:
    """Records the loop's width before every step and every slot move."""

    def __init__(self, loop):
        self.widths, self.moves = [], []
        speculate, move = loop.speculate, loop.move_slots

        def on_speculate(budgets, *args, **kwargs):
            assert len(budgets) == loop.batch == loop.state.lengths.shape[0] == loop.seq.shape[0]
            self.widths.append(loop.batch)
            return speculate(budgets, *args, **kwargs)

        def on_move(moves):
            self.moves += moves
            return move(moves)

        loop.speculate, loop.move_slots = on_speculate, on_move


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", SCENARIOS)
@pytest.mark.parametrize("tree", [0, 5])
def test_width_follows_the_running_requests(checkpoints, method, target_key, drafter_key, num_draft, tree):
    if tree and method not in ("pard", "dflash"):
        pytest.skip("trees need a parallel drafter")
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft, tree)
    seen = _Widths(loop)
    results = loop.generate_batch(PROMPTS, BUDGETS, batch_size=4)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(checkpoints[target_key], budget, prompt=prompt)
    assert seen.widths[0] == 4 and seen.widths[-1] == 2 and sorted(set(seen.widths)) == [2, 4]
    assert seen.moves == [(3, 0)]
    assert loop.capacity == 4


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", [SCENARIOS[2], SCENARIOS[4]])
def test_queued_requests_widen_and_a_drain_narrows(checkpoints, method, target_key, drafter_key, num_draft):
    """Two requests run at width 2 of 8 slots; five more arrive and the width grows to 8 before
    they are admitted; as they finish it falls back, down to 2."""
    target = checkpoints[target_key]
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft)
    seen = _Widths(loop)
    scheduler = BatchScheduler(loop, 8)
    early = [([5, 17, 33], 12), ([9, 2], 18)]
    late = [([7, 3], 4), ([11, 4, 60], 6), ([40, 41, 6], 9), ([30], 3), ([8, 8, 1, 2], 7)]
    rids = [scheduler.submit(p, m) for p, m in early]
    for _ in range(2):
        scheduler.step()
    rids += [scheduler.submit(p, m) for p, m in late]
    while not scheduler.idle:
        scheduler.step()
    for rid, (prompt, budget) in zip(rids, early + late):
        assert scheduler.take(rid).tokens == reference(target, budget, prompt=prompt)
    assert seen.widths[:2] == [2, 2] and seen.widths[2] == 8 and seen.widths[-1] == 2
    assert 4 in seen.widths and seen.moves


def test_without_buckets_every_step_runs_at_capacity(checkpoints):
    loop = _loop(checkpoints, *SCENARIOS[4])
    seen = _Widths(loop)
    scheduler = BatchScheduler(loop, 4, buckets=False)
    results = scheduler.run([(p, m, ()) for p, m in zip(PROMPTS, BUDGETS)])
    assert set(seen.widths) == {4} and not seen.moves
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results):
        assert result.tokens == reference(checkpoints["target"], budget, prompt=prompt)


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft", [SCENARIOS[2], SCENARIOS[4]])
def test_sampled_requests_move_and_equal_their_runs_alone(checkpoints, method, target_key, drafter_key, num_draft):
    """Sampled and greedy requests in one batch: a sampled request's seed, parameters and seen
    set move with it (``SamplingPolicy.move_rows``) and narrow with the width; each request's
    tokens equal its run alone with the same parameters and seed."""
    loop = _loop(checkpoints, method, target_key, drafter_key, num_draft)
    seen = _Widths(loop)
    params = [None, SamplingParams(temperature=0.8, seed=3), None,
              SamplingParams(temperature=1.0, top_k=5, repetition_penalty=1.3, seed=9)]
    results = loop.generate_batch(PROMPTS, BUDGETS, (), sampling=params, batch_size=4)
    assert seen.moves == [(3, 0)] and seen.widths[-1] == 2
    for prompt, budget, p, result in zip(PROMPTS, BUDGETS, params, results):
        assert result.tokens == loop.generate(prompt, budget, (), p).tokens


def test_set_width_and_move_slot_refuse_what_would_lose_a_request(checkpoints):
    loop = _loop(checkpoints, *SCENARIOS[4])
    loop.open_slots(4)
    loop.prefill_slot(3, [5, 17, 33])
    with pytest.raises(RuntimeError, match=r"slots \[3\] are in use past width 2"):
        loop.set_width(2)
    for bad in (0, 5, 2.0):
        with pytest.raises(ValueError, match="width must be an integer"):
            loop.set_width(bad)
    with pytest.raises(ValueError, match="width of 1"):
        loop.set_width(1)
    with pytest.raises(ValueError, match="needs a live source and a free destination"):
        loop.move_slot(1, 0)
    loop.prefill_slot(0, [9, 2])
    with pytest.raises(ValueError, match="needs a live source and a free destination"):
        loop.move_slot(3, 0)
    loop.prefill_slot(2, [7, 3])
    with pytest.raises(ValueError, match="every slot may appear once"):
        loop.move_slots([(2, 1), (3, 1)])
    loop.release_slot(2)
    loop.move_slot(3, 1)
    loop.set_width(2)
    assert loop.live == [True, True] and loop.n == [3, 4] and loop.seq.shape[0] == 2
    assert loop.state.lengths.tolist() == [2, 3] and loop._slots_state.lengths.tolist() == [2, 3, 0, 0]


def test_bucket_sizes():
    class _Loop:  # the scheduler only asks a loop for its width here
        batch, capacity = 6, 6

        def open_slots(self, rows, sampling=None): ...

    scheduler = BatchScheduler(_Loop(), 6)
    assert [scheduler.bucket(n) for n in (0, 1, 2, 3, 4, 5, 6, 9)] == [2, 2, 2, 4, 4, 6, 6, 6]
    assert not scheduler.buckets  # a loop that cannot narrow keeps its capacity


@pytest.mark.parametrize("tree", [0, 6])
def test_hybrid_target_moves_its_recurrent_state(tmp_path_factory, tree):
    """A hybrid (GDN + attention) target's recurrent and conv snapshots move with a request
    (``SnapshotState.fork``); every request equals plain AR greedy alone."""
    from hybrid_factory import load_hybrid
    from test_batching import _RowScripted

    from specc.runtime.eager import EagerSpeculativeDecoder

    _, _, target = load_hybrid(tmp_path_factory, seed=0, name=f"hy-buckets-{tree}")
    prompts = [[5, 17, 33, 2], [9, 3], [44, 12, 7, 70, 1], [30, 8, 61]]
    budgets = [3, 14, 2, 12]
    plain = [EagerSpeculativeDecoder(target, None, 0, 48).generate(p, m).tokens for p, m in zip(prompts, budgets)]

    class _Movable(_RowScripted):  # finds each row's continuation by its prompt: nothing of its own moves
        def set_width(self, rows): ...
        def move_slots(self, src, dst): ...

    drafter = _Movable([(p, p + t) for p, t in zip(prompts, plain)], [(4, 9), (4, 1), (4, 0), (2, 1)])
    loop = DeviceSpeculativeDecoder(target, drafter, 4, 48, tree_budget=tree)
    seen = _Widths(loop)
    results = loop.generate_batch(prompts, budgets, batch_size=4)
    assert [r.tokens for r in results] == plain
    assert seen.moves == [(3, 0)] and seen.widths[-1] == 2


def test_narrowing_follows_measured_steps(checkpoints, monkeypatch):
    """A narrower width is taken while unmeasured, or where its fastest step was BUCKET_GAIN
    faster than the current width's; not where the steps cost the same."""
    monkeypatch.undo()  # the real check
    from specc.runtime import batching

    loop = _loop(checkpoints, *SCENARIOS[4])
    scheduler = BatchScheduler(loop, 8)
    assert scheduler._narrowing_pays(2)  # nothing measured
    scheduler.fastest_step = {8: 0.010}
    assert scheduler._narrowing_pays(4)  # one width seen: find out
    scheduler.fastest_step = {8: 0.010, 4: 0.0085, 2: 0.0095}
    assert scheduler.width == 8 and scheduler._narrowing_pays(4) and not scheduler._narrowing_pays(2)
    scheduler.fastest_step[2] = (1 - batching.BUCKET_GAIN) * 0.010
    assert scheduler._narrowing_pays(2)
    # an unseen width is predicted by a line through the widths seen
    scheduler.fastest_step = {8: 0.010, 6: 0.0098}  # about flat (launch-bound): 4 rows predicted 0.0096
    assert not scheduler._narrowing_pays(4)
    scheduler.fastest_step = {8: 0.010, 6: 0.008}  # 1 ms a row: 4 rows predicted 0.006
    assert scheduler._narrowing_pays(4) and batching._line_at(scheduler.fastest_step, 4) == pytest.approx(0.006)
    # a run records the fastest step per width it stepped at
    for prompt, budget in zip(PROMPTS, BUDGETS):
        scheduler.submit(prompt, budget)
    scheduler.fastest_step = {}
    while not scheduler.idle:
        scheduler.step()
    assert 4 in scheduler.fastest_step and all(t > 0 for t in scheduler.fastest_step.values())
