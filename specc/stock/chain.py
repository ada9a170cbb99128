"""Stock chain speculative decoding with an AR drafter (Leviathan et al., greedy).

Each step: the drafter catches up on committed tokens, then drafts k tokens one forward at a
time; the target verifies [last committed token, d1..dk] in one forward; the longest matching
prefix plus the target's own next token is committed. Caches are cropped to what stays valid.
"""

from __future__ import annotations

import torch

from specc.result import GenerationResult, as_prompt_list, clip_committed
from specc.stock import hf


@torch.inference_mode()
def generate_chain(target, draft, input_ids, max_new_tokens: int, num_draft: int = 4,
                   eos_token_ids=(), cap_to_budget: bool = True) -> GenerationResult:
    """``cap_to_budget``: draft at most as many tokens as the budget can still take (the
    default); False drafts k every step and clips the committed block instead."""
    prompt = as_prompt_list(input_ids)
    t_cache, _, tokens, stop, stats = hf.prefill(target, prompt, max_new_tokens, eos_token_ids)
    d_cache = hf.new_cache(draft)
    draft_len = 0  # positions of the committed sequence held in the draft cache
    while not stop:
        seq = prompt + tokens
        n = len(seq)
        k = min(num_draft, max_new_tokens - len(tokens) - 1) if cap_to_budget else num_draft
        drafts: list[int] = []
        if k > 0:
            feed = seq[draft_len:]
            for _ in range(k):
                out = hf.forward(draft, feed, d_cache, n - len(feed))
                stats.draft_forwards += 1
                drafts.append(int(out.logits[0, -1].argmax()))
                feed = drafts[-1:]
                n += 1
            n = len(seq)
        before = hf.snapshot(target, t_cache)  # hybrid targets: their recurrent state cannot be cropped
        out = hf.forward(target, [seq[-1]] + drafts, t_cache, n - 1)
        stats.target_forwards += 1
        posterior = out.logits[0].argmax(-1).tolist()
        committed = hf.greedy_accept(drafts, posterior)
        accepted = len(committed) - 1
        t_cache = hf.rollback(target, t_cache, before, [seq[-1]] + drafts, n - 1, n + accepted)
        draft_len = n + min(accepted, max(k - 1, 0))
        hf.crop(d_cache, draft_len)
        step, stop = clip_committed(committed, len(tokens), max_new_tokens, eos_token_ids)
        tokens += step
        stats.accepted_lengths.append(len(step))
    return GenerationResult.finish(tokens, stats, "ar-draft", eos_token_ids)
