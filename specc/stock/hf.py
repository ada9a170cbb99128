"""Thin helpers over HF transformers models shared by the stock loops."""

from __future__ import annotations

import copy
import warnings

import torch
from transformers import DynamicCache

from specc.result import GenerationStats, clip_committed


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def forward(model, ids: list[int] | torch.Tensor, cache: DynamicCache, start: int, hidden: bool = False):
    """Run ``ids`` at positions start.. through an HF causal LM, appending to ``cache``."""
    if not torch.is_tensor(ids):
        ids = torch.tensor([ids], dtype=torch.long, device=model.device)
    positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
    with warnings.catch_warnings():  # transformers >= 5.2x renames past_key_values -> cache
        warnings.simplefilter("ignore", FutureWarning)
        return model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True,
                 output_hidden_states=hidden)


def prefill(target, prompt: list[int], max_new_tokens: int, eos_token_ids, hidden: bool = False):
    """Run the target on the prompt: (cache, model output, first committed tokens, stop, stats)."""
    stats = GenerationStats()
    cache = new_cache(target)
    out = forward(target, prompt, cache, 0, hidden=hidden)
    stats.target_forwards += 1
    tokens, stop = clip_committed([int(out.logits[0, -1].argmax())], 0, max_new_tokens, eos_token_ids)
    return cache, out, tokens, stop, stats


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions (negative crop: the form every transformers 4.4x-5.x takes)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def is_recurrent(model) -> bool:
    """Whether the HF model has linear-attention (recurrent) layers: a hybrid Qwen3.5 / Qwen3-Next."""
    return "linear_attention" in (getattr(model.config, "layer_types", None) or ())


def check_cached_blocks(model) -> None:
    """Refuse (one line) an HF recurrent model whose modeling ignores the cache for multi-token
    inputs (older transformers' qwen3_next ran such blocks from a zero state): a verify block
    fed at once must match the same tokens fed one by one. Runs once per model."""
    if getattr(model, "_specc_blocks_checked", False):
        return
    from specc.errors import UserError

    vocab = int(model.config.vocab_size)
    ids = [(7 * i + 3) % vocab for i in range(7)]
    whole, steps = new_cache(model), new_cache(model)
    forward(model, ids[:4], whole, 0)
    forward(model, ids[:4], steps, 0)
    block = forward(model, ids[4:], whole, 4).logits[0].float()
    one = torch.cat([forward(model, ids[4 + j:5 + j], steps, 4 + j).logits[0].float() for j in range(3)])
    if (block - one).norm() > 0.05 * one.norm():
        raise UserError(f"{type(model).__name__}: this transformers version's modeling ignores the cache for "
                        "multi-token inputs, so its verify steps are wrong; upgrade transformers (5.24 is right)")
    model._specc_blocks_checked = True


def snapshot(model, cache: DynamicCache) -> DynamicCache | None:
    """Before a verify forward: a copy of a recurrent model's cache (its GDN states cannot be
    cropped), None for attention-only models (``crop`` rolls those back)."""
    if not is_recurrent(model):
        return None
    check_cached_blocks(model)
    return copy.deepcopy(cache)


def rollback(model, cache: DynamicCache, before: DynamicCache | None, inputs: list[int], start: int,
             keep: int) -> DynamicCache:
    """After a verify forward of ``inputs`` at ``start``: the cache holding exactly the first
    ``keep`` positions. Attention-only models: a crop. Recurrent models: the cache as it is when
    every input is kept, else the snapshot taken before the forward with the kept inputs replayed
    through it (plain, obviously right; one extra forward per partially accepted step)."""
    if before is None:
        crop(cache, keep)
        return cache
    kept = keep - start
    if kept == len(inputs):
        return cache
    if kept > 0:
        forward(model, inputs[:kept], before, start)
    return before


def greedy_accept(drafts: list[int], posterior: list[int]) -> list[int]:
    """Greedy verification: accepted drafts followed by the target's own next token.

    posterior[i] is the target's argmax after the block's i-th input, so drafts[i] is accepted
    while it equals posterior[i]; the first disagreement (or the end) yields posterior[a].
    """
    a = 0
    while a < len(drafts) and drafts[a] == posterior[a]:
        a += 1
    return drafts[:a] + [posterior[a]]
