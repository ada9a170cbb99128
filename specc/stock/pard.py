"""Stock PARD decoding (AMD's parallel draft models), greedy.

The PARD drafter is a causal LM trained so that, given the committed tokens followed by k-1
copies of ``pard_token`` at the next positions, its logits at the last committed token and at
the k-1 mask slots predict the next k tokens, all in ONE forward with plain causal attention.
The mask slots' K/V are discarded afterwards; the committed tokens' K/V are kept.
"""

from __future__ import annotations

import torch

from specc.result import GenerationResult, as_prompt_list, clip_committed
from specc.stock import hf


@torch.inference_mode()
def generate_pard(target, draft, pard_token: int, input_ids, max_new_tokens: int, num_draft: int = 8,
                  eos_token_ids=(), cap_to_budget: bool = True) -> GenerationResult:
    """``cap_to_budget`` as in ``generate_chain``; PARD's published loop does not cap."""
    prompt = as_prompt_list(input_ids)
    t_cache, _, tokens, stop, stats = hf.prefill(target, prompt, max_new_tokens, eos_token_ids)
    d_cache = hf.new_cache(draft)
    draft_len = 0
    while not stop:
        seq = prompt + tokens
        n = len(seq)
        k = min(num_draft, max_new_tokens - len(tokens) - 1) if cap_to_budget else num_draft
        drafts: list[int] = []
        if k > 0:
            feed = seq[draft_len:] + [pard_token] * (k - 1)
            out = hf.forward(draft, feed, d_cache, draft_len)
            stats.draft_forwards += 1
            drafts = out.logits[0, -k:].argmax(-1).tolist()
            draft_len = n
            hf.crop(d_cache, draft_len)  # drop the mask slots
        before = hf.snapshot(target, t_cache)  # hybrid targets: their recurrent state cannot be cropped
        out = hf.forward(target, [seq[-1]] + drafts, t_cache, n - 1)
        stats.target_forwards += 1
        committed = hf.greedy_accept(drafts, out.logits[0].argmax(-1).tolist())
        t_cache = hf.rollback(target, t_cache, before, [seq[-1]] + drafts, n - 1, n + len(committed) - 1)
        step, stop = clip_committed(committed, len(tokens), max_new_tokens, eos_token_ids)
        tokens += step
        stats.accepted_lengths.append(len(step))
    return GenerationResult.finish(tokens, stats, "pard", eos_token_ids)
