"""Drafting strategies over specc.models step functions, for the eager speculative loop.

A drafter sees the committed sequence and proposes k tokens; after verification it is told how
many of its drafts were accepted so it can keep exactly the valid part of its KV cache (caches
are static: "truncation" is setting a length). Strategies:

- ``ARDraft``: a small same-vocab causal LM, k sequential forwards (chain speculation).
- ``PardDraft``: committed tokens + (k - 1) ``pard_token`` slots, one causal forward.
- ``DFlashDraft``: target hidden states of newly committed tokens as context, one non-causal
  forward over [last token, mask x (b - 1)].
"""

from __future__ import annotations

import torch

from specc.models.decoder import CausalLM
from specc.models.dflash import DFlashDrafter


def _positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)[None]


def _length(start: int, device) -> torch.Tensor:
    return torch.full((1,), start, dtype=torch.long, device=device)


def _run(step, first: bool, *args):
    """Call a drafter step; its first call after ``reset`` (over the whole prompt, a shape that
    occurs once) bypasses CUDA-graph capture when the step is graphed (``GraphedStep.eager``)."""
    fn = getattr(step, "eager", None) if first else None
    return (fn or step)(*args)


class Drafter:
    method = "none"
    needs_target_hidden = False
    forwards = 0

    def setup(self, max_len: int) -> None:
        """Allocate caches for sequences of up to ``max_len`` tokens."""

    def reset(self, prompt: list[int], context: torch.Tensor | None) -> None:
        """Start a new sequence; ``context`` is the target's captured hidden states of the prompt."""

    def propose_tokens(self, seq: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Draft k tokens [1, k] on the drafter's device, without a host sync. ``seq`` [1, >= n]
        holds the committed tokens (the last, ``seq[0, n - 1]``, not yet seen by the target)."""
        raise NotImplementedError

    def propose(self, seq: list[int], k: int) -> list[int]:
        """Host-list convenience over ``propose_tokens`` (the eager loop uses it)."""
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        return self.propose_tokens(ids, len(seq), k)[0].tolist()

    def capture_shapes(self, seq: torch.Tensor, k: int) -> None:
        """Call the drafter step once with every input shape a generation with ``k`` drafts can
        produce, so that CUDA graphs (``GraphedStep``) are captured before timing starts rather
        than whenever an acceptance length first occurs. Runs right after ``reset``: what it
        writes into the KV cache lies in slots every real call rewrites before reading."""

    def accepted(self, seq_len: int, num_accepted: int, k: int, context: torch.Tensor | None) -> None:
        """Verification of a step that began with ``seq_len`` committed tokens accepted
        ``num_accepted`` of ``k`` drafts; ``context`` holds the target's captured hidden states
        of the newly committed inputs (DFlash)."""


class CausalDrafter(Drafter):
    """A drafter that is a causal LM step (specc CausalLM or its compiled step). ``length`` is
    how many committed tokens its KV cache holds."""

    def __init__(self, model: CausalLM):
        self.model = model  # a CausalLM or a compiled step with the same call signature
        self.length = 0

    def setup(self, max_len: int) -> None:
        self.model.setup_caches(1, max_len)

    def reset(self, prompt, context) -> None:
        self.length = 0

    @property
    def device(self):
        return self.model.device

    def capture_shapes(self, seq, k):
        dev = self.model.device
        extra = self.mask_slots(k)
        for fed in range(1, k + 2):  # newly committed tokens: 1 .. k + 1
            feed = seq[:, :1].expand(1, fed + extra).contiguous()
            self.model(feed, _positions(0, feed.shape[1], dev), _length(0, dev))

    def mask_slots(self, k: int) -> int:
        """Mask tokens appended after the newly committed ones in one drafting forward."""
        return 0


class ARDraft(CausalDrafter):
    method = "ar-draft"

    def propose_tokens(self, seq, n, k):
        dev = self.model.device
        drafts = []
        feed, start = seq[:, self.length:n], self.length
        for _ in range(k):
            self.forwards += 1
            logits = _run(self.model, start == 0, feed, _positions(start, feed.shape[1], dev), _length(start, dev))
            drafts.append(logits[:, -1].argmax(-1, keepdim=True))  # fed back without leaving the GPU
            start += feed.shape[1]
            feed = drafts[-1]
        return torch.cat(drafts, dim=1)

    def accepted(self, seq_len, num_accepted, k, context) -> None:
        if k:
            self.length = seq_len + min(num_accepted, k - 1)


class PardDraft(CausalDrafter):
    method = "pard"

    def __init__(self, model: CausalLM, pard_token: int):
        super().__init__(model)
        self.pard_token = int(pard_token)

    def mask_slots(self, k: int) -> int:
        return k - 1

    def propose_tokens(self, seq, n, k):
        dev = self.model.device
        masks = torch.full((1, self.mask_slots(k)), self.pard_token, dtype=torch.long, device=dev)
        feed = torch.cat([seq[:, self.length:n], masks], dim=1)
        self.forwards += 1
        logits = _run(self.model, self.length == 0, feed, _positions(self.length, feed.shape[1], dev),
                      _length(self.length, dev))
        self.length = n  # committed tokens stay, the mask slots are dropped
        return logits[:, -k:].argmax(-1)


class DFlashDraft(Drafter):
    method = "dflash"
    needs_target_hidden = True

    def __init__(self, drafter: DFlashDrafter):
        """``drafter``: a DFlashDrafter or a compiled draft step exposing ``spec``/``device``."""
        self.drafter = drafter
        self.spec = drafter.spec
        self.length = 0
        self.context: torch.Tensor | None = None

    def setup(self, max_len: int) -> None:
        self.drafter.setup_caches(1, max_len)

    def reset(self, prompt, context) -> None:
        self.length, self.context = 0, context

    @property
    def device(self):
        return self.drafter.device

    def propose_tokens(self, seq, n, k):
        dev = self.drafter.device
        masks = torch.full((1, k), self.spec.mask_token_id, dtype=torch.long, device=dev)
        block = torch.cat([seq[:, n - 1:n], masks], dim=1)
        start = n - 1
        if self.length + self.context.shape[1] != start:
            raise RuntimeError("DFlash drafter context out of step with the target")
        positions = _positions(self.length, self.context.shape[1] + block.shape[1], dev)
        self.forwards += 1
        logits = _run(self.drafter, self.length == 0, block, self.context, positions, _length(self.length, dev))
        self.length = start  # context K/V committed, block K/V dropped
        return logits.argmax(-1)

    def capture_shapes(self, seq, k):
        dev = self.drafter.device
        block = torch.full((1, k + 1), self.spec.mask_token_id, dtype=torch.long, device=dev)
        for n_ctx in range(1, k + 2):  # context rows after a step: accepted + 1 = 1 .. k + 1
            context = self.context[:, :1].expand(1, n_ctx, -1).contiguous()
            self.drafter(block, context, _positions(0, n_ctx + k + 1, dev), _length(0, dev))

    def accepted(self, seq_len, num_accepted, k, context) -> None:
        if context is not None:
            self.context = context[:, : num_accepted + 1]
