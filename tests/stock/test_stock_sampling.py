"""The stock sampling reference: HF's own sampling matches the enumerated distribution the
statistical tests use (the oracle is right), and with no drafter the runtime's sampling loop
draws exactly stock's tokens (same processors, same counter-based random numbers)."""

import pytest
import torch
from distribution import ALPHA, exact_joint, g_test
from helpers import hf_model
from model_factory import make_hf_model, save

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.sampling import SamplingParams
from specc.stock import sample_ar

PROMPT = [5, 7, 2, 8, 9, 1, 4]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    model = make_hf_model("qwen3", seed=2, vocab_size=12, eos_token_id=11, num_hidden_layers=2)
    return save(model, tmp_path_factory, "stock-sampling-target")


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.7, top_k=4, top_p=0.9, repetition_penalty=1.3)])
def test_hf_generate_samples_the_enumerated_distribution(target, params):
    """HF ``generate(do_sample=True)`` (torch's RNG, not specc's) over 3000 runs."""
    model = hf_model(target)
    torch.manual_seed(0)
    ids = torch.tensor([PROMPT])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=2,
                         num_return_sequences=3000, temperature=params.temperature, top_k=params.top_k or None,
                         top_p=params.top_p, repetition_penalty=params.repetition_penalty, pad_token_id=0,
                         eos_token_id=None)
    p, what = g_test(out[:, len(PROMPT):].tolist(), exact_joint(model, PROMPT, 2, params))
    assert p > ALPHA, what


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=3),
                                    SamplingParams(temperature=1.3, top_p=0.9, min_p=0.05, repetition_penalty=1.2, seed=9)])
def test_runtime_without_drafter_draws_stock_tokens(target, params):
    reference = sample_ar(hf_model(target), PROMPT, 12, params)
    eager = build_eager(resolve_pair(target, None, "ar"), max_len=len(PROMPT) + 12)
    assert eager.generate(PROMPT, 12, (), params).tokens == reference.tokens
    loop = DeviceSpeculativeDecoder(eager.target, None, 0, eager.max_len)
    assert loop.generate(PROMPT, 12, (), params).tokens == reference.tokens
    other = sample_ar(hf_model(target), PROMPT, 12, SamplingParams(temperature=params.temperature, seed=params.seed + 1))
    assert other.tokens != reference.tokens  # the seed matters
    assert reference.stats.steps == 11 and reference.stats.target_forwards == 12


def test_sample_ar_refuses_greedy(target):
    with pytest.raises(ValueError, match="temperature"):
        sample_ar(hf_model(target), PROMPT, 4, SamplingParams())
