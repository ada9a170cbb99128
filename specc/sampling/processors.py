"""The logits processors that turn logits into a sampling distribution.

Speculative sampling is lossless only if the target's distribution at every position is the
distribution plain sampling would use there, so this one module defines it for every loop (the
device loop, the eager reference loop and the stock sampling reference, ``specc.stock.sampling``): repetition penalty,
then temperature, top-k, top-p and min-p, in the order and with the exact rules of HF
transformers' ``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` (``min_tokens_to_keep`` = 1;
tests/runtime/test_sampling.py compares each on random logits). The drafter's logits go through
the same processors, which keeps its distribution close to the target's (acceptance), though
losslessness does not depend on it.

``temperature`` 0 (or None) means greedy: the loops then take their greedy path unchanged.
"""

from __future__ import annotations

import torch

from specc.sampling.params import SamplingParams

__all__ = ["process_logits", "sampling_probs", "repetition_penalty", "temperature",
           "top_k", "top_p", "min_p"]


def _flat(scores: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    return scores.reshape(-1, scores.shape[-1]), scores.shape


def repetition_penalty(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``seen`` [..., V] bool (same leading shape as ``scores``): tokens in the context."""
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalized, scores)


def temperature(scores: torch.Tensor, t: float) -> torch.Tensor:
    return scores / t


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (and any tied with the k-th)."""
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(scores < kth, float("-inf"))


def top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``p`` (at least one)."""
    flat, shape = _flat(scores)
    sorted_logits, sorted_idx = torch.sort(flat, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - p)
    remove[..., -1:] = False
    remove = remove.scatter(1, sorted_idx, remove)
    return flat.masked_fill(remove, float("-inf")).reshape(shape)


def min_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Drop tokens less likely than ``p`` times the most likely one (the most likely stays)."""
    probs = scores.softmax(-1)
    remove = probs < p * probs.amax(-1, keepdim=True)
    remove.scatter_(-1, probs.argmax(-1, keepdim=True), False)
    return scores.masked_fill(remove, float("-inf"))


def process_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [..., V] -> processed fp32 logits (-inf for tokens that cannot be sampled), in HF's
    order. ``seen`` [..., V] bool: the context's tokens (needed when a repetition penalty is set)."""
    scores = logits.float()
    if params.uses_history:
        if seen is None:
            raise ValueError("a repetition penalty needs the context's tokens (seen)")
        scores = repetition_penalty(scores, seen, params.repetition_penalty)
    scores = temperature(scores, float(params.temperature))
    if params.top_k:
        scores = top_k(scores, params.top_k)
    if params.top_p < 1.0:
        scores = top_p(scores, params.top_p)
    if params.min_p > 0.0:
        scores = min_p(scores, params.min_p)
    return scores


def sampling_probs(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The sampling distribution [..., V] (fp32, rows sum to 1) of ``process_logits``."""
    return process_logits(logits, params, seen).softmax(-1)
