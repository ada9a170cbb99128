"""StepCurve: the manifest's step-time table read back and interpolated for the goodput rule."""

import pytest

from specc.runtime.step_curve import StepCurve

TABLE = {"rows": [1, 2, 4], "tokens_per_row": [1, 2, 3],
         "seconds": [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0], [4.0, 5.0, 8.0]]}


def test_grid_points_interpolation_and_extension():
    c = StepCurve.from_section(TABLE)
    assert c.ragged_seconds(2, 4) == 3.0 and c.step_seconds(4, 2) == 8.0 and c.step_seconds(1, 0) == 1.0
    assert c.ragged_seconds(3, 3) == pytest.approx(3.0)  # rows 3 between 2 and 4; 1 token per row
    assert c.ragged_seconds(2, 3) == pytest.approx(2.5)  # 1.5 tokens per row
    assert c.ragged_seconds(8, 8) == pytest.approx(8.0)  # past the last row count: the last segment extended
    assert c.ragged_seconds(4, 16) == pytest.approx(11.0)  # past the last tokens per row


@pytest.mark.parametrize("bad", [
    None, {"rows": [1]}, {"rows": [2, 1], "tokens_per_row": [1], "seconds": [[1.0], [1.0]]},
    {"rows": [1], "tokens_per_row": [1, 2], "seconds": [[1.0]]},
    {"rows": [1], "tokens_per_row": [1], "seconds": [[0.0]]}])
def test_malformed_tables_are_refused(bad):
    with pytest.raises(ValueError):
        StepCurve.from_section(bad)


def test_the_rule_of_a_batching_section_takes_its_prior():
    from specc.runtime.step_curve import draft_length_rule

    curve = {"rows": [1, 2], "tokens_per_row": [1, 2, 3], "seconds": [[1.0, 1.2, 1.4], [1.1, 1.3, 1.5]]}
    section = {"per_request_k": True, "goodput_k": False, "curve": curve, "prior_alpha": 0.8}
    rule = draft_length_rule(section, 2)
    assert rule.ragged_seconds is not None and rule.new_estimate().alpha == pytest.approx(0.8)
    dense = draft_length_rule({**section, "per_request_k": False, "goodput_k": True, "prior_alpha": None}, 2)
    assert dense.ragged_seconds is None and dense.new_estimate().alpha == 0.5  # older artifacts: uniform
    assert draft_length_rule({**section, "per_request_k": False}, 2) is None
