"""The batching choice per deployment (specc.search.batching_choice): the option with the best
predicted tokens/s, one level (with the reason) where no mechanism applies, and --two-level checks."""

import pytest

from specc.errors import UserError
from specc.runtime.step_curve import StepCurve
from specc.search.acceptance import AcceptanceModel
from specc.search.batch_pricing import ragged_step_seconds
from specc.search.batching_choice import MECHANISM_MARGIN, batching_section, check_given, parse_two_level
from specc.search.batching_cost import GOODPUT, BatchingPricer
from specc.search.cost_model import CostModel

K = 15


@pytest.fixture(scope="module")
def pricer(meta8b):
    return BatchingPricer(CostModel("h200-bs16"), *meta8b.irs(""), "dflash", K)


def test_parse_two_level():
    assert parse_two_level("auto", K) == "auto" and parse_two_level(None, K) == "auto"
    assert parse_two_level("off", K) == "off" and parse_two_level("3", K) == 3 and parse_two_level(14, K) == 14
    for bad, message in ((0, "1 <= K1 < k"), ("0", "1 <= K1 < k"), (K, "one level"), (K + 4, "1 <= K1 < k"),
                         ("x", "auto, off or")):
        with pytest.raises(UserError, match=message):
            parse_two_level(bad, K)
    with pytest.raises(UserError, match="at least 2 drafts"):
        parse_two_level(1, 1)
    with pytest.raises(UserError, match="batch size 1"):
        check_given(3, 1, True)
    with pytest.raises(UserError, match="no ragged verify"):
        check_given(3, 8, False)
    check_given("auto", 1, False)


def test_one_level_where_no_mechanism_applies(pricer):
    acc = AcceptanceModel.from_tau(6.55, K)
    cases = {"batch size 1": dict(batch_size=1), "no ragged verify": dict(batch_size=16, ragged=False),
             "tree verification": dict(batch_size=16, tree_budget=32)}
    for reason, kwargs in cases.items():
        section = batching_section(pricer, acceptance=acc, **kwargs)
        assert section["two_level_k1"] is None and section["per_request_k"] is False
        assert reason in section["source"]
        # without a ragged step the options are still priced: the section says what they would give
        assert ("candidates" in section) == (reason == "no ragged verify")
    # without one: one level or the goodput rule's one k per step, whichever is predicted faster
    for b in (4, 64):
        unpacked = batching_section(pricer, b, acc, ragged=False, curve=False)
        rows = {r["option"]: r for r in unpacked["candidates"]}
        dense_wins = rows[GOODPUT]["tokens_per_s"] > rows["one level"]["tokens_per_s"] * (1 + 1e-9)
        assert unpacked["chosen"] == (GOODPUT if dense_wins else "one level") and unpacked["goodput_k"] == dense_wins
        assert unpacked["two_level_k1"] is None and not unpacked["per_request_k"]
        assert "with a ragged step" in unpacked["source"]
    ar = batching_section(None, 16, None)
    assert ar["two_level_k1"] is None and not ar["per_request_k"] and "AR" in ar["source"]
    unmeasured = batching_section(pricer, 16, None)
    assert unmeasured["two_level_k1"] is None and "no measured acceptance" in unmeasured["source"]


def test_the_choice_is_the_best_predicted_option(pricer):
    acc = AcceptanceModel.from_tau(6.55, K)
    for b in (8, 32, 64):
        section = batching_section(pricer, b, acc, curve=False)
        rows = section["candidates"]
        best = max(rows, key=lambda r: r["tokens_per_s"])
        chosen = next(r for r in rows if r["option"] == section["chosen"])
        assert chosen["tokens_per_s"] == pytest.approx(best["tokens_per_s"], rel=1e-8)
        assert (section["two_level_k1"], section["per_request_k"]) == (chosen["two_level_k1"], chosen["per_request_k"])
        assert section["goodput_k"] is (chosen["option"] == GOODPUT)
        dense = next(r for r in rows if r["option"] == GOODPUT)
        if section["per_request_k"]:  # only where it beats one k for every row verified dense
            assert chosen["tokens_per_s"] > dense["tokens_per_s"] * (1 + 1e-9)
        assert section["batch_size"] == b and section["num_draft"] == K and section["acceptance_source"]
    # a given K1 is kept whatever the prediction; "off" leaves two-level out
    given = batching_section(pricer, 8, acc, two_level=1, curve=False)
    assert given["two_level_k1"] == 1 and given["source"].startswith("given")
    off = batching_section(pricer, 64, acc, two_level="off", curve=False)
    assert off["two_level_k1"] is None and not any(r["two_level_k1"] for r in off["candidates"])


def test_two_level_or_one_level_flips_where_the_prices_cross(pricer):
    """Without the goodput rule's draft lengths, two-level is chosen exactly when some k1 is
    predicted faster than one level by the margin: a second forward of every row loses at
    acceptance 1, and pruning wins at lower acceptance."""
    seen = set()
    for alpha in (0.3, 0.6, 0.8, 0.9, 1.0):
        acc = AcceptanceModel.constant(alpha, K)
        section = batching_section(pricer, 64, acc, per_request=False, curve=False)
        one = pricer.one_level(64, acc).tokens_per_s
        best_two = max(pricer.two_level(64, acc, k1).tokens_per_s for k1 in range(1, K))
        assert (section["two_level_k1"] is not None) == (best_two > one * MECHANISM_MARGIN)
        seen.add(section["two_level_k1"] is not None)
    assert seen == {True, False}
    assert batching_section(pricer, 64, AcceptanceModel.constant(1.0, K), per_request=False,
                            curve=False)["two_level_k1"] is None


def test_the_recorded_curve_is_the_ragged_step_time(pricer):
    section = batching_section(pricer, 16, AcceptanceModel.from_tau(6.55, K))
    curve = section["curve"]
    assert curve["rows"] == [1, 2, 4, 8, 16] and curve["tokens_per_row"] == list(range(1, K + 2))
    seconds = ragged_step_seconds(pricer.cost, pricer.target_ir, pricer.draft_ir, "dflash", pricer.context, K)
    table = StepCurve.from_section(curve)
    for rows in (1, 4, 16):
        for q in (1, 7, 16):
            assert table.ragged_seconds(rows, rows * q) == pytest.approx(seconds(rows, rows * q), rel=1e-12)
    assert table.step_seconds(8, K) == pytest.approx(seconds(8, 8 * (K + 1)), rel=1e-12)


def test_per_request_k_with_one_k_for_every_row_is_the_dense_goodput_rule(pricer):
    """Where the best per-row allocation gives every row the same k, per-request k predicts what the
    goodput rule's one k verified dense predicts; the choice is then the dense one (no packing)."""
    acc = AcceptanceModel.from_tau(6.55, K)
    for b in (16, 32, 64):
        per, dense = pricer.per_request(b, acc), pricer.dense_goodput(b, acc)
        if len(set(per.row_k)) == 1 and per.tokens_per_s <= dense.tokens_per_s * (1 + 1e-9):
            section = batching_section(pricer, b, acc, curve=False)
            if dense.tokens_per_s > pricer.one_level(b, acc).tokens_per_s * MECHANISM_MARGIN:
                assert section["goodput_k"] and not section["per_request_k"]
                assert "no better than one k for every row" in section["source"]


def test_prior_alpha_fits_the_acceptance_at_the_options_drafts():
    """The runtime's estimate is geometric: the prior is the alpha giving the model's expected
    tokens at the chosen option's mean drafts per row, not at k (a drafter right only at the
    first position: alpha 0.75 at one draft, ~0.43 fitted at 8)."""
    from types import SimpleNamespace

    from specc.search.batching_choice import prior_alpha

    first_only = AcceptanceModel([0.75] + [0.0] * 7)
    assert prior_alpha(SimpleNamespace(row_k=[1, 1, 1, 2]), first_only, 8) == pytest.approx(0.75, abs=1e-6)
    assert prior_alpha(SimpleNamespace(row_k=None), first_only, 8) < 0.5
    flat = AcceptanceModel.constant(0.8, K)
    assert prior_alpha(SimpleNamespace(row_k=[6] * 4), flat, K) == pytest.approx(0.8, abs=1e-6)


def test_the_section_records_the_prior(pricer):
    section = batching_section(pricer, 16, AcceptanceModel.from_tau(6.55, K), curve=False)
    assert 0.5 < section["prior_alpha"] < 1.0


def test_a_mechanism_short_of_the_margin_keeps_one_level(pricer):
    """A mechanism predicted faster than one level by less than the margin is not chosen (the
    model prices one level's fixed step shape best); the source names it and its prediction."""
    from specc.search import batching_choice

    acc = AcceptanceModel.from_tau(6.55, K)
    section = batching_section(pricer, 64, acc, curve=False)
    assert section["chosen"] != "one level"
    best = max(c["tokens_per_s"] for c in section["candidates"])
    one = pricer.one_level(64, acc).tokens_per_s
    assert best > one * MECHANISM_MARGIN
    saved = batching_choice.MECHANISM_MARGIN
    try:
        batching_choice.MECHANISM_MARGIN = best / one * 1.01  # now the best is short of the margin
        kept = batching_section(pricer, 64, acc, curve=False)
    finally:
        batching_choice.MECHANISM_MARGIN = saved
    assert kept["chosen"] == "one level" and kept["two_level_k1"] is None and not kept["goodput_k"]
    assert "no mechanism beats one level by" in kept["source"] and f"{best:,.0f} predicted" in kept["source"]
