"""Exact next-tokens distributions of tiny-vocabulary models and a goodness-of-fit test.

Speculative sampling is lossless when its output is distributed as plain sampling from the
target. On a tiny vocabulary the target's joint distribution over the first T generated tokens
is enumerable exactly (V^T outcomes, from HF transformers' model and HF's own logits processors,
independent of specc's), and thousands of seeded runs give an empirical distribution to compare.

The G-test (likelihood ratio) over outcomes, with outcomes of expected count < 5 pooled into one
bin; an observed outcome of probability 0 fails outright. ``ALPHA`` = 1e-6: a correct sampler
fails a given test once in a million runs, while the biased acceptance rules of the tests
(which shift probabilities by several percent) fail it with p-values far below.
"""

from __future__ import annotations

import itertools

import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

ALPHA = 1e-6


def hf_processors(params) -> LogitsProcessorList:
    """HF's processors for ``params`` (a SamplingParams), in HF generate's order."""
    procs = []
    if params.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    procs.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k:
        procs.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        procs.append(TopPLogitsWarper(params.top_p))
    if params.min_p > 0.0:
        procs.append(MinPLogitsWarper(params.min_p))
    return LogitsProcessorList(procs)


@torch.no_grad()
def exact_joint(hf_model, prompt: list[int], steps: int, params) -> torch.Tensor:
    """[V] * steps tensor: P(first ``steps`` generated tokens) under plain sampling."""
    vocab = hf_model.config.vocab_size
    procs = hf_processors(params)
    joint = torch.ones(1, dtype=torch.float64)
    for t in range(steps):
        prefixes = torch.tensor(list(itertools.product(range(vocab), repeat=t)), dtype=torch.long).reshape(vocab ** t, t)
        ids = torch.cat([torch.tensor(prompt).expand(prefixes.shape[0], -1), prefixes], dim=1)
        logits = hf_model(input_ids=ids).logits[:, -1].float()
        probs = procs(ids, logits).softmax(-1).double()  # [V^t, V]
        joint = (joint.reshape(-1, 1) * probs).reshape(-1)
    return joint.reshape([vocab] * steps)


def g_test(tokens: list[list[int]], exact: torch.Tensor) -> tuple[float, str]:
    """(p-value, description) that the rows of ``tokens`` (first ``exact.dim()`` tokens each) are
    draws from ``exact``. p-value 0.0 when an outcome of probability 0 occurs."""
    steps, vocab = exact.dim(), exact.shape[0]
    flat = exact.reshape(-1)
    index = torch.zeros(len(tokens), dtype=torch.long)
    for row, toks in enumerate(tokens):
        assert len(toks) >= steps, toks
        for t in toks[:steps]:
            index[row] = index[row] * vocab + t
    n = len(tokens)
    observed = torch.bincount(index, minlength=flat.numel()).double()
    impossible = (flat == 0) & (observed > 0)
    if impossible.any():
        return 0.0, f"{int(observed[impossible].sum())} draws of outcomes with probability 0"
    expected = flat * n
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    g = 2 * float(torch.where(obs > 0, obs * (obs / exp).log(), torch.zeros_like(obs)).sum())
    dof = int(keep.sum()) - 1
    if dof < 5:  # a near-deterministic distribution would make the test vacuous
        raise ValueError(f"only {dof + 1} bins: pick a flatter distribution or more runs")
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(g / 2, dtype=torch.float64)))
    return p, f"G = {g:.1f} over {dof + 1} bins, p = {p:.3g}"
