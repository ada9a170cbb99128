"""``ops.ragged_attention``: a packed block of rows with their own token counts, cache lengths and
slots computes what each row computes alone through ``ops.attention`` (causal)."""

import torch

from specc.models import ops


def _caches(slots, length=24, hkv=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(slots, hkv, length, d, generator=g), torch.randn(slots, hkv, length, d, generator=g))


def test_ragged_equals_rows_alone():
    g = torch.Generator().manual_seed(1)
    hq, hkv, d = 4, 2, 8
    counts, slots, lens = [3, 0, 1, 5], [2, 0, 3, 1], [4, 7, 0, 9]
    total = sum(counts)
    q, k, v = (torch.randn(1, total, h, d, generator=g) for h in (hq, hkv, hkv))
    cache_k, cache_v = _caches(4)
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    starts = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)))
    out = ops.ragged_attention(q, k, v, cache_k, cache_v, torch.tensor(lens), torch.tensor(slots), starts, 0.3)
    assert out.shape == (1, total, hq * d)
    for r, (n, slot, base) in enumerate(zip(counts, slots, lens)):
        lo = int(starts[r])
        if n == 0:
            continue
        alone = ops.attention(q[:, lo:lo + n], k[:, lo:lo + n], v[:, lo:lo + n], ref_k[slot:slot + 1],
                              ref_v[slot:slot + 1], torch.tensor([base]), "causal", 0.3)
        torch.testing.assert_close(out[:, lo:lo + n], alone, rtol=0, atol=0)
    torch.testing.assert_close(cache_k, ref_k, rtol=0, atol=0)  # same writes, same slots
    torch.testing.assert_close(cache_v, ref_v, rtol=0, atol=0)


def test_untouched_slots_and_empty_rows():
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 2, 2, 4, generator=g), torch.randn(1, 2, 1, 4, generator=g), torch.randn(1, 2, 1, 4, generator=g)
    cache_k, cache_v = _caches(3, hkv=1, d=4)
    before_k = cache_k.clone()
    ops.ragged_attention(q, k, v, cache_k, cache_v, torch.tensor([5, 1]), torch.tensor([2, 0]),
                         torch.tensor([0, 0, 2]), 0.5)
    assert torch.equal(cache_k[1], before_k[1])  # slot 1 is not a row
    assert torch.equal(cache_k[2], before_k[2])  # row 0 (slot 2) has no tokens
    assert torch.equal(cache_k[0, :, 1:3], k[0].transpose(0, 1))
    assert torch.equal(cache_k[0, :, 3:], before_k[0, :, 3:])



def _tiny_causal_lm():
    from specc.models.config import model_config_from_hf
    from specc.models.decoder import CausalLM

    torch.manual_seed(0)
    raw = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 128}
    model = CausalLM(model_config_from_hf(raw)).float()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model


def _caches_of(model):
    return [t.clone() for layer in model.layers for t in (layer.self_attn.cache_k, layer.self_attn.cache_v)]


def test_causal_lm_ragged_step_equals_rows_alone():
    """A packed verify through the model definition: each row's logits equal its own batch-1 step
    on the same cache (fp32), the rows' slots get the same entries, other slots stay untouched."""
    from specc.runtime.state import slot_view

    model = _tiny_causal_lm()
    model.setup_caches(3, 32)
    g = torch.Generator().manual_seed(3)
    lens = [5, 3, 7]
    for slot, n in enumerate(lens):  # fill each slot alone
        with slot_view(model, slot):
            model(torch.randint(0, 64, (1, n), generator=g), torch.arange(n)[None], torch.zeros(1, dtype=torch.long))
    rows = [(2, 4), (0, 2)]  # (slot, new tokens); slot 1 takes no part
    new = {slot: torch.randint(0, 64, (1, n), generator=g) for slot, n in rows}
    before = _caches_of(model)
    packed = model(torch.cat([new[s] for s, _ in rows], 1),
                   torch.cat([lens[s] + torch.arange(n) for s, n in rows])[None],
                   torch.tensor([lens[s] for s, _ in rows]), row_slots=torch.tensor([s for s, _ in rows]),
                   row_starts=torch.tensor([0, 4, 6]))
    after = _caches_of(model)
    for b, a in zip(before, after):
        assert torch.equal(b[1], a[1])  # slot 1 untouched
    offset = 0
    for slot, n in rows:
        for layer_buf, saved in zip([t for layer in model.layers for t in (layer.self_attn.cache_k,
                                                                             layer.self_attn.cache_v)], before):
            layer_buf.copy_(saved)
        with slot_view(model, slot):
            alone = model(new[slot], lens[slot] + torch.arange(n)[None], torch.tensor([lens[slot]]))
        torch.testing.assert_close(packed[:, offset:offset + n], alone, rtol=1e-5, atol=1e-5)
        for buf, a in zip(_caches_of(model), after):
            torch.testing.assert_close(buf[slot, :, :lens[slot] + n], a[slot, :, :lens[slot] + n], rtol=1e-6, atol=1e-6)
        offset += n


def test_ragged_step_refuses_half_a_descriptor():
    import pytest

    model = _tiny_causal_lm()
    model.setup_caches(1, 8)
    with pytest.raises(ValueError, match="row_slots and row_starts together"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.arange(2)[None], torch.zeros(1, dtype=torch.long),
              row_slots=torch.zeros(1, dtype=torch.long))
