"""Incremental detokenization (pieces add up to the whole decode, no half characters) and stop
strings (cut before the first occurrence, across chunk boundaries, nothing taken back)."""

from __future__ import annotations

import pytest

from specc.serve.text import IncrementalText

TEXTS = ["def fibonacci(n):\n    return n", "héllo wörld: 世界 🎉🎉 ok", "  leading  spaces\n\n\ttabs", "ÿ€𝄞"]


def _pieces(tok, ids, sizes, **kw):
    inc = IncrementalText(tok, **kw)
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(inc.push(ids[i:i + n]))
        i, k = i + n, k + 1
    out.append(inc.flush())
    return inc, out


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("sizes", [[1], [2, 1, 3], [100]])
def test_pieces_add_up_to_the_decode(tiny_tokenizer, text, sizes):
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    inc, pieces = _pieces(tiny_tokenizer, ids, sizes)
    assert "".join(pieces) == tiny_tokenizer.decode(ids) == inc.text
    assert not any("\ufffd" in p for p in pieces)  # a character split over byte tokens waits for its last byte


def test_a_split_character_waits_for_its_last_byte(tiny_tokenizer):
    ids = tiny_tokenizer("🎉", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # byte-level pieces
    inc = IncrementalText(tiny_tokenizer)
    assert [inc.push([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert inc.push(ids[-1:]) == "🎉"


def test_skipped_ids_add_no_text(tiny_tokenizer):
    ids = tiny_tokenizer("a b", add_special_tokens=False)["input_ids"]
    inc, pieces = _pieces(tiny_tokenizer, ids + [0], [1], skip_ids=(0,))
    assert "".join(pieces) == "a b"


@pytest.mark.parametrize("sizes", [[1], [3], [100]])
def test_stop_strings_cut_before_the_first_occurrence(tiny_tokenizer, sizes):
    ids = tiny_tokenizer("x = 1\n\ny = 2\nSTOP z", add_special_tokens=False)["input_ids"]
    inc, pieces = _pieces(tiny_tokenizer, ids, sizes, stop=("STOP", "\n\n"))
    assert "".join(pieces) == "x = 1" and inc.stopped
    assert inc.push(ids) == "" and inc.flush() == ""
    inc, pieces = _pieces(tiny_tokenizer, ids, sizes, stop=("= 2",))
    assert "".join(pieces) == "x = 1\n\ny " and inc.stopped


def test_a_possible_stop_start_is_held_until_it_cannot_be_one(tiny_tokenizer):
    enc = lambda t: tiny_tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    inc = IncrementalText(tiny_tokenizer, stop=("b EOF",))
    assert inc.push(enc("ab")) == "a"  # "b" may start "b EOF"
    assert inc.push(enc(" E")) == ""  # "b E" still may
    assert inc.push(enc("ND")) == "b END" and inc.flush() == "" and not inc.stopped
    inc = IncrementalText(tiny_tokenizer, stop=("b EOF",))
    assert inc.push(enc("ab")) == "a" and inc.flush() == "b"  # the end releases what was held


def test_without_a_tokenizer_the_text_is_the_ids():
    inc = IncrementalText(None, skip_ids=(0,))
    assert inc.push([5, 6]) + inc.push([7, 0]) + inc.flush() == "5 6 7"
