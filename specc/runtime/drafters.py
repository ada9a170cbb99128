"""Drafting strategies over step functions (model definitions or compiled steps).

A drafter sees the committed sequences of a batch of rows and proposes k tokens per row; after
verification it is told how many of each row's drafts were accepted so it can keep exactly the
valid part of its KV cache (caches are static: "truncation" is setting a length). Per-row
lengths are host lists mirrored from the loop's one host copy per step (they pick shapes); the
tokens stay on the device. Strategies, registered in :data:`DRAFTERS` by their ``name`` (the
speculation method's drafting strategy) and built from an artifact's manifest with
``from_manifest(step, section)``:

- ``ARDraft``: a small same-vocab causal LM, k sequential forwards (chain speculation).
- ``PardDraft``: committed tokens + (k - 1) ``pard_token`` slots, one causal forward.
- ``DFlashDraft``: target hidden states of newly committed tokens as context, one non-causal
  forward over [last token, mask x (b - 1)].

Rows of a batch may have committed different numbers of tokens since the drafter last saw
them; the drafter then feeds every row the same number m of trailing committed tokens (DFlash:
m trailing target hidden states, from a window of each row's newest ones), re-feeding (and
rewriting with the same values) some already-cached ones for rows that are behind by less than
m. A row that cannot join that one forward drafts *alone* in its slot (``slot_view``: a batch-1
forward on views of its cache rows): a row too short to re-feed m tokens. A request that joins
a batch has its prompt read into its slot's cache at its prefill (DFlash: the prompt's hidden
states, in ``reset_slot``; the causal drafters: its tokens, ``feed_prompt``), so its first draft
joins the batched forward instead of reading the whole prompt alone. Rows the
loop marks inactive (finished, free slots) ride along in the batched forward with inputs whose
cache writes land past anything they keep. Batch 1 takes the same slicing path as before (no
extra device ops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specc.models.dflash import DFlashDrafter
from specc.runtime.graphs import unwrapped
from specc.runtime.state import bind_rows, slot_view, state_buffers
from specc.runtime.uploads import upload

if TYPE_CHECKING:  # pragma: no cover - annotations only: the runtime runs generated steps
    from specc.models.decoder import CausalLM


_COUNTS: dict[torch.device, torch.Tensor] = {}


def _counting(end: int, device) -> torch.Tensor:
    """0, 1, 2, ... (at least ``end`` of them, long) on ``device``, made once per device and
    regrown by doubling. Batch-1 positions and cache lengths are views of it (``_positions``,
    ``_length``): no tensor op per drafting step, whose host work before the drafter's launch the
    GPU waits through at batch 1. Made outside inference mode, so the views serve any caller;
    steps only read their inputs."""
    device = torch.device(device)
    table = _COUNTS.get(device)
    if table is None or table.shape[0] < end:
        with torch.inference_mode(False):
            table = torch.arange(max(end, 2 * (0 if table is None else table.shape[0]), 4096), device=device)
        _COUNTS[device] = table
    return table


def _positions(start: int, n: int, device) -> torch.Tensor:
    """[[start, .., start + n - 1]]: a view of ``_counting``."""
    return _counting(start + n, device)[start:start + n][None]


def _length(start: int, device) -> torch.Tensor:
    """[start]: a view of ``_counting``."""
    return _counting(start + 1, device)[start:start + 1]


def _rows(starts: list[int], n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, n] (row b: starts[b] ..) and cache_len [B] (= starts) for a batch."""
    if len(starts) == 1:
        return _positions(starts[0], n, device), _length(starts[0], device)
    return _rows_at(upload(starts, device), n)


def _rows_at(cache_len: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_rows`` for cache lengths already on the device: one op."""
    return cache_len[:, None] + _positions(0, n, cache_len.device), cache_len


def _window(seq: torch.Tensor, starts: list[int], m: int) -> torch.Tensor:
    """Row b's tokens seq[b, starts[b] : starts[b] + m] -> [B, m]."""
    if len(set(starts)) == 1:
        return seq[:, starts[0]:starts[0] + m]
    if min(starts) < 0:
        raise RuntimeError(f"a drafting window starts before its sequence (starts {starts})")
    return seq.gather(1, upload(starts, seq.device)[:, None] + _positions(0, m, seq.device))


def _run(step, first: bool, *args):
    """Call a drafter step; its first call after ``reset`` (over the whole prompt, a shape that
    occurs once) bypasses CUDA-graph capture when the step is graphed (``GraphedStep.eager``)."""
    fn = getattr(step, "eager", None) if first else None
    return (fn or step)(*args)


def _solo(step, slot: int, *args):
    """One row's forward in its own slot (batch-1 views of its cache rows), never graphed."""
    with slot_view(step, slot):
        return _run(step, True, *args)


def _move_entries(values: list, src: list[int], dst: list[int], free) -> None:
    """``values[dst[i]] = values[src[i]]``, then ``values[src[i]] = free`` (slot moves)."""
    moved = [values[a] for a in src]
    for a in src:
        values[a] = free
    for b, value in zip(dst, moved):
        values[b] = value


def _rows_of(tensor: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """``tensor`` [B, ...] cut to its first ``rows`` rows or padded with zero rows (free slots)."""
    if tensor is None or tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows]
    return torch.cat([tensor, tensor.new_zeros((rows - tensor.shape[0],) + tuple(tensor.shape[1:]))])


def _merge_rows(out: torch.Tensor, rows: dict[int, torch.Tensor]) -> torch.Tensor:
    """``out`` with row b replaced by ``rows[b]`` (out of place: ``out`` may be a graph's buffer)."""
    if not rows:
        return out
    index = upload(list(rows), out.device)
    return out.index_put((index,), torch.cat(list(rows.values()), dim=0))


def _split_rows(lags: list[int], history: list[int], active: list[bool] | None,
                window: int) -> tuple[int, list[int]]:
    """(m, solo rows): the rows that join one batched forward feed ``m`` trailing entries each
    (the largest lag among them); a row drafts alone when it lags by more than ``window`` (it
    has just joined: its first draft reads its whole prompt) unless every active row is in the
    same position (a batch that started together), or when it has fewer than ``m - lag``
    entries before its new ones to re-feed. Inactive rows never draft alone."""
    act = [b for b in range(len(lags)) if active is None or active[b]]
    if not act:
        return 1, []
    if len({lags[b] for b in act}) == 1:  # every row alike (e.g. a batch that started together)
        return lags[act[0]], []
    solo = [b for b in act if lags[b] > window]
    rest = [b for b in act if lags[b] <= window]
    while rest:
        m = max(lags[b] for b in rest)
        short = [b for b in rest if history[b] < m - lags[b]]
        if not short:
            return m, solo
        solo += short
        rest = [b for b in rest if b not in short]
    return 1, solo


class Drafter:
    """A drafting strategy. ``name``: its key in :data:`DRAFTERS` (``method`` is the old name of
    the same attribute). The batch interface (used by the device loop) is ``propose_rows`` /
    ``accepted_rows`` over per-row committed lengths; ``propose`` / ``accepted`` are the
    batch-1 host-list forms the eager reference loop uses."""

    name = "none"
    needs_target_hidden = False
    # whether ``propose_logits_rows`` gives a distribution at every drafted position from one
    # forward (parallel drafters): what a draft tree is built from (``specc.runtime.trees``)
    supports_tree = False
    forwards = 0

    @property
    def method(self) -> str:
        return self.name

    @classmethod
    def from_manifest(cls, step, section: dict | None) -> "Drafter":
        """Build from the drafter's step and the artifact manifest's ``drafter`` section."""
        return cls(step)

    def setup(self, max_len: int, batch: int = 1) -> None:
        """Allocate caches for ``batch`` rows of up to ``max_len`` tokens."""

    def reset(self, prompt, context: torch.Tensor | None) -> None:
        """Start new sequences. ``prompt``: a token list (one row) or per-row prompt lengths
        (``list[int]`` via :meth:`reset_rows`); ``context``: the target's captured hidden states
        of the prompts."""
        self.reset_rows([len(prompt)], context)

    def reset_rows(self, prompt_lens: list[int], context: torch.Tensor | None) -> None:
        """Start ``len(prompt_lens)`` new sequences at once (row b's prompt hidden states:
        ``context[b, :prompt_lens[b]]``)."""
        self.open_rows(len(prompt_lens))
        for b, plen in enumerate(prompt_lens):
            self.reset_slot(b, plen, None if context is None else context[b:b + 1, :plen])

    def open_rows(self, rows: int) -> None:
        """Forget every sequence; ``rows`` slots, all free."""
        self.lengths = [0] * rows

    def reset_slot(self, slot: int, prompt_len: int, context: torch.Tensor | None) -> None:
        """Start a new sequence in ``slot`` (the others keep theirs): its prompt has
        ``prompt_len`` tokens; ``context`` [1, prompt_len, n*H]: the target's captured hidden
        states of the prompt (DFlash), else None."""
        self.lengths[slot] = 0

    def _token_block(self, token: int, rows: int, width: int) -> torch.Tensor:
        """[rows, width] of ``token`` on the drafter's device, kept per (token, shape): drafting
        asks for the same mask block every step, and a tensor made per step is a launch the GPU
        waits through at batch 1. Read only."""
        blocks = self.__dict__.setdefault("_token_blocks", {})
        block = blocks.get((token, rows, width))
        if block is None:
            block = blocks[(token, rows, width)] = torch.full((rows, width), token, dtype=torch.long,
                                                              device=self.device)
        return block

    def feed_prompt(self, slot: int, tokens: torch.Tensor) -> None:
        """``tokens`` [1, P]: the prompt of the sequence ``reset_slot`` just started in ``slot``
        (the device loop calls it at the request's prefill). A drafter may read it into its
        cache now so that the row's first draft joins the batch's drafting forward."""

    def release_slot(self, slot: int) -> None:
        """``slot``'s sequence is over (its request finished or was cancelled)."""
        self.lengths[slot] = 0

    # --- batch buckets (``DeviceSpeculativeDecoder.set_width`` / ``move_slots``) ------------------

    def _state_step(self):
        """The step whose state buffers hold this drafter's per-row caches (None: no caches)."""
        return None

    def keep_slots(self) -> None:
        """Note the caches ``setup`` just allocated (every slot): ``set_width`` binds their first
        rows. The device loop calls it after each ``setup``."""
        step = self._state_step()
        self._slot_buffers = state_buffers(step) if step is not None else {}

    def set_width(self, rows: int) -> None:
        """Draft for the first ``rows`` of the slots ``setup`` allocated (a batch bucket; the
        slots from ``rows`` on are free): per-row host state is cut or padded with free rows and
        the caches are bound as views of the allocation's first rows."""
        self.lengths = (self.lengths + [0] * rows)[:rows]
        step = self._state_step()
        if step is not None:
            bind_rows(step, self._slot_buffers, rows)

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        """Move the sequences of slots ``src`` to the free slots ``dst`` (pairwise; ``src`` are
        then free): their cache rows (one copy per buffer) and per-row host state."""
        step = self._state_step()
        if step is not None:
            s, d = upload(src, self.device), upload(dst, self.device)
            for buffer in state_buffers(step).values():
                buffer[d] = buffer[s]
        _move_entries(self.lengths, src, dst, 0)

    def propose_rows(self, seq: torch.Tensor, n: list[int], k: int, active: list[bool] | None = None) -> torch.Tensor:
        """Draft k tokens per row, [B, k] on the device, without a host sync. ``seq`` [B, L]
        holds the committed tokens; row b has ``n[b]`` (the last, ``seq[b, n[b] - 1]``, not
        yet seen by the target). ``active[b]`` False: row b's drafts are not wanted (a finished
        request or a free slot); None: every row."""
        raise NotImplementedError

    def propose_logits_rows(self, seq: torch.Tensor, n: list[int], k: int,
                            active: list[bool] | None = None) -> torch.Tensor:
        """The drafter's logits at each of the k drafted positions, [B, k, V] on the device, from
        the same single forward ``propose_rows`` runs (its drafts are their argmax). Parallel
        drafters only (``supports_tree``): a tree step builds its draft tree from them."""
        raise NotImplementedError(f"the {self.name} drafter gives no per-position distributions (chains only)")

    def propose_sampled_rows(self, seq: torch.Tensor, n: list[int], k: int, pick, active=None):
        """Speculative sampling's drafts: ``pick(logits [R, V], j, rows) -> (token [R], q [R, V])``
        draws the j-th draft of ``rows`` (None: every row) from the drafter's logits there
        (``specc.runtime.policy``). Returns (drafts [B, k], q [B, k, V]). A parallel drafter picks
        each position from its one forward's logits (their marginals; each draft is drawn from
        exactly the q it reports)."""
        logits = self.propose_logits_rows(seq, n, k) if active is None else self.propose_logits_rows(seq, n, k, active=active)
        picked = [pick(logits[:, j], j, None) for j in range(k)]
        return torch.stack([t for t, _ in picked], 1), torch.stack([q for _, q in picked], 1)

    def accepted_rows(self, n: list[int], accepted: list[int], k: int, context: torch.Tensor | None) -> None:
        """Verification of a step that began with ``n[b]`` committed tokens per row accepted
        ``accepted[b]`` of ``k`` drafts; ``context`` holds the target's captured hidden states
        of the step's inputs (DFlash)."""

    def propose_tokens(self, seq: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Batch-1 form of ``propose_rows``."""
        return self.propose_rows(seq, [n], k)

    def propose(self, seq: list[int], k: int) -> list[int]:
        """Host-list convenience (the eager reference loop uses it)."""
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        return self.propose_rows(ids, [len(seq)], k)[0].tolist()

    def propose_logits(self, seq: list[int], k: int) -> torch.Tensor:
        """Host-list form of ``propose_logits_rows``: [1, k, V] (the eager reference loop)."""
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        return self.propose_logits_rows(ids, [len(seq)], k)

    def accepted(self, seq_len: int, num_accepted: int, k: int, context: torch.Tensor | None) -> None:
        """Batch-1 form of ``accepted_rows``."""
        self.accepted_rows([seq_len], [num_accepted], k, context)

    def capture_shapes(self, seq: torch.Tensor, k: int) -> None:
        """Call the drafter step once with every input shape a generation with ``k`` drafts can
        produce, so that CUDA graphs (``GraphedStep``) are captured before timing starts rather
        than whenever an acceptance length first occurs. Runs right after ``reset``: what it
        writes into the KV cache lies in slots every real call rewrites before reading."""

    # --- drafting inside a whole-step graph (batch 1; ``specc.runtime.step_graphs``) --------------

    def device_draft_key(self, n: list[int], k: int):
        """The key of the next batch-1 draft of k tokens when it can run from device tensors at
        fixed addresses alone (``draft_on_device``): what fixes its shapes, e.g. the committed
        tokens not yet fed. None: this draft cannot (the first one over a whole prompt, a batch,
        a strategy without a device draft); the step then runs unfused."""
        return None

    def device_draft_keys(self, k: int) -> list:
        """Every key ``device_draft_key`` can give for k drafts (the graphs captured up front)."""
        return []

    def prepare_device_draft(self, k: int) -> None:
        """Make, outside any capture, the constant tensors ``draft_on_device`` reads (mask blocks)."""

    def draft_on_device(self, seq: torch.Tensor, lengths: torch.Tensor, key, k: int,
                        context: torch.Tensor | None, offsets: torch.Tensor, logits: bool = False) -> torch.Tensor:
        """The batch-1 draft [1, k] that ``propose_rows`` would give (``logits``: the [1, k, V]
        of ``propose_logits_rows``, parallel drafters), computed with device ops only from
        ``seq`` [1, L] (committed tokens), ``lengths`` [1] (the target state's length:
        committed - 1), the loop's ``context`` buffer (target hidden states, DFlash) and
        ``offsets`` [1, W] (0, 1, 2, ...): no host value but ``key`` and ``k`` (it is captured
        into a CUDA graph and replayed on later steps). Host bookkeeping: ``drafted_on_device``."""
        raise NotImplementedError(f"the {self.name} drafter has no device draft")

    def drafted_on_device(self, n: list[int], key, k: int) -> None:
        """What ``propose_rows`` does on the host besides drafting, after a ``draft_on_device`` of
        the step that began with ``n`` committed tokens."""

    # --- drafting ahead at batch > 1 (``DeviceSpeculativeDecoder.batch_draft_ahead``) ------------

    def draft_ahead_rows(self, seq: torch.Tensor, lengths: torch.Tensor, accepted: torch.Tensor,
                         context: torch.Tensor | None, k: int) -> torch.Tensor | None:
        """The next step's drafts [B, k], launched from device tensors alone before the host has
        read this step's outcome: ``seq`` [B, L] and ``lengths`` [B] (the target state's lengths,
        committed - 1) after this step's commit, ``accepted`` [B] this step's accepted counts on
        the device, ``context`` this step's captured hidden states (DFlash). The same drafts the
        next step's ``propose_rows`` would make (every row live), only earlier. None: this
        drafter cannot here (nothing changed). Host bookkeeping: ``accepted_rows`` as always,
        then ``took_ahead`` when the next step takes the drafts (a step that discards them
        leaves the drafter as if it had not drafted)."""
        return None

    def took_ahead(self, n: list[int], k: int) -> None:
        """The step that began with ``n`` committed tokens per row took the drafts
        ``draft_ahead_rows`` made for it: what ``propose_rows`` does on the host besides drafting."""
        raise NotImplementedError(f"the {self.name} drafter does not draft ahead")


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
            self.model(feed, *_rows(list(self.lengths), feed.shape[1], dev))

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
        _solo(self.model, slot, tokens, *_rows([0], tokens.shape[1], self.model.device))
        self.lengths[slot] = tokens.shape[1]

    def _fed(self, n: list[int], k: int = 1, active: list[bool] | None = None) -> tuple[list[int], int, list[int]]:
        """(per-row start, m, solo rows): the batched forward feeds every row its last m
        committed tokens (inactive rows: a window clamped into their cache); solo rows draft
        alone (:func:`_split_rows`)."""
        lags = [nb - lb for nb, lb in zip(n, self.lengths)]
        self._widest = max(getattr(self, "_widest", 0), k + 1)  # a lag after any step so far (k can shrink)
        m, solo = _split_rows(lags, list(self.lengths), active, self._widest)
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
        return _merge_rows(out, rows)

    def _call(self, slot, first, *args):
        return _run(self.model, first, *args) if slot is None else _solo(self.model, slot, *args)

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
        feed = _window(seq, starts, m)
        for j in range(k):
            self.forwards += 1
            logits = self._call(slot, first, feed, *_rows(starts, feed.shape[1], dev))
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
        feed = torch.cat([_window(seq, starts, m), self._masks(seq.shape[0], self.mask_slots(k))], dim=1)
        self.forwards += 1
        logits = self._call(slot, first, feed, *_rows(starts, feed.shape[1], dev))
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
        feed = torch.cat([seq.gather(1, start[:, None] + _positions(0, width, seq.device)),
                          self._masks(rows, self.mask_slots(k))], dim=1)
        return _run(self.model, False, feed, *_rows_at(start, feed.shape[1]))[:, -k:].argmax(-1)

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
        self.context, self.window = _rows_of(self.context, rows), _rows_of(self.window, rows)
        stray = [b for b in self.fresh if b >= rows]
        if stray:
            raise RuntimeError(f"DFlash rows {stray} hold unfed context past width {rows}")

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        super().move_slots(src, dst)
        _move_entries(self.context_lens, src, dst, 0)
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
        _solo(self.drafter, slot, block, context[:, :head], *_rows([0], head + block.shape[1], self.drafter.device))
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
            c, solo = _split_rows(list(self.context_lens), list(self.lengths), active, width)
        batched = [b for b in live if b not in solo]
        # row b re-feeds its last c - context_lens[b] cached entries; other rows write past theirs
        cache = [self.lengths[b] - (c - self.context_lens[b]) if b in batched else
                 max(self.lengths[b] + self.context_lens[b] - c, 0) if b not in solo else starts[b]
                 for b in range(rows)]
        firsts = [max(st, 0) for st in starts]  # free slots: n = 0
        if rows == 1:
            block = torch.cat([_window(seq, firsts, 1), self._masks(rows, k)], dim=1)
            row_inputs = _rows(cache, c + k + 1, dev) if batched else None
        else:  # the block's first tokens and the rows' cache lengths: one host -> device copy
            both = upload([firsts, cache], dev)
            block = torch.cat([seq.gather(1, both[0][:, None]), self._masks(rows, k)], dim=1)
            row_inputs = _rows_at(both[1], c + k + 1)
        out = None
        if batched:
            context = self._batched_context(batched, c)
            self.forwards += 1
            first = all(self.lengths[b] == 0 for b in batched)
            out = _run(self.drafter, first, block, context, *row_inputs)
        solo_rows = {}
        for b in solo:
            cb = self.context_lens[b]
            context = self.fresh.get(b)
            if context is None:
                context = self.window[b:b + 1, width - cb:]
            self.forwards += 1
            solo_rows[b] = _solo(self.drafter, b, block[b:b + 1], context,
                                 *_rows([self.lengths[b]], cb + block.shape[1], dev))
        if out is None:
            first = next(iter(solo_rows.values()))
            out = first.new_zeros((rows,) + tuple(first.shape[1:]))
        for b in live:
            self.lengths[b] = starts[b]  # context K/V committed, block K/V dropped
            self.fresh.pop(b, None)
        return _merge_rows(out, solo_rows)

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
        return _run(self.drafter, False, block, self.window, *_rows_at(lengths - width, width + k + 1)).argmax(-1)

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
        out = _run(self.drafter, cached == 0, block, context, _positions(cached, c + k + 1, self.drafter.device),
                   _length(cached, self.drafter.device))
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
            self.drafter(block, context, *_rows(list(self.lengths), n_ctx + k + 1, dev))

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
        index = shift[:, None] + _positions(0, width, context.device)
        self.window = joined.gather(1, index[..., None].expand(-1, -1, joined.shape[-1]))


DRAFTERS: dict[str, type[Drafter]] = {cls.name: cls for cls in (ARDraft, PardDraft, DFlashDraft)}


def drafts_ahead(strategy: str | None) -> bool:
    """Whether the drafting strategy ``strategy`` (a :data:`DRAFTERS` key) drafts ahead at batch
    > 1 (overrides ``Drafter.draft_ahead_rows``): what the cost model asks before pricing a
    batched one-level step's host work as hidden behind the next draft."""
    cls = DRAFTERS.get(strategy or "")
    return cls is not None and cls.draft_ahead_rows is not Drafter.draft_ahead_rows


def drafter_from_manifest(name: str, step, section: dict | None = None) -> Drafter | None:
    """The registered drafting strategy ``name`` over ``step``, or None for plain AR (no
    drafter registered under that name)."""
    cls = DRAFTERS.get(name)
    return None if cls is None or step is None else cls.from_manifest(step, section)
