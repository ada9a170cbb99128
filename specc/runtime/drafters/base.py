"""The drafting strategy interface (``Drafter``): what the loops call and the defaults a strategy
overrides."""

from __future__ import annotations

import torch

from specc.runtime.drafters.rows import move_entries
from specc.runtime.state import bind_rows, state_buffers
from specc.runtime.uploads import upload


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
        move_entries(self.lengths, src, dst, 0)

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

