"""Stock AR greedy decoding over an HF model: one target forward per token."""

from __future__ import annotations

import torch

from specc.result import GenerationResult, as_prompt_list, clip_committed
from specc.stock import hf


@torch.inference_mode()
def generate_ar(target, input_ids, max_new_tokens: int, eos_token_ids=()) -> GenerationResult:
    prompt = as_prompt_list(input_ids)
    cache, _, tokens, stop, stats = hf.prefill(target, prompt, max_new_tokens, eos_token_ids)
    while not stop:
        logits = hf.forward(target, tokens[-1:], cache, len(prompt) + len(tokens) - 1).logits
        stats.target_forwards += 1
        step, stop = clip_committed([int(logits[0, -1].argmax())], len(tokens), max_new_tokens, eos_token_ids)
        tokens += step
        stats.accepted_lengths.append(len(step))
    return GenerationResult.finish(tokens, stats, "ar", eos_token_ids)
