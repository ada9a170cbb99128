"""Text from tokens as they arrive: incremental detokenization and stop strings.

A token's text can depend on the tokens after it (a UTF-8 character split over byte-level
tokens decodes to U+FFFD until its last byte arrives; some tokenizers merge spaces), so each new
piece is the difference between decoding a short window ending at the newest token and the same
window without the new tokens, and nothing is released while the window ends in U+FFFD.

Stop strings end the text before their first occurrence (the stop string itself is not
returned, as in the OpenAI API); text that could still become the start of a stop string is held
back until it cannot, so streamed pieces never have to be taken back.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
WINDOW = 6  # tokens of context decoded before the new ones


class IncrementalText:
    """``push(tokens) -> text`` for each chunk, then ``flush() -> text`` at the end; after a stop
    string, ``stopped`` is True and later pushes return "". Tokens in ``skip_ids`` (EOS) add no
    text. Without a tokenizer the text is the ids, space-separated (like ``specc run``)."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), skip_ids: tuple[int, ...] = ()):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.skip = set(skip_ids)
        self.ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # tokens whose text has been released (or held) already
        self._held = ""  # decoded text not yet released (a possible stop-string start)
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, tokens) -> str:
        if self.stopped:
            return ""
        self.ids.extend(int(t) for t in tokens if int(t) not in self.skip)
        return self._release(self._decode_new(final=False))

    def flush(self) -> str:
        if self.stopped:
            return ""
        return self._release(self._decode_new(final=True), final=True)

    def _decode_new(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        if self.tokenizer is None:
            new = "".join(f"{' ' if i else ''}{t}" for i, t in enumerate(self.ids[self._read:], start=self._read))
            self._read = len(self.ids)
            return new
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if not final and (after.endswith(REPLACEMENT) or len(after) <= len(before) or not after.startswith(before)):
            return ""  # an incomplete character, or text that may still change: wait for more tokens
        new = after[len(before):]
        self._read = len(self.ids)
        self._prefix = max(0, self._read - WINDOW)
        return new

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _release(self, new: str, final: bool = False) -> str:
        pending = self._held + new
        cut = min((i for i in (pending.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._held = pending[:cut], ""
        elif final:
            out, self._held = pending, ""
        else:
            keep = _longest_stop_prefix_suffix(pending, self.stop)
            out, self._held = pending[:len(pending) - keep], pending[len(pending) - keep:]
        self.text += out
        return out


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper start of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
