"""The speculative decoding loop over uncompiled specc.models step functions.

This is the loop the compiled engine reproduces with generated kernels; here it runs the model
definitions eagerly, which makes it the bridge in the lossless proof: stock (HF) == this loop ==
compiled. Greedy; batch 1; acceptance decided on the host.
"""

from __future__ import annotations

import torch

from specc.models.decoder import CausalLM
from specc.result import GenerationResult, GenerationStats, as_prompt_list, clip_committed
from specc.runtime.drafters import Drafter


class EagerSpeculativeDecoder:
    def __init__(self, target: CausalLM, drafter: Drafter | None = None, num_draft: int = 4,
                 max_len: int = 2048):
        self.target, self.drafter, self.num_draft, self.max_len = target, drafter, num_draft, max_len
        if drafter is not None and drafter.needs_target_hidden:
            target.capture_layers = tuple(drafter.spec.target_layer_ids)
        target.setup_caches(1, max_len + num_draft + 1)
        if drafter is not None:
            drafter.setup(max_len + num_draft + 1)

    @property
    def method(self) -> str:
        return self.drafter.method if self.drafter is not None else "ar"

    def _target(self, ids: list[int], start: int):
        dev = self.target.inv_freq.device
        out = self.target(torch.tensor([ids], device=dev), torch.arange(start, start + len(ids), device=dev)[None],
                          torch.tensor([start], device=dev))
        return out if isinstance(out, tuple) else (out, None)

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens: int, eos_token_ids=()) -> GenerationResult:
        prompt = as_prompt_list(input_ids)
        if len(prompt) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds max_len {self.max_len}")
        stats = GenerationStats()
        logits, context = self._target(prompt, 0)
        stats.target_forwards += 1
        tokens, stop = clip_committed([int(logits[0, -1].argmax())], 0, max_new_tokens, eos_token_ids)
        if self.drafter is not None:
            self.drafter.forwards = 0
            self.drafter.reset(prompt, context)
        while not stop:
            seq = prompt + tokens
            k = min(self.num_draft, max_new_tokens - len(tokens) - 1) if self.drafter is not None else 0
            drafts = self.drafter.propose(seq, k) if k > 0 else []
            logits, context = self._target([seq[-1]] + drafts, len(seq) - 1)
            stats.target_forwards += 1
            posterior = logits[0].argmax(-1).tolist()
            a = 0
            while a < len(drafts) and drafts[a] == posterior[a]:
                a += 1
            if self.drafter is not None:
                self.drafter.accepted(len(seq), a, k, context)
            step, stop = clip_committed(drafts[:a] + [posterior[a]], len(tokens), max_new_tokens, eos_token_ids)
            tokens += step
            stats.accepted_lengths.append(len(step))
        stats.draft_forwards = self.drafter.forwards if self.drafter is not None else 0
        ended = bool(tokens) and tokens[-1] in set(eos_token_ids)
        return GenerationResult(tokens, stats, self.method, "eos" if ended else "length")
