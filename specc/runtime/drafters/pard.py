"""``PardDraft``: committed tokens + (k - 1) ``pard_token`` slots, one causal forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specc.runtime.drafters.causal import CausalDrafter
from specc.runtime.drafters.rows import positions, row_positions, row_positions_at, run_step, window
from specc.runtime.graphs import unwrapped

if TYPE_CHECKING:  # pragma: no cover - annotations only: the runtime runs generated steps
    from specc.models.decoder import CausalLM


class PardDraft(CausalDrafter):
    name = "pard"

    def __init__(self, model: CausalLM, pard_token: int):
        super().__init__(model)
        self.pard_token = int(pard_token)

    @classmethod
    def from_manifest(cls, step, section):
        if not section or section.get("pard_token") is None:
            raise ValueError("a PARD drafter needs pard_token (manifest drafter section)")
        return cls(step, section["pard_token"])

    def mask_slots(self, k: int) -> int:
        return k - 1

    supports_tree = True

    def propose_logits_rows(self, seq, n, k, active=None):
        out = self._draft(seq, n, k, active, lambda s, st, m, first, slot: self._block(s, st, m, k, first, slot))
        self.lengths = list(n)  # committed tokens stay, the mask slots are dropped
        return out

    def _masks(self, rows: int, width: int) -> torch.Tensor:
        return self._token_block(self.pard_token, rows, width)

    def _block(self, seq, starts, m, k, first, slot):
        dev = self.model.device
        feed = torch.cat([window(seq, starts, m), self._masks(seq.shape[0], self.mask_slots(k))], dim=1)
        self.forwards += 1
        logits = self._call(slot, first, feed, *row_positions(starts, feed.shape[1], dev))
        return logits[:, -k:]  # the last committed token's and the mask positions' predictions

    def propose_rows(self, seq, n, k, active=None):
        return self.propose_logits_rows(seq, n, k, active).argmax(-1)

    def _fed(self, n, k=1, active=None):
        """As the causal drafters feed, except that a batched draft of the widest k seen (k + 1 =
        ``_widest``; a step with fewer drafts, e.g. a goodput rule's, feeds only what the rows
        need) whose live rows each lag by 1 .. ``_widest`` tokens and have at least ``_widest``
        committed feeds every row its last ``_widest`` (the full window: re-fed tokens rewrite
        the same K/V), whatever the rows accepted: one drafting shape, from device state alone
        (``draft_ahead_rows``)."""
        starts, m, solo = super()._fed(n, k, active)
        width = self._widest
        live = [b for b in range(len(n)) if active is None or active[b]]
        if (len(n) > 1 and live and not solo and k + 1 == width
                and all(1 <= n[b] - self.lengths[b] <= width and n[b] >= width for b in live)):
            return [max(nb - width, 0) for nb in n], width, []
        return starts, m, solo

    def draft_ahead_rows(self, seq, lengths, accepted, context, k):
        """The next step's full-window draft (``_fed``), every row live: each row's last
        ``_widest`` committed tokens (ending at ``lengths``, = committed - 1, on the device) and
        k - 1 mask slots."""
        rows, width = len(self.lengths), k + 1
        # the next step's ``_fed`` takes the full window at k + 1 = ``_widest``; after this step a row
        # lags by accepted + 1 <= k + 1 and has one token more than now
        if rows < 2 or k < 1 or width < getattr(self, "_widest", 0) or any(nb + 1 < width or nb == 0
                                                                           for nb in self.lengths):
            return None
        self._widest = width
        start = lengths + 1 - width
        feed = torch.cat([seq.gather(1, start[:, None] + positions(0, width, seq.device)),
                          self._masks(rows, self.mask_slots(k))], dim=1)
        return run_step(self.model, False, feed, *row_positions_at(start, feed.shape[1]))[:, -k:].argmax(-1)

    def took_ahead(self, n, k):
        self.forwards += 1
        self.lengths = list(n)  # committed tokens stay, the mask slots are dropped

    def draft_on_device(self, seq, lengths, key, k, context, offsets, logits=False):
        """``_block`` on the device: the m fed tokens and k - 1 mask slots, one forward."""
        feed, start = self._device_feed(seq, lengths, key, offsets)
        feed = torch.cat([feed, self._masks(1, self.mask_slots(k))], dim=1)
        out = unwrapped(self.model)(feed, start[:, None] + offsets[:, :feed.shape[1]], start)[:, -k:]
        return out if logits else out.argmax(-1)

    def drafted_on_device(self, n, key, k):
        super().drafted_on_device(n, key, k)
        self.forwards += 1
        self.lengths = list(n)  # committed tokens stay, the mask slots are dropped

