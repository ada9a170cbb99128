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
