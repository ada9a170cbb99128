"""Pricing a batched speculative step (specc.search.batching_cost, batch_pricing.ragged_verify) at
Qwen3-8B + DFlash shapes on the h200 deployment: the limits the formulas must keep."""

import math

import pytest

from specc.search.acceptance import AcceptanceModel
from specc.search.batch_pricing import ragged_step_seconds, ragged_verify, step_seconds
from specc.search.batching_cost import GOODPUT, ONE_LEVEL, PER_REQUEST, BatchingPricer, binomial, row_grid
from specc.runtime.ragged import token_bucket
from specc.search.cost_model import CostModel

K = 15


@pytest.fixture(scope="module")
def irs(meta8b):
    return meta8b.irs("")


@pytest.fixture(scope="module")
def pricer(irs):
    return BatchingPricer(CostModel("h200-bs16"), *irs, "dflash", K, draft_ahead=False)


def test_ragged_verify_of_equal_rows_is_the_dense_step_and_packing_saves_the_padding(irs):
    t_ir, _ = irs
    cost = CostModel("h200-bs16")
    for b, q in ((1, 16), (4, 16), (16, 3)):
        dense = cost.step(t_ir, {"B": b, "Q": q, "C": 1024}).time
        assert ragged_verify(cost, t_ir, [q] * b, 1024).time == pytest.approx(dense, rel=1e-12)
    mixed = ragged_verify(cost, t_ir, [16] * 8 + [1] * 8, 1024)
    assert ragged_verify(cost, t_ir, [1] * 16, 1024).time < mixed.time < ragged_verify(cost, t_ir, [16] * 16, 1024).time
    assert mixed.values == {"B": 16, "Q": 136, "C": 1024}
    # a row with no tokens takes no part; longer caches cost more attention
    assert ragged_verify(cost, t_ir, [16, 0, 16], 1024).time == pytest.approx(ragged_verify(cost, t_ir, [16, 16], 1024).time)
    assert ragged_verify(cost, t_ir, [4, 4], [1024, 8192]).time > ragged_verify(cost, t_ir, [4, 4], 1024).time
    with pytest.raises(ValueError, match="at least one token"):
        ragged_verify(cost, t_ir, [0, 0], 1024)


def test_ragged_seconds_agrees_with_the_dense_step_curve(irs):
    cost = CostModel("h200-bs1")
    assert cost.graphs  # a CUDA deployment: the ragged step runs graphed, padded to token buckets
    dense = step_seconds(cost, *irs, "dflash", context=1024)
    ragged = ragged_step_seconds(cost, *irs, "dflash", context=1024, k_max=K)
    for rows in (1, 8, 32):
        for k in (K, 7, 1):  # the drafter drafts the longest row's k for every row
            assert ragged(rows, rows * (k + 1)) == pytest.approx(dense(rows, k), rel=1e-12)
        assert ragged(rows, rows) == pytest.approx(dense(rows, 0), rel=1e-12)  # every row k = 0: an AR step
    assert ragged(32, 32 * 5) < ragged(32, 32 * 9) < ragged(32, 32 * 16)
    # 320 packed tokens run in the bucket of 384: more than the dense step of k = 9, as 384's
    assert token_bucket(320) == 384
    assert ragged(32, 320) > dense(32, 9)
    unbucketed = ragged_step_seconds(CostModel("h200-bs1", graphs=False), *irs, "dflash", context=1024, k_max=K)
    assert unbucketed(32, 320) < unbucketed(32, 384)


def test_a_bucketed_ragged_verify_prices_the_padding_tokens(irs):
    t_ir, _ = irs
    cost = CostModel("h200-bs1")
    plain = ragged_verify(cost, t_ir, [10] * 32, 1024)
    padded = ragged_verify(cost, t_ir, [10] * 32, 1024, bucket=True)
    assert plain.values["Q"] == 320 and padded.values["Q"] == 384
    assert padded.time > plain.time
    # a count that fills its bucket pads nothing
    assert ragged_verify(cost, t_ir, [12] * 32, 1024, bucket=True).time == pytest.approx(
        ragged_verify(cost, t_ir, [12] * 32, 1024).time, rel=1e-12)


def test_one_level_is_the_cost_models_system_prediction(pricer, irs):
    acc = AcceptanceModel.from_tau(6.55, K)
    for b in (1, 16):
        system = pricer.cost.predict(*irs, method="dflash", num_draft=K, acceptance=acc, batch_size=b)
        one = pricer.one_level(b, acc)
        assert one.step_s == pytest.approx(system.step_time, rel=1e-12)
        assert one.tokens_per_s == pytest.approx(system.tokens_per_s, rel=1e-12)
        assert one.speedup == pytest.approx(system.speedup, rel=1e-12)


def test_row_grid_and_binomial():
    assert row_grid(5) == [1, 2, 3, 4, 5]
    assert row_grid(64)[:8] == list(range(1, 9)) and row_grid(64)[-1] == 64 and 32 in row_grid(64)
    assert math.fsum(binomial(20, 0.3)) == pytest.approx(1.0) and binomial(3, 0.0) == [1.0, 0, 0, 0]
    assert binomial(3, 1.0) == [0, 0, 0, 1.0]


def test_two_level_limits(pricer):
    acc = AcceptanceModel.from_tau(6.55, K)
    for b in (4, 16):
        one = pricer.one_level(b, acc)
        # k1 = k is one level
        same = pricer.two_level(b, acc, K)
        assert same.option == ONE_LEVEL and same.step_s == one.step_s
        for k1 in (1, 5, 14):
            two = pricer.two_level(b, acc, k1)
            # level 2 continues level 1: the committed tokens are the one-level ones, only time differs
            assert two.expected_tokens == pytest.approx(one.expected_tokens)
            assert two.draft_s == one.draft_s
            assert two.level2_rows == pytest.approx(b * math.prod(acc.alphas_for(k1)))
    # acceptance 1: level 2 takes every row, packed (the ragged step, graphed: 176 tokens padded
    # to the 192 of its bucket), over caches k1 + 1 longer
    full = AcceptanceModel.constant(1.0, K)
    two = pricer.two_level(16, full, 4)
    assert two.level2_rows == 16
    level2 = pricer.verify_seconds([K - 4] * 16, pricer.context + 5, packed=True)
    assert two.level2_s == pytest.approx(level2, rel=1e-12)
    assert level2 > pricer.verify_seconds([K - 4] * 16, pricer.context + 5)  # the bucket's padding
    assert two.step_s > pricer.one_level(16, full).step_s  # a second forward of every row only costs
    # acceptance 0: no row reaches level 2, and a shorter level 1 is cheaper than one level
    none = AcceptanceModel.constant(0.0, K)
    for k1 in range(1, K):
        two = pricer.two_level(16, none, k1)
        assert two.level2_s == 0 and two.level2_rows == 0
        assert two.step_s < pricer.one_level(16, none).step_s
    with pytest.raises(ValueError):
        pricer.two_level(4, acc, 0)


def test_level2_time_grows_with_acceptance(pricer):
    times = [pricer.two_level(32, AcceptanceModel.constant(a, K), 3).level2_s for a in (0.2, 0.5, 0.8, 0.95)]
    assert times == sorted(times) and times[0] > 0


def test_per_request_k(pricer):
    acc = AcceptanceModel.from_tau(6.55, K)
    for b in (1, 16, 32):
        per = pricer.per_request(b, acc)
        assert per.option == PER_REQUEST and per.per_request_k and len(per.row_k) == b
        # the scan includes every row at k: never worse than one level
        assert per.tokens_per_s >= pricer.one_level(b, acc).tokens_per_s * (1 - 1e-12)
    # verification turns compute-bound with the batch: rows draft fewer at 32 than at 1
    assert max(pricer.per_request(32, acc).row_k) < max(pricer.per_request(1, acc).row_k) == K
    # with one acceptance model for every row, one k for all is as good: the dense goodput k
    for b in (4, 32):
        dense = pricer.dense_goodput(b, acc)
        assert dense.option == GOODPUT and len(set(dense.row_k)) == 1
        assert pricer.per_request(b, acc).tokens_per_s == pytest.approx(dense.tokens_per_s, rel=1e-9)
    # a mixed batch: the rows that accept more get the drafts
    good, bad = AcceptanceModel.constant(0.95, K), AcceptanceModel.constant(0.1, K)
    mixed = pricer.per_request(8, acc, row_acceptance=[good] * 4 + [bad] * 4)
    assert min(mixed.row_k[:4]) > max(mixed.row_k[4:])
    expected = sum(m.expected_tokens(k) for m, k in zip([good] * 4 + [bad] * 4, mixed.row_k))
    assert mixed.expected_tokens == pytest.approx(expected)
    with pytest.raises(ValueError):
        pricer.per_request(4, acc, row_acceptance=[good])


def test_options_table(pricer):
    acc = AcceptanceModel.from_tau(6.55, K)
    rows = pricer.options(8, acc, reference=True)
    assert [r.option for r in rows] == [ONE_LEVEL] + [f"two-level k1={k1}" for k1 in range(1, K)] + [PER_REQUEST,
                                                                                                  GOODPUT]
    for r in rows:
        assert r.tokens_per_s == pytest.approx(r.expected_tokens / r.step_s)
        assert r.speedup == pytest.approx(r.tokens_per_s / (8 / r.ar_step_s))
        assert set(r.to_json()) >= {"option", "step_s", "tokens_per_s", "speedup", "level2_rows"}


def test_a_batched_verify_waits_for_the_hosts_speculative_work(irs):
    """``Deployment.spec_host_s`` is added to the acceptance read of a verify over more than one
    row (dense or packed), not to an AR step, a batch-1 verify or a drafter's forward."""
    import dataclasses

    from specc.search.deployments import get_deployment

    t_ir, d_ir = irs
    base = get_deployment("h200-bs16")
    assert base.spec_host_s > 0  # measured (docs/benchmarks/run26.md)
    with_host, without = CostModel(base), CostModel(dataclasses.replace(base, spec_host_s=0.0))

    def extra(step):
        return step(with_host) - step(without)

    host = base.spec_host_s
    assert extra(lambda m: m.step(t_ir, {"B": 16, "Q": 16, "C": 1024}).time) == pytest.approx(host)
    assert extra(lambda m: ragged_verify(m, t_ir, [16] * 8 + [1] * 8, 1024).time) == pytest.approx(host)
    assert extra(lambda m: m.step(t_ir, {"B": 16, "Q": 1, "C": 1024}).time) == pytest.approx(0.0, abs=1e-15)
    assert extra(lambda m: ragged_verify(m, t_ir, [1] * 16, 1024).time) == pytest.approx(0.0, abs=1e-15)
    assert extra(lambda m: m.step(t_ir, {"B": 1, "Q": 16, "C": 1024}).time) == pytest.approx(0.0, abs=1e-15)
    assert extra(lambda m: m.step(d_ir, {"B": 16, "C": 1024, "Q": 16, "N": 1}, step="draft",
                                  role="drafter").time) == pytest.approx(0.0, abs=1e-15)
    # a one-level option pays it once, a two-level option once per level that runs
    one = extra(lambda m: BatchingPricer(m, t_ir, d_ir, "dflash", K, draft_ahead=False).one_level(
        16, AcceptanceModel.constant(0.8, K)).step_s)
    assert one == pytest.approx(host)
    acc = AcceptanceModel.constant(0.8, K)
    two = extra(lambda m: BatchingPricer(m, t_ir, d_ir, "dflash", K, draft_ahead=False).two_level(16, acc, 4).step_s)
    # a row goes on to level 2 when it accepted all 4 drafts of level 1; a level 2 of one row
    # is priced as a batch-1 verify (no batched host work)
    w = binomial(16, 0.8 ** 4)
    assert two == pytest.approx(host * (1 + sum(w[2:])))


def test_drafting_ahead_hides_the_hosts_work_of_one_level_steps(irs, monkeypatch):
    """With drafting ahead a one-level step at B > 1 no longer waits for the host's work between
    steps (it runs while the GPU drafts the next step): its price drops by ``spec_host_s``, and
    nothing else moves (batch 1; the goodput rule's, per-request and two-level steps, which draft
    at the step's start). Unset, the pricer follows the runtime's switch and drafter."""
    acc = AcceptanceModel.from_tau(6.55, K)
    on, off = (BatchingPricer(CostModel("h200-bs16"), *irs, "dflash", K, draft_ahead=a) for a in (True, False))
    host = on.cost.deployment.spec_host_s
    assert off.one_level(16, acc).step_s - on.one_level(16, acc).step_s == pytest.approx(host)
    assert on.one_level(1, acc).step_s == pytest.approx(off.one_level(1, acc).step_s, rel=1e-12)
    for option in (lambda p: p.two_level(16, acc, 4), lambda p: p.dense_goodput(32, acc),
                   lambda p: p.per_request(16, acc)):
        assert option(on).step_s == pytest.approx(option(off).step_s, rel=1e-12)
    monkeypatch.setenv("SPECC_BATCH_DRAFT_AHEAD", "1")
    assert BatchingPricer(CostModel("h200-bs16"), *irs, "dflash", K).draft_ahead
    assert not BatchingPricer(CostModel("cpu"), *irs, "dflash", K).draft_ahead  # no CUDA graphs there
    monkeypatch.setenv("SPECC_BATCH_DRAFT_AHEAD", "0")
    assert not BatchingPricer(CostModel("h200-bs16"), *irs, "dflash", K).draft_ahead


def test_which_drafters_draft_ahead():
    from specc.runtime.drafters import drafts_ahead

    assert drafts_ahead("dflash") and drafts_ahead("pard")
    assert not drafts_ahead("ar-draft") and not drafts_ahead(None) and not drafts_ahead("nope")
