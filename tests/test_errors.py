"""specc.errors: the one-line user errors and the auto|off|N option values."""

import pytest

from specc.errors import UserError, auto_off_or_int


def test_auto_off_or_int_keeps_the_words_and_reads_counts():
    assert auto_off_or_int("auto", "--tree", "a node budget") == "auto"
    assert auto_off_or_int("off", "--tree", "a node budget") == "off"
    assert auto_off_or_int("31", "--tree", "a node budget") == 31
    assert auto_off_or_int(0, "--tree", "a node budget") == 0  # ranges are the caller's


@pytest.mark.parametrize("bad", ["eight", "3.5", None, "", "Auto"])
def test_auto_off_or_int_names_the_option_and_the_count(bad):
    with pytest.raises(UserError, match=r"^--two-level takes auto, off or a level-1 draft count K1, not "):
        auto_off_or_int(bad, "--two-level", "a level-1 draft count K1")
