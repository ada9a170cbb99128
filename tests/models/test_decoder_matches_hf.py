"""specc.models.CausalLM equals HF transformers eager on the same weights (fp32, CPU)."""

import pytest
import torch
from model_factory import make_hf_model, save
from helpers import PROMPT

from specc.models import load_model


def _logits(model, ids, start):
    pos = torch.arange(start, start + ids.shape[1])[None].expand(ids.shape[0], -1)
    return model(ids, pos, torch.full((ids.shape[0],), start))


@pytest.mark.parametrize("overrides", [{}, {"num_key_value_heads": 1}, {"num_key_value_heads": 4, "tie_word_embeddings": False}])
def test_prefill_and_incremental_match_hf(family, overrides, tmp_path_factory):
    hf = make_hf_model(family, seed=11, **overrides)
    path = save(hf, tmp_path_factory, f"eq-{family}")
    ours = load_model(path).model
    ours.setup_caches(1, 64)
    ids = torch.tensor([PROMPT + [60, 61, 62]])
    with torch.no_grad():
        ref = hf(ids).logits
        full = _logits(ours, ids, 0)
        torch.testing.assert_close(full, ref, rtol=1e-4, atol=5e-5)
        parts = [_logits(ours, ids[:, :4], 0)]
        for t in range(4, ids.shape[1], 3):  # verify-style chunks of 3 over the cache
            parts.append(_logits(ours, ids[:, t:t + 3], t))
    torch.testing.assert_close(torch.cat(parts, 1), ref, rtol=1e-4, atol=5e-5)


def test_batch_rows_with_different_cache_lengths(family, tmp_path_factory):
    """The batch dimension is real: two rows at different offsets equal two single-row runs."""
    path = save(make_hf_model(family, seed=12), tmp_path_factory, f"batch-{family}")
    ours = load_model(path).model
    ours.setup_caches(2, 64)
    single = load_model(path).model
    single.setup_caches(1, 64)
    a, b = torch.tensor([PROMPT]), torch.tensor([PROMPT[::-1]])
    with torch.no_grad():
        ours(torch.cat([a, b]), torch.arange(7)[None].expand(2, -1), torch.tensor([0, 0]))
        # row 0 continues at 7, row 1 re-writes from 5 (as after a rejection)
        step = torch.tensor([[70, 71], [72, 73]])
        pos = torch.tensor([[7, 8], [5, 6]])
        got = ours(step, pos, torch.tensor([7, 5]))
        single(a, torch.arange(7)[None], torch.tensor([0]))
        want0 = single(step[:1], pos[:1], torch.tensor([7]))
        single(b[:, :5], torch.arange(5)[None], torch.tensor([0]))
        want1 = single(step[1:], pos[1:], torch.tensor([5]))
    torch.testing.assert_close(got, torch.cat([want0, want1]), rtol=1e-4, atol=5e-5)


def test_captured_hidden_states_match_hf(family, tmp_path_factory):
    hf = make_hf_model(family, seed=13)
    path = save(hf, tmp_path_factory, f"hid-{family}")
    ours = load_model(path).model
    ours.setup_caches(1, 32)
    ours.capture_layers = (0, 2, 3)  # 3 is the last layer: HF reports it after the final norm
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True).hidden_states
        _, hidden = _logits(ours, ids, 0)
    torch.testing.assert_close(hidden, torch.cat([ref[1], ref[3], ref[4]], -1), rtol=1e-4, atol=5e-5)


def test_bf16_load_keeps_rope_in_fp32(family, tmp_path_factory):
    path = save(make_hf_model(family, seed=14), tmp_path_factory, f"bf16-{family}")
    loaded = load_model(path, dtype=torch.bfloat16)
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.model.inv_freq.dtype == torch.float32
