"""The environment switches share one parser: the same spellings for every switch, a
default when unset or empty, and a refusal (naming the variable) for anything else."""

import pytest

from specc.switches import batch_draft_ahead_enabled, env_switch, residual_norm_enabled


@pytest.mark.parametrize("value,default,want", [("", True, True), ("", False, False), ("1", False, True),
                                                ("On", False, True), ("true", False, True), ("0", True, False),
                                                ("OFF", True, False), (" false ", True, False)])
def test_spellings_and_default(monkeypatch, value, default, want):
    monkeypatch.setenv("SPECC_TEST_SWITCH", value)
    assert env_switch("SPECC_TEST_SWITCH", default) is want


def test_unset_is_the_default_and_a_typo_is_refused(monkeypatch):
    monkeypatch.delenv("SPECC_TEST_SWITCH", raising=False)
    assert env_switch("SPECC_TEST_SWITCH", True) and not env_switch("SPECC_TEST_SWITCH", False)
    monkeypatch.setenv("SPECC_TEST_SWITCH", "yes please")
    with pytest.raises(ValueError, match="SPECC_TEST_SWITCH"):
        env_switch("SPECC_TEST_SWITCH", True)


def test_batch_draft_ahead_is_on_by_default(monkeypatch):
    monkeypatch.delenv("SPECC_BATCH_DRAFT_AHEAD", raising=False)
    assert batch_draft_ahead_enabled()
    monkeypatch.setenv("SPECC_BATCH_DRAFT_AHEAD", "0")
    assert not batch_draft_ahead_enabled()


def test_residual_norm_pairs_are_on_by_default(monkeypatch):
    monkeypatch.delenv("SPECC_RESIDUAL_NORM", raising=False)
    assert residual_norm_enabled()
    monkeypatch.setenv("SPECC_RESIDUAL_NORM", "off")
    assert not residual_norm_enabled()
