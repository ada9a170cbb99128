"""``DFlashDraft``: target hidden states of newly committed tokens as context, one non-causal
forward over [last token, mask x (b - 1)]."""

from __future__ import annotations

import torch

from specc.models.dflash import DFlashDrafter
from specc.runtime.drafters.base import Drafter
from specc.runtime.drafters.rows import (
    length, merge_rows, move_entries, positions, row_positions, row_positions_at, rows_of, run_solo, run_step,
    split_rows, window)
from specc.runtime.graphs import unwrapped
from specc.runtime.uploads import upload


class DFlashDraft(Drafter):
    """Per row: ``lengths[b]`` context entries in the drafter's cache, ``context_lens[b]`` new
    target hidden states not yet fed. One batched forward feeds every row the same number C of
    trailing context entries: ``context`` (the last step's, when every row has C new ones) or
    ``window`` [B, W, n*H], each row's W newest hidden states right-aligned (W = block size),
    kept only when B > 1. With one row, a new sequence keeps its whole prompt's hidden states in
    ``fresh`` until its first draft; with more, all but the last go into the slot's cache at
    ``reset_slot`` (``_prefill_context``) and the last waits in the window, so the row's first
    draft joins the batched forward. ``fresh`` also holds rows' unfed entries across steps
    without drafting (k = 0)."""

    name = "dflash"
    needs_target_hidden = True
    supports_tree = True
    _slid = False  # ``draft_ahead_rows`` slid the window for the step ``accepted_rows`` is about

    def __init__(self, drafter: DFlashDrafter):
        """``drafter``: a DFlashDrafter or a compiled draft step exposing ``spec``/``device``."""
        self.drafter = drafter
        self.spec = drafter.spec
        self.lengths = [0]
        self.context: torch.Tensor | None = None
        self.context_lens = [0]
        self.window: torch.Tensor | None = None
        self.fresh: dict[int, torch.Tensor] = {}

    @property
    def length(self) -> int:
        return self.lengths[0]

    def setup(self, max_len: int, batch: int = 1) -> None:
        self.drafter.setup_caches(batch, max_len)

    def _state_step(self):
        return self.drafter

    def set_width(self, rows: int) -> None:
        super().set_width(rows)
        self.context_lens = (self.context_lens + [0] * rows)[:rows]
        self.context, self.window = rows_of(self.context, rows), rows_of(self.window, rows)
        stray = [b for b in self.fresh if b >= rows]
        if stray:
            raise RuntimeError(f"DFlash rows {stray} hold unfed context past width {rows}")

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        super().move_slots(src, dst)
        move_entries(self.context_lens, src, dst, 0)
        for a, b in zip(src, dst):
            if a in self.fresh:
                self.fresh[b] = self.fresh.pop(a)
        s, d = upload(src, self.device), upload(dst, self.device)
        for name in ("context", "window"):  # out of place: either may be a graph's output buffer
            rows = getattr(self, name)
            if rows is not None:
                setattr(self, name, rows.index_copy(0, d, rows[s]))

    def open_rows(self, rows: int) -> None:
        self.lengths, self.context_lens = [0] * rows, [0] * rows
        self.context, self.window, self.fresh = None, None, {}

    def reset_slot(self, slot, prompt_len, context) -> None:
        self.lengths[slot], self.context_lens[slot] = 0, prompt_len
        self.fresh[slot] = context
        if len(self.lengths) > 1:
            self._window_rows(slot, context)
            self._prefill_context(slot, context)
            self.fresh.pop(slot)  # its unfed entry is the newest in the window

    def _prefill_context(self, slot: int, context: torch.Tensor) -> None:
        """Feed all but the last of the prompt's hidden states into ``slot``'s drafter cache now,
        at the request's prefill (one forward over its whole prompt, a one-off like the target's
        prefill), so that its first draft has one new context entry, like a row that accepted
        nothing, and joins the batch's drafting forward instead of drafting alone over its whole
        prompt. The context K/V do not depend on the block, so the drafts are those of one
        forward over the whole prompt. The forward's block (two mask tokens) is discarded: its
        K/V land right after the fed entries, where the first draft writes the rest."""
        head = context.shape[1] - 1
        if head <= 0:
            return
        block = self._masks(1, 2)
        run_solo(self.drafter, slot, block, context[:, :head],
                 *row_positions([0], head + block.shape[1], self.drafter.device))
        self.lengths[slot], self.context_lens[slot] = head, 1

    def _masks(self, rows: int, width: int) -> torch.Tensor:
        return self._token_block(self.spec.mask_token_id, rows, width)

    def release_slot(self, slot) -> None:
        self.lengths[slot], self.context_lens[slot] = 0, 0
        self.fresh.pop(slot, None)

    def _window_rows(self, slot: int, context: torch.Tensor) -> None:
        """Put the last W of ``context`` [1, c, n*H] into row ``slot`` of the window."""
        width = self.spec.block_size
        if self.window is None:
            self.window = context.new_zeros(len(self.lengths), width, context.shape[-1])
        tail = context[0, -width:]
        self.window[slot, width - tail.shape[0]:] = tail

    @property
    def device(self):
        return self.drafter.device

    def propose_rows(self, seq, n, k, active=None):
        return self.propose_logits_rows(seq, n, k, active).argmax(-1)

    def propose_logits_rows(self, seq, n, k, active=None):
        if len(n) == 1 and active is None:  # batch 1 (the loop passes no ``active`` there)
            return self._propose_one(seq, n[0], k)
        dev = self.drafter.device
        rows = len(n)
        starts = [nb - 1 for nb in n]  # the block starts at the last committed token
        live = [b for b in range(rows) if active is None or active[b]]
        if any(self.lengths[b] + self.context_lens[b] != starts[b] for b in live):
            raise RuntimeError("DFlash drafter context out of step with the target")
        width = self.spec.block_size
        if self._full_window(live, k):  # every row feeds the window's W entries: one drafting shape
            c, solo = width, []
        else:
            c, solo = split_rows(list(self.context_lens), list(self.lengths), active, width)
        batched = [b for b in live if b not in solo]
        # row b re-feeds its last c - context_lens[b] cached entries; other rows write past theirs
        cache = [self.lengths[b] - (c - self.context_lens[b]) if b in batched else
                 max(self.lengths[b] + self.context_lens[b] - c, 0) if b not in solo else starts[b]
                 for b in range(rows)]
        firsts = [max(st, 0) for st in starts]  # free slots: n = 0
        if rows == 1:
            block = torch.cat([window(seq, firsts, 1), self._masks(rows, k)], dim=1)
            row_inputs = row_positions(cache, c + k + 1, dev) if batched else None
        else:  # the block's first tokens and the rows' cache lengths: one host -> device copy
            both = upload([firsts, cache], dev)
            block = torch.cat([seq.gather(1, both[0][:, None]), self._masks(rows, k)], dim=1)
            row_inputs = row_positions_at(both[1], c + k + 1)
        out = None
        if batched:
            context = self._batched_context(batched, c)
            self.forwards += 1
            first = all(self.lengths[b] == 0 for b in batched)
            out = run_step(self.drafter, first, block, context, *row_inputs)
        solo_rows = {}
        for b in solo:
            cb = self.context_lens[b]
            context = self.fresh.get(b)
            if context is None:
                context = self.window[b:b + 1, width - cb:]
            self.forwards += 1
            solo_rows[b] = run_solo(self.drafter, b, block[b:b + 1], context,
                                    *row_positions([self.lengths[b]], cb + block.shape[1], dev))
        if out is None:
            first = next(iter(solo_rows.values()))
            out = first.new_zeros((rows,) + tuple(first.shape[1:]))
        for b in live:
            self.lengths[b] = starts[b]  # context K/V committed, block K/V dropped
            self.fresh.pop(b, None)
        return merge_rows(out, solo_rows)

    def _full_window(self, live, k: int, coming: int = 0) -> bool:
        """Whether a batched draft of k tokens feeds every row the window's W = block size newest
        context entries, re-feeding the cached ones among them (their K/V are rewritten from the
        same hidden states): more than one row, a full block (k + 1 = W; a step with fewer drafts,
        e.g. a goodput rule's, feeds only what the rows need), each live row's unfed entries in
        the window (at most W, none held in ``fresh``) and at least W entries before its block
        to re-feed, counting ``coming`` more that the step being decided adds (a draft ahead: at
        least one). The drafting forward then has one shape whatever the rows accepted, and it
        depends on device state alone (``draft_ahead_rows``)."""
        width = self.spec.block_size
        return (len(self.lengths) > 1 and self.window is not None and bool(live) and k + 1 == width
                and all(b not in self.fresh and 1 <= self.context_lens[b] <= width
                        and self.lengths[b] + self.context_lens[b] + coming >= width for b in live))

    def draft_ahead_rows(self, seq, lengths, accepted, context, k):
        """The next step's full-window draft (``_full_window``), every row live: the window slid
        on the device by ``accepted`` + 1 (``accepted_rows`` then leaves it), the block [the
        last committed token, mask x k] at each row's ``lengths`` - W."""
        rows, width = len(self.lengths), self.spec.block_size
        # after this step row b has accepted + 1 <= k + 1 = W unfed entries and its start moved by as many
        if context is None or not self._full_window(range(rows), k, coming=1):
            return None
        self._slide(accepted + 1, context)
        self._slid = True
        block = torch.cat([seq.gather(1, lengths[:, None]), self._masks(rows, k)], dim=1)
        return run_step(self.drafter, False, block, self.window,
                        *row_positions_at(lengths - width, width + k + 1)).argmax(-1)

    def took_ahead(self, n, k):
        starts = [nb - 1 for nb in n]
        if any(self.lengths[b] + self.context_lens[b] != starts[b] for b in range(len(starts))):
            raise RuntimeError("DFlash drafter context out of step with the target (a draft made ahead)")
        self.forwards += 1
        self.lengths = starts  # context K/V committed, block K/V dropped

    def _propose_one(self, seq, n: int, k: int) -> torch.Tensor:
        """``propose_logits_rows`` for one live row: the same forward (its C unfed context
        entries, the block [last committed token, mask x k] at its cache length), without the
        batch's per-row bookkeeping. At batch 1 this Python runs between the step's host copy
        and the drafter's launch, while the GPU waits."""
        start = n - 1  # the block starts at the last committed token
        c, cached = self.context_lens[0], self.lengths[0]
        if cached + c != start:
            raise RuntimeError("DFlash drafter context out of step with the target")
        fresh = self.fresh.get(0)
        context = (fresh if fresh is not None else self.context)[:, :c]
        block = torch.cat([seq[:, start:start + 1], self._masks(1, k)], dim=1)
        self.forwards += 1
        out = run_step(self.drafter, cached == 0, block, context, positions(cached, c + k + 1, self.drafter.device),
                       length(cached, self.drafter.device))
        self.lengths[0] = start  # context K/V committed, block K/V dropped
        self.fresh.pop(0, None)
        return out

    def device_draft_key(self, n, k):
        """c, the context entries the draft feeds (the last step's accepted + 1), once the prompt's
        were fed (the first draft reads them all: a one-off shape) and while nothing waits unfed
        from steps without drafting."""
        if len(self.lengths) != 1 or k < 1 or self.context is None or self.fresh.get(0) is not None:
            return None
        c = self.context_lens[0]
        if not 1 <= c <= min(k + 1, self.context.shape[1]) or self.lengths[0] + c != n[0] - 1:
            return None
        return c

    def device_draft_keys(self, k):
        return list(range(1, k + 2))

    def prepare_device_draft(self, k):
        self._masks(1, k)

    def draft_on_device(self, seq, lengths, key, k, context, offsets, logits=False):
        """``_propose_one`` on the device: the block [last committed token, mask x k] at the
        drafter's cache length ``lengths - c``, the c context entries from ``context``."""
        c = key
        cached = lengths - c
        block = torch.cat([seq.gather(1, lengths[:, None]), self._masks(1, k)], dim=1)
        out = unwrapped(self.drafter)(block, context[:, :c], cached[:, None] + offsets[:, :c + k + 1], cached)
        return out if logits else out.argmax(-1)

    def drafted_on_device(self, n, key, k):
        self.forwards += 1
        self.lengths[0] = n[0] - 1  # context K/V committed, block K/V dropped
        self.fresh.pop(0, None)

    def _batched_context(self, batched: list[int], c: int) -> torch.Tensor:
        """[B, c, n*H]: each batched row's last c hidden states (other rows: filler). With one
        row: its unfed entries. With more, the window holds every row's W newest (a row that
        has just joined has one new entry, ``_prefill_context``), unless c > W: then every
        batched row holds exactly c unfed entries in ``fresh`` (steps without drafting)."""
        width = self.spec.block_size
        if len(self.lengths) == 1:
            fresh = self.fresh.get(0)
            return (fresh if fresh is not None else self.context)[:, :c]
        if c <= width:
            return self.window[:, width - c:]
        filler = self.window.new_zeros(1, c, self.window.shape[-1])
        return torch.cat([self.fresh[b][:, :c] if b in batched else filler for b in range(len(self.lengths))], dim=0)

    def _hold_pending(self, accepted: list[int], context: torch.Tensor) -> None:
        """Keep each row's unfed hidden states (those of earlier steps without drafting, then
        this step's) in ``fresh``, so the next draft feeds them all."""
        width = self.spec.block_size
        for b, a in enumerate(accepted):
            c = self.context_lens[b]
            if c <= 0:  # a free slot
                continue
            earlier = self.fresh.get(b)
            if earlier is None:
                earlier = self.context[b:b + 1, :c] if len(self.lengths) == 1 else self.window[b:b + 1, width - c:]
            self.fresh[b] = torch.cat([earlier, context[b:b + 1, :a + 1]], dim=1)

    def capture_shapes(self, seq, k):
        """Every batched drafting shape, written at each row's cached length: past every context
        entry a row keeps (a prompt's, ``_prefill_context``), where its next draft writes first."""
        dev = self.drafter.device
        rows = seq.shape[0]
        source = next(t for t in (self.context, self.window, *self.fresh.values()) if t is not None)
        block = self._masks(rows, k + 1)
        # context rows after a step: accepted + 1 = 1 .. k + 1, or the full window (``_full_window``)
        for n_ctx in sorted({*range(1, k + 2), self.spec.block_size}):
            context = source[:1, :1].expand(rows, n_ctx, -1).contiguous()
            self.drafter(block, context, *row_positions(list(self.lengths), n_ctx + k + 1, dev))

    def accepted_rows(self, n, accepted, k, context) -> None:
        """``context``: the target's hidden states of the committed inputs of the step, in order
        (a chain: the block's prefix; a tree: gathered along the accepted path)."""
        if context is None:
            return
        if k == 0:  # a step without drafting: this step's context adds to what is still unfed
            self._hold_pending(accepted, context)
        self.context_lens = [c + a + 1 if k == 0 else a + 1 for c, a in zip(self.context_lens, accepted)]
        self.context = context[:, : max(a + 1 for a in accepted)]
        slid, self._slid = self._slid, False
        if len(self.lengths) > 1 and not slid:  # slide each row's window (unless a draft ahead did)
            self._slide(upload([a + 1 for a in accepted], context.device), context)

    def _slide(self, shift: torch.Tensor, context: torch.Tensor) -> None:
        """Slide each row's window by its ``shift`` [B] (accepted + 1) new entries of ``context``."""
        width = self.spec.block_size
        if self.window is None:
            self.window = context.new_zeros(len(self.lengths), width, context.shape[-1])
        joined = torch.cat([self.window, context], dim=1)
        index = shift[:, None] + positions(0, width, context.device)
        self.window = joined.gather(1, index[..., None].expand(-1, -1, joined.shape[-1]))

