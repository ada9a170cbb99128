"""``ARDraft``: a small same-vocab causal LM, k sequential forwards (chain speculation)."""

from __future__ import annotations

import torch

from specc.runtime.drafters.causal import CausalDrafter
from specc.runtime.drafters.rows import row_positions, window
from specc.runtime.graphs import unwrapped


class ARDraft(CausalDrafter):
    name = "ar-draft"

    def propose_rows(self, seq, n, k, active=None):
        return self._draft(seq, n, k, active, lambda s, st, m, first, slot: self._chain(s, st, m, k, first, slot))

    def propose_sampled_rows(self, seq, n, k, pick, active=None):
        """Each draft drawn (``pick``) from the drafter's distribution after the drafts before it.
        Solo rows (:meth:`_draft`) pick for their own row. The batched and solo results travel
        through the row merge as one tensor [rows, k, 1 + V] (token id as a float, exact below
        2**24, then q) and are split after."""
        def run(s, st, m, first, slot):
            drafts, qs = self._chain(s, st, m, k, first, slot, pick)
            return torch.cat([drafts.to(qs.dtype)[..., None], qs], dim=-1)

        both = self._draft(seq, n, k, active, run)
        return both[..., 0].to(torch.long), both[..., 1:]

    def _chain(self, seq, starts, m, k, first, slot, pick=None):
        """k drafts fed back one by one; ``pick`` (sampling): (drafts, q [rows, k, V]) instead of
        the greedy drafts."""
        dev = self.model.device
        drafts, qs = [], []
        feed = window(seq, starts, m)
        for j in range(k):
            self.forwards += 1
            logits = self._call(slot, first, feed, *row_positions(starts, feed.shape[1], dev))
            if pick is None:
                drafts.append(logits[:, -1].argmax(-1, keepdim=True))  # fed back without leaving the GPU
            else:
                token, q = pick(logits[:, -1], j, None if slot is None else [slot])
                drafts.append(token[:, None])
                qs.append(q)
            starts = [s + feed.shape[1] for s in starts]
            feed = drafts[-1]
            first = first and slot is not None
        if pick is None:
            return torch.cat(drafts, dim=1)
        return torch.cat(drafts, dim=1), torch.stack(qs, 1)

    def accepted_rows(self, n, accepted, k, context) -> None:
        if k:
            self.lengths = [nb + min(a, k - 1) for nb, a in zip(n, accepted)]

    def device_draft_keys(self, k):
        return [1, 2]  # after a step the drafter lags by 1 token, or 2 when every draft was accepted

    def draft_on_device(self, seq, lengths, key, k, context, offsets, logits=False):
        """``_chain`` on the device: the m fed tokens, then each draft fed back."""
        if logits:
            raise NotImplementedError("the AR drafter gives no per-position distributions (chains only)")
        step = unwrapped(self.model)
        feed, start = self._device_feed(seq, lengths, key, offsets)
        drafts = []
        for _ in range(k):
            width = feed.shape[1]
            out = step(feed, start[:, None] + offsets[:, :width], start)
            drafts.append(out[:, -1].argmax(-1, keepdim=True))
            start = start + width
            feed = drafts[-1]
        return torch.cat(drafts, dim=1)

    def drafted_on_device(self, n, key, k):
        super().drafted_on_device(n, key, k)
        self.forwards += k

