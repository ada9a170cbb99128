"""The speculative loop with tokens kept on the device: one small host sync per target step.

Same algorithm and statistics as ``EagerSpeculativeDecoder`` (which it subclasses for setup,
``forced_argmax`` and streaming), but the committed sequence lives in a device buffer: drafters
read it and return their drafts as device tensors (``Drafter.propose_tokens``), the verify input
is assembled on the device, greedy acceptance (longest matching prefix, then the target's own
token) is computed on the device and written back into the buffer, and the host learns the
step's outcome from one copy of k + 2 integers. An AR drafter feeds each draft to the next
forward without leaving the GPU. This is the loop the compiled engine runs.
"""

from __future__ import annotations

import time

import torch

from specc.result import GenerationResult, GenerationStats, as_prompt_list, clip_committed
from specc.runtime.eager import EagerSpeculativeDecoder


def greedy_accept(drafts: torch.Tensor, posterior: torch.Tensor):
    """drafts [1, k], posterior [1, k + 1] -> (accepted count [1], committed [1, k + 1]).

    committed[i] = drafts[i] for i < a, posterior[a] at i = a (entries after a are junk)."""
    k = drafts.shape[1]
    if k == 0:
        return torch.zeros(1, dtype=torch.long, device=posterior.device), posterior
    accepted = (drafts == posterior[:, :k]).long().cumprod(dim=1).sum(dim=1)
    index = torch.arange(k + 1, device=posterior.device)[None]
    padded = torch.cat([drafts, posterior[:, k:]], dim=1)
    return accepted, torch.where(index < accepted[:, None], padded, posterior)


class PartTimer:
    """Wall time per loop part (prefill / draft / verify / accept). Synchronises the device at
    each boundary, so it perturbs what it measures a little: on only when asked (profile=True)."""

    def __init__(self, device: torch.device):
        self.device, self.parts, self._last = device, {}, None

    def mark(self, part: str | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        if self._last is not None:
            name, start = self._last
            self.parts[name] = self.parts.get(name, 0.0) + now - start
        self._last = (part, now) if part else None


class _NoTimer:
    parts: dict = {}

    def mark(self, part) -> None:
        pass


class DeviceSpeculativeDecoder(EagerSpeculativeDecoder):
    """``capture_shapes``: before the first generation's first step, call the drafter with every
    input shape it can see (``Drafter.capture_shapes``) so graphed steps are all captured up
    front. Set on CUDA, where the engine also drafts the full k at the end of the budget
    (``cap_to_budget=False``: the surplus is clipped) so that verification has one shape."""

    profile = False  # set True to time the loop's parts (``self.part_seconds`` after a run)
    capture_shapes = False
    _shapes_captured = False

    def resize(self, max_len: int) -> None:
        super().resize(max_len)
        self._shapes_captured = False  # graphed steps drop their graphs with the old caches

    def _target_dev(self, ids: torch.Tensor, start: int):
        dev = ids.device
        out = self.target(ids, torch.arange(start, start + ids.shape[1], device=dev)[None],
                          torch.full((1,), start, dtype=torch.long, device=dev))
        return out if isinstance(out, tuple) else (out, None)

    def _loop(self, input_ids, max_new_tokens: int, eos_token_ids=()):
        prompt = as_prompt_list(input_ids)
        if len(prompt) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds max_len {self.max_len}")
        dev = self.target.device
        seq = torch.zeros(1, len(prompt) + max_new_tokens + self.num_draft + 2, dtype=torch.long, device=dev)
        seq[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        stats = GenerationStats()
        timer = PartTimer(dev) if self.profile else _NoTimer()
        timer.mark("prefill")
        n = len(prompt)
        logits, context = self._target_dev(seq[:, :n], 0)
        stats.target_forwards += 1
        first = logits[:, -1].argmax(-1)
        seq[:, n] = first
        tokens, stop = clip_committed([int(first)], 0, max_new_tokens, eos_token_ids)
        yield from tokens
        if self.drafter is not None:
            self.drafter.forwards = 0
            self.drafter.reset(prompt, context)
            if self.capture_shapes and not self._shapes_captured and self.num_draft > 0:
                self.drafter.capture_shapes(seq, self.num_draft)
                self._shapes_captured = True
        while not stop:
            n = len(prompt) + len(tokens)  # committed; seq[0, n - 1] not yet seen by the target
            k = 0
            if self.drafter is not None:
                k = min(self.num_draft, max_new_tokens - len(tokens) - 1) if self.cap_to_budget else self.num_draft
            timer.mark("draft")
            drafts = self.drafter.propose_tokens(seq, n, k) if k > 0 else seq[:, :0]
            timer.mark("verify")
            logits, context = self._target_dev(torch.cat([seq[:, n - 1:n], drafts], dim=1), n - 1)
            stats.target_forwards += 1
            timer.mark("accept")
            accepted, committed = greedy_accept(drafts, logits.argmax(-1))
            seq[:, n:n + k + 1] = committed
            host = torch.cat([accepted, committed[0]]).tolist()  # the step's one device -> host copy
            a = host[0]
            if self.drafter is not None:
                self.drafter.accepted(n, a, k, context)
            step, stop = clip_committed(host[1:a + 2], len(tokens), max_new_tokens, eos_token_ids)
            tokens += step
            stats.accepted_lengths.append(len(step))
            yield from step
        timer.mark(None)
        self.part_seconds = dict(timer.parts)
        stats.draft_forwards = self.drafter.forwards if self.drafter is not None else 0
        return GenerationResult.finish(tokens, stats, self.method, eos_token_ids)
