"""``CausalDrafter``: a drafter that is a causal LM step, the shared part of the AR and PARD
strategies (per-row cache lengths, which rows feed what, the prompt fed at the prefill)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specc.runtime.drafters.base import Drafter
from specc.runtime.drafters.rows import merge_rows, row_positions, run_solo, run_step, split_rows

if TYPE_CHECKING:  # pragma: no cover - annotations only: the runtime runs generated steps
    from specc.models.decoder import CausalLM


class CausalDrafter(Drafter):
    """A drafter that is a causal LM step (specc CausalLM or its compiled step). ``lengths[b]``
    is how many committed tokens of row b its KV cache holds."""

    def __init__(self, model: CausalLM):
        self.model = model  # a CausalLM or a compiled step with the same call signature
        self.lengths = [0]

    @property
    def length(self) -> int:  # batch-1 view
        return self.lengths[0]

    def setup(self, max_len: int, batch: int = 1) -> None:
        self.model.setup_caches(batch, max_len)

    def _state_step(self):
        return self.model

    @property
    def device(self):
        return self.model.device

    def capture_shapes(self, seq, k):
        """Every batched drafting shape, written at each row's cached length: past the prompt a
        row keeps (``feed_prompt``), where its next draft writes first."""
        dev = self.model.device
        extra = self.mask_slots(k)
        rows = seq.shape[0]
        for fed in range(1, k + 2):  # newly committed tokens: 1 .. k + 1
            feed = seq[:, :1].expand(rows, fed + extra).contiguous()
            self.model(feed, *row_positions(list(self.lengths), feed.shape[1], dev))

    def mask_slots(self, k: int) -> int:
        """Mask tokens appended after the newly committed ones in one drafting forward."""
        return 0

    def feed_prompt(self, slot, tokens) -> None:
        """With more than one slot, run the prompt through the drafter into ``slot``'s cache now,
        at the request's prefill (one forward, a one-off like the target's prefill; its logits
        are not used), so that its first draft feeds one token, like a row that has just
        drafted, and joins the batched forward instead of drafting alone over its whole prompt.
        Causal attention: the prompt's K/V do not depend on what follows them."""
        if len(self.lengths) == 1:
            return
        run_solo(self.model, slot, tokens, *row_positions([0], tokens.shape[1], self.model.device))
        self.lengths[slot] = tokens.shape[1]

    def _fed(self, n: list[int], k: int = 1, active: list[bool] | None = None) -> tuple[list[int], int, list[int]]:
        """(per-row start, m, solo rows): the batched forward feeds every row its last m
        committed tokens (inactive rows: a window clamped into their cache); solo rows draft
        alone (:func:`split_rows`)."""
        lags = [nb - lb for nb, lb in zip(n, self.lengths)]
        self._widest = max(getattr(self, "_widest", 0), k + 1)  # a lag after any step so far (k can shrink)
        m, solo = split_rows(lags, list(self.lengths), active, self._widest)
        return [max(nb - m, 0) for nb in n], m, solo

    def _draft(self, seq, n, k, active, fn):
        """``fn(seq, starts, m, first, slot)`` drafts for the batched rows (slot None) or for
        one solo row; returns the batched result with the solo rows' merged in."""
        starts, m, solo = self._fed(n, k, active)
        batched = [b for b in range(len(n)) if b not in solo]
        out = None
        if any(active is None or active[b] for b in batched):
            out = fn(seq, starts, m, all(self.lengths[b] == 0 for b in batched), None)
        rows = {}
        for b in solo:
            rows[b] = fn(seq[b:b + 1], [self.lengths[b]], n[b] - self.lengths[b], True, b)
        if out is None:  # every row drafted alone: one output row each
            out = torch.cat([rows[b] for b in range(len(n))], dim=0) if len(rows) == len(n) else None
            if out is None:  # inactive rows with no batched forward: their drafts are never read
                first = next(iter(rows.values()))
                out = first.new_zeros((len(n),) + tuple(first.shape[1:]))
        return merge_rows(out, rows)

    def _call(self, slot, first, *args):
        return run_step(self.model, first, *args) if slot is None else run_solo(self.model, slot, *args)

    def device_draft_key(self, n, k):
        """m, the committed tokens the draft feeds (those since the drafter's last forward), when
        the drafter has read the prompt (its first draft feeds it whole, a one-off shape)."""
        if len(self.lengths) != 1 or k < 1 or self.lengths[0] == 0:
            return None
        m = n[0] - self.lengths[0]
        return m if 1 <= m <= k + 1 else None

    def device_draft_keys(self, k):
        return list(range(1, k + 2))

    def prepare_device_draft(self, k):
        if self.mask_slots(k):
            self._masks(1, self.mask_slots(k))

    def _device_feed(self, seq, lengths, m, offsets):
        """(the first ``m``-token feed [1, m] and its start [1]) of a batch-1 draft: the row's
        last m committed tokens, from ``lengths`` (= committed - 1) on the device."""
        start = lengths + 1 - m
        return seq.gather(1, start[:, None] + offsets[:, :m]), start

    def drafted_on_device(self, n, key, k):
        self._widest = max(getattr(self, "_widest", 0), k + 1)  # as ``_fed`` notes it

