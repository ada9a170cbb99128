"""Stock DFlash decoding as z-lab publishes it, greedy, over HF transformers models.

Prefill the target with hidden states on; the selected layers' states of every committed token
become the drafter's context. Each step: embed [last committed token, mask x (b - 1)] with the
target's embeddings, run the drafter (context injected as K/V, non-causal block), take the
target LM head's argmax at slots 1..b-1 as drafts, verify the whole block with the target, commit
the matching prefix + the target's token, and crop both caches (drafter keeps context only).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specc.result import GenerationResult, as_prompt_list, clip_committed
from specc.stock import hf


def _context(hidden_states, layer_ids) -> torch.Tensor:
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@torch.inference_mode()
def generate_dflash(target, draft, input_ids, max_new_tokens: int, block_size: int | None = None,
                    eos_token_ids=()) -> GenerationResult:
    """``draft`` is a ``DFlashReference``; ``block_size`` defaults to the checkpoint's."""
    prompt = as_prompt_list(input_ids)
    spec = draft.spec
    block_size = block_size or spec.block_size
    t_cache, out, tokens, stop, stats = hf.prefill(target, prompt, max_new_tokens, eos_token_ids, hidden=True)
    d_cache = DynamicCache()
    ctx = _context(out.hidden_states, spec.target_layer_ids)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    while not stop:
        start = len(prompt) + len(tokens) - 1  # position of the last committed token
        b = min(block_size, max_new_tokens - len(tokens))
        drafts: list[int] = []
        if b > 1:
            block = torch.tensor([[tokens[-1]] + [spec.mask_token_id] * (b - 1)], device=target.device)
            positions = torch.arange(start - ctx.shape[1], start + b, device=target.device)[None]
            hidden = draft(embed(block), ctx, positions, d_cache)
            stats.draft_forwards += 1
            hf.crop(d_cache, start)  # keep context K/V, drop the block's
            drafts = head(hidden[:, 1:]).argmax(-1)[0].tolist()
        before = hf.snapshot(target, t_cache)  # hybrid targets: their recurrent state cannot be cropped
        out = hf.forward(target, [tokens[-1]] + drafts, t_cache, start, hidden=b > 1)
        stats.target_forwards += 1
        committed = hf.greedy_accept(drafts, out.logits[0].argmax(-1).tolist())
        t_cache = hf.rollback(target, t_cache, before, [tokens[-1]] + drafts, start, start + len(committed))
        step, stop = clip_committed(committed, len(tokens), max_new_tokens, eos_token_ids)
        tokens += step
        stats.accepted_lengths.append(len(step))
        if b > 1:
            ctx = _context(out.hidden_states, spec.target_layer_ids)[:, : len(committed)]
    return GenerationResult.finish(tokens, stats, "dflash", eos_token_ids)
