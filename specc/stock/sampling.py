"""Stock AR sampling over an HF model: the reference distribution of speculative sampling.

One target forward per token; each token is drawn from the target's processed distribution
(``specc.sampling.processors``, HF's processor rules and order) with the counter-based random
numbers of ``specc.sampling.rng`` (draw ``TARGET`` at the token's position), so a fixed seed
gives a fixed reference. Speculative sampling equals it *in distribution*, not token for token
(it spends random numbers differently); with no drafter, the runtime's sampling loop draws
exactly these numbers and equals it token for token. HF's own ``generate(do_sample=True)``
draws from the same distributions with torch's generator: it checks the processors and the
distribution (tests/stock/test_sampling.py), never tokens.
"""

from __future__ import annotations

import torch

from specc.result import GenerationResult, GenerationStats, as_prompt_list, clip_committed
from specc.sampling import rng
from specc.sampling.params import SamplingParams
from specc.sampling.processors import sampling_probs
from specc.stock import hf


@torch.inference_mode()
def sample_ar(target, input_ids, max_new_tokens: int, params: SamplingParams, eos_token_ids=()) -> GenerationResult:
    """Plain sampling of ``max_new_tokens`` from ``target`` (an HF causal LM) with ``params``."""
    if params.greedy:
        raise ValueError("sample_ar needs temperature > 0 (greedy decoding is specc.stock.generate_ar)")
    prompt = as_prompt_list(input_ids)
    dev = target.device
    vocab = target.config.vocab_size
    seen = torch.zeros(1, vocab, dtype=torch.bool, device=dev)
    seen[0, prompt] = True
    seed = torch.tensor([params.seed], dtype=torch.long, device=dev)
    cache = hf.new_cache(target)
    logits = hf.forward(target, prompt, cache, 0).logits[:, -1, :vocab]
    stats = GenerationStats(target_forwards=1)
    tokens: list[int] = []
    stop = False
    first = True
    while not stop:
        position = len(prompt) + len(tokens)
        probs = sampling_probs(logits, params, seen if params.uses_history else None)
        token = int(rng.sample(probs, rng.uniform(seed, torch.tensor([position], device=dev), rng.TARGET))[0])
        step, stop = clip_committed([token], len(tokens), max_new_tokens, eos_token_ids)
        tokens += step
        if not first:
            stats.accepted_lengths.append(len(step))
        first = False
        seen[0, token] = True
        if not stop:
            logits = hf.forward(target, [token], cache, position).logits[:, -1, :vocab]
            stats.target_forwards += 1
    return GenerationResult.finish(tokens, stats, "ar", eos_token_ids)
