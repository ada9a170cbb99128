"""specc.models.DFlashDraft equals the stock reference drafter on the same checkpoint."""

import torch
from model_factory import make_dflash_checkpoint, make_hf_model
from transformers import DynamicCache

from specc.models import load_model
from specc.stock.dflash_reference import DFlashReference


def test_dflash_matches_reference_over_steps(family, tmp_path_factory):
    target = make_hf_model(family, seed=21)
    path = make_dflash_checkpoint(target, tmp_path_factory, f"dfl-{family}", seed=5, layer_ids=(1, 3))
    loaded = load_model(path)
    assert loaded.kind == "dflash"
    ours = loaded.model
    ours.setup_caches(1, 64)
    ref = DFlashReference.from_pretrained(path)
    cache = DynamicCache()
    hidden = target.config.hidden_size
    torch.manual_seed(0)
    committed = 0
    with torch.no_grad():
        for ctx_len in (6, 3, 1):  # prefill context, then two steps with 3 and 1 accepted
            ctx = torch.randn(1, ctx_len, 2 * hidden)
            noise = torch.randn(1, 4, hidden)
            positions = torch.arange(committed, committed + ctx_len + 4)[None]
            want = ref(noise, ctx, positions, cache)
            got = ours(noise, ctx, positions, torch.tensor([committed]))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-5)
            committed += ctx_len
            cache.crop(-(cache.get_seq_length() - committed))  # keep context K/V only
