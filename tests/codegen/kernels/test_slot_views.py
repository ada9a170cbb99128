"""A request's prefill runs batch-1 on views of its slot's cache rows (``specc.runtime.state.slot_view``):
the KV-writing and attention kernels must honour a view's storage offset, write that row only,
and match their references on it."""

from __future__ import annotations

import torch

from specc.codegen.kernels import attention as A
from specc.codegen.kernels import rope as R


def _caches(dev, rows=4, hkv=2, s=24, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, hkv, s, d, generator=g).to(dev), torch.randn(rows, hkv, s, d, generator=g).to(dev))


def test_rope_cache_and_attention_on_a_slot_view(dev):
    g = torch.Generator().manual_seed(1)
    hq, hkv, d, num = 4, 2, 16, 5
    q = torch.randn(1, num, hq, d, generator=g).to(dev)
    k = torch.randn(1, num, hkv, d, generator=g).to(dev)
    v = torch.randn(1, num, hkv, d, generator=g).to(dev)
    positions = torch.arange(num, device=dev)[None]
    cache_len = torch.zeros(1, dtype=torch.long, device=dev)
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ck, cv = _caches(dev)
    before_k, before_v = ck.clone(), cv.clone()
    want_k, want_v = ck[2:3].clone(), cv[2:3].clone()  # the reference on a contiguous copy of row 2
    want_q = R.rope_and_cache_reference(q, k, v, positions, inv.to(dev), want_k, want_v, cache_len)
    got_q = R.rope_and_cache(q, k, v, positions, inv.to(dev), ck[2:3], cv[2:3], cache_len)  # views of row 2
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(ck[2:3], want_k)
    torch.testing.assert_close(cv[2:3], want_v)
    others = [0, 1, 3]
    assert torch.equal(ck[others], before_k[others]) and torch.equal(cv[others], before_v[others])
    scale = d ** -0.5
    got = A.attention(got_q, ck[2:3], cv[2:3], cache_len, num, "causal", scale)
    want = A.attention_reference(want_q, want_k, want_v, cache_len, num, "causal", scale)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
