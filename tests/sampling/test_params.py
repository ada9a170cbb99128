"""SamplingParams: validation with one-line messages, greedy detection, keyword overrides."""

import pytest

from specc.sampling import SamplingParams


@pytest.mark.parametrize("field,value,match", [
    ("temperature", -0.1, "temperature"), ("temperature", float("nan"), "temperature"),
    ("top_k", -1, "top_k"), ("top_k", 2.5, "top_k"), ("top_p", 0.0, "top_p"), ("top_p", 1.5, "top_p"),
    ("min_p", -0.1, "min_p"), ("min_p", 2, "min_p"), ("repetition_penalty", 0, "repetition_penalty"),
    ("seed", -1, "seed"), ("seed", 1.5, "seed"), ("seed", True, "seed"),
])
def test_bad_values_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{"temperature": 1.0, field: value})


def test_greedy():
    assert SamplingParams().greedy and SamplingParams(temperature=None).greedy
    assert not SamplingParams(temperature=0.5).greedy
    assert SamplingParams.coerce(None, temperature=0.0, top_p=0.5) is None
    assert SamplingParams.coerce() is None


def test_coerce_overrides():
    base = SamplingParams(temperature=0.7, top_k=5, seed=3)
    out = SamplingParams.coerce(base, top_p=0.9, seed=None)
    assert out == SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3)
    assert SamplingParams.coerce(None, temperature=1.0, seed=4) == SamplingParams(temperature=1.0, seed=4)
    with pytest.raises(TypeError):
        SamplingParams.coerce({"temperature": 1.0})
    assert out.to_json()["top_p"] == 0.9
