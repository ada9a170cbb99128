"""Stock AR greedy decoding over an HF model: one target forward per token."""

from __future__ import annotations

import torch

from specc.result import GenerationResult, GenerationStats, as_prompt_list, clip_committed
from specc.stock import hf


@torch.inference_mode()
def generate_ar(target, input_ids, max_new_tokens: int, eos_token_ids=()) -> GenerationResult:
    prompt = as_prompt_list(input_ids)
    stats = GenerationStats()
    cache = hf.new_cache(target)
    logits = hf.forward(target, prompt, cache, 0).logits
    stats.target_forwards += 1
    tokens, stop = clip_committed([int(logits[0, -1].argmax())], 0, max_new_tokens, eos_token_ids)
    while not stop:
        logits = hf.forward(target, tokens[-1:], cache, len(prompt) + len(tokens) - 1).logits
        stats.target_forwards += 1
        step, stop = clip_committed([int(logits[0, -1].argmax())], len(tokens), max_new_tokens, eos_token_ids)
        tokens += step
        stats.accepted_lengths.append(len(step))
    return _finish(tokens, stats, "ar", eos_token_ids)


def _finish(tokens, stats, method, eos_token_ids) -> GenerationResult:
    ended = bool(tokens) and tokens[-1] in set(eos_token_ids)
    return GenerationResult(tokens=tokens, stats=stats, method=method, finished_by="eos" if ended else "length")
