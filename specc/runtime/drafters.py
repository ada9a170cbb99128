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


def _row(ids: list[int], device) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.long, device=device)


def _positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)[None]


class Drafter:
    method = "none"
    needs_target_hidden = False
    forwards = 0

    def setup(self, max_len: int) -> None:
        """Allocate caches for sequences of up to ``max_len`` tokens."""

    def reset(self, prompt: list[int], context: torch.Tensor | None) -> None:
        """Start a new sequence; ``context`` is the target's captured hidden states of the prompt."""

    def propose(self, seq: list[int], k: int) -> list[int]:
        raise NotImplementedError

    def accepted(self, seq_len: int, num_accepted: int, k: int, context: torch.Tensor | None) -> None:
        """Verification of a step that began with ``seq_len`` committed tokens accepted
        ``num_accepted`` of ``k`` drafts; ``context`` holds the target's captured hidden states
        of the newly committed inputs (DFlash)."""


class ARDraft(Drafter):
    method = "ar-draft"

    def __init__(self, model: CausalLM):
        self.model = model  # a CausalLM or a compiled step with the same call signature
        self.length = 0

    def setup(self, max_len: int) -> None:
        self.model.setup_caches(1, max_len)

    def reset(self, prompt, context) -> None:
        self.length = 0

    def _step(self, ids: list[int], start: int) -> torch.Tensor:
        dev = self.model.device
        self.forwards += 1
        logits = self.model(_row(ids, dev), _positions(start, len(ids), dev), torch.tensor([start], device=dev))
        return logits[0, -1]

    def propose(self, seq, k):
        drafts: list[int] = []
        feed, start = seq[self.length:], self.length
        for _ in range(k):
            drafts.append(int(self._step(feed, start).argmax()))
            start += len(feed)
            feed = drafts[-1:]
        return drafts

    def accepted(self, seq_len, num_accepted, k, context) -> None:
        if k:
            self.length = seq_len + min(num_accepted, k - 1)


class PardDraft(Drafter):
    method = "pard"

    def __init__(self, model: CausalLM, pard_token: int):
        self.model, self.pard_token = model, int(pard_token)
        self.length = 0

    def setup(self, max_len: int) -> None:
        self.model.setup_caches(1, max_len)

    def reset(self, prompt, context) -> None:
        self.length = 0

    def propose(self, seq, k):
        dev = self.model.device
        feed = seq[self.length:] + [self.pard_token] * (k - 1)
        self.forwards += 1
        logits = self.model(_row(feed, dev), _positions(self.length, len(feed), dev),
                            torch.tensor([self.length], device=dev))
        self.length = len(seq)  # committed tokens stay, the mask slots are dropped
        return logits[0, -k:].argmax(-1).tolist()


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

    def propose(self, seq, k):
        dev = self.drafter.device
        block = [seq[-1]] + [self.spec.mask_token_id] * k
        start = len(seq) - 1
        positions = _positions(self.length, self.context.shape[1] + len(block), dev)
        assert self.length + self.context.shape[1] == start, "drafter context out of step with the target"
        self.forwards += 1
        logits = self.drafter(_row(block, dev), self.context, positions, torch.tensor([self.length], device=dev))
        self.length = start  # context K/V committed, block K/V dropped
        return logits[0].argmax(-1).tolist()

    def accepted(self, seq_len, num_accepted, k, context) -> None:
        if context is not None:
            self.context = context[:, : num_accepted + 1]
