"""Each logits processor equals HF transformers' own on random logits, and they compose in HF's
order (the distribution a speculative run must reproduce is the one HF sampling would use)."""

import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from specc.sampling import SamplingParams, process_logits, sampling_probs
from specc.sampling import processors as P

V = 50


def _logits(seed, rows=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g) * 3


def _context(seed, rows=16, length=12):
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randint(0, V, (rows, length), generator=g)


def _seen(ids):
    return torch.zeros(ids.shape[0], V, dtype=torch.bool).scatter_(1, ids, True)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_equals_hf(seed, penalty):
    x, ids = _logits(seed), _context(seed)
    expect = RepetitionPenaltyLogitsProcessor(penalty)(ids, x.clone())
    assert torch.equal(P.repetition_penalty(x, _seen(ids), penalty), expect)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("t", [0.3, 0.7, 1.0, 1.5])
def test_temperature_equals_hf(seed, t):
    x = _logits(seed)
    assert torch.equal(P.temperature(x, t), TemperatureLogitsWarper(t)(None, x.clone()))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [1, 2, 7, V, V + 5])
def test_top_k_equals_hf(seed, k):
    x = _logits(seed)
    x[0, :4] = x[0, 4]  # ties at the cut are kept by both
    assert torch.equal(P.top_k(x, k), TopKLogitsWarper(k)(None, x.clone()))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999, 1.0])
def test_top_p_equals_hf(seed, p):
    x = _logits(seed)
    assert torch.equal(P.top_p(x, p), TopPLogitsWarper(p)(None, x.clone()))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("p", [0.0, 0.05, 0.3, 0.9, 1.0])
def test_min_p_equals_hf(seed, p):
    x = _logits(seed)
    assert torch.equal(P.min_p(x, p), MinPLogitsWarper(p)(None, x.clone()))


def test_processors_act():
    """Each processor changes something on these logits (the equalities above are not vacuous)."""
    x, ids = _logits(0), _context(0)
    assert not torch.equal(P.repetition_penalty(x, _seen(ids), 1.5), x)
    assert torch.isinf(P.top_k(x, 3)).sum() == 16 * (V - 3)
    assert torch.isinf(P.top_p(x, 0.5)).any() and torch.isinf(P.min_p(x, 0.2)).any()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    SamplingParams(temperature=1.5, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=5, repetition_penalty=0.8),
])
def test_composition_equals_hf_list(params):
    x, ids = _logits(7), _context(7)
    hf = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(params.repetition_penalty),
                              TemperatureLogitsWarper(params.temperature)]
                             + ([TopKLogitsWarper(params.top_k)] if params.top_k else [])
                             + ([TopPLogitsWarper(params.top_p)] if params.top_p < 1 else [])
                             + ([MinPLogitsWarper(params.min_p)] if params.min_p > 0 else []))
    expect = hf(ids, x.clone())
    assert torch.equal(process_logits(x, params, _seen(ids)), expect)
    probs = sampling_probs(x, params, _seen(ids))
    assert torch.allclose(probs.sum(-1), torch.ones(16)) and torch.equal(probs == 0, torch.isinf(expect))


def test_leading_dims():
    """[B, Q, V] logits (a verify block) are processed position by position."""
    x = torch.randn(3, 4, V)
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.7, min_p=0.1)
    flat = process_logits(x.reshape(12, V), params)
    assert torch.equal(process_logits(x, params), flat.reshape(3, 4, V))


def test_repetition_penalty_needs_context():
    with pytest.raises(ValueError, match="context"):
        process_logits(torch.randn(2, V), SamplingParams(temperature=1.0, repetition_penalty=1.2))
