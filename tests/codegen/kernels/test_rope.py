"""rope_and_cache: fused q/k norm + rotary + KV-cache write against the model ops."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import rope as R


def _inv_freq(d, theta=10000.0):
    return 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)


def _inputs(dev, bsz, num_q, num_k, hq, hkv, d, s, lens, dtype, qk_norm, seed=0, fused=False):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: (torch.randn(*shape, generator=g) * 2).to(dtype).to(dev)  # noqa: E731
    if fused:  # q/k/v as strided views of one qkv projection output [B, Qk, (Hq + 2 Hkv) * D]
        qkv = rnd(bsz, num_k, (hq + 2 * hkv) * d)
        q = qkv[:, num_k - num_q:, :hq * d].view(bsz, num_q, hq, d)
        k = qkv[:, :, hq * d:(hq + hkv) * d].view(bsz, num_k, hkv, d)
        v = qkv[:, :, (hq + hkv) * d:].view(bsz, num_k, hkv, d)
    else:
        q, k, v = rnd(bsz, num_q, hq, d), rnd(bsz, num_k, hkv, d), rnd(bsz, num_k, hkv, d)
    cache_len = torch.tensor(lens, device=dev)
    positions = cache_len[:, None] + torch.arange(num_k, device=dev)[None, :] + 3
    inv = _inv_freq(d).to(dev)
    qw = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).to(dev) if qk_norm else None
    kw = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).to(dev) if qk_norm else None
    ck = torch.randn(bsz + 1, hkv, s, d, generator=g).to(dtype).to(dev)
    cv = torch.randn(bsz + 1, hkv, s, d, generator=g).to(dtype).to(dev)
    return q, k, v, positions, inv, ck, cv, cache_len, qw, kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 3, 4, 2, 16), (1, 2, 5, 3, 1, 12)], ids=["plain", "dflash"])
def test_rope_and_cache(dev, dtype, qk_norm, shape):
    bsz, num_q, num_k, hq, hkv, d = shape
    args = _inputs(dev, bsz, num_q, num_k, hq, hkv, d, 40, [4, 30][:bsz], dtype, qk_norm)
    q, k, v, pos, inv, ck, cv, cl, qw, kw = args
    ck_r, cv_r = ck.clone(), cv.clone()
    out = R.rope_and_cache(q, k, v, pos, inv, ck, cv, cl, qw, kw, 1e-6)
    ref = R.rope_and_cache_reference(q, k, v, pos, inv, ck_r, cv_r, cl, qw, kw, 1e-6)
    assert out.shape == q.shape and out.dtype == ref.dtype
    # same roundings as the reference: equal up to last-bit differences of cos/sin/rsqrt
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(ck, ck_r, **tol)
    assert torch.equal(cv, cv_r)
    if dtype != torch.float32:
        mismatch = (out != ref).float().mean().item()
        assert mismatch < 0.02  # nearly all bit-identical


def test_rope_strided_views_and_large_positions(dev):
    args = _inputs(dev, 2, 2, 2, 4, 2, 16, 64, [1, 50], torch.float32, True, fused=True)
    q, k, v, pos, inv, ck, cv, cl, qw, kw = args
    pos = pos * 97  # positions in the thousands
    ck_r, cv_r = ck.clone(), cv.clone()
    out = R.rope_and_cache(q, k, v, pos, inv, ck, cv, cl, qw, kw, 1e-6)
    ref = R.rope_and_cache_reference(q, k, v, pos, inv, ck_r, cv_r, cl, qw, kw, 1e-6)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ck, ck_r, rtol=1e-5, atol=1e-4)
    assert torch.equal(cv, cv_r)


def test_rope_errors(dev):
    q, k, v, pos, inv, ck, cv, cl, qw, kw = _inputs(dev, 1, 2, 2, 4, 2, 16, 8, [0], torch.float32,
                                                    False)
    with pytest.raises(ValueError, match="positions"):
        R.rope_and_cache(q, k, v, pos[:, :1], inv, ck, cv, cl)
    with pytest.raises(ValueError, match="inv_freq"):
        R.rope_and_cache(q, k, v, pos, inv[:3], ck, cv, cl)
    with pytest.raises(ValueError, match="fewer"):
        R.rope_and_cache(q, k[:, :1], v[:, :1], pos[:, :1], inv, ck, cv, cl)
    with pytest.raises(ValueError, match="caches"):
        R.rope_and_cache(q, k, v, pos, inv, ck[:, :1], cv[:, :1], cl)


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_bf16_gpu(qk_norm):
    args = _inputs("cuda", 4, 16, 16, 32, 8, 128, 4096, [0, 100, 1000, 4000], torch.bfloat16,
                   qk_norm)
    q, k, v, pos, inv, ck, cv, cl, qw, kw = args
    ck_r, cv_r = ck.clone(), cv.clone()
    out = R.rope_and_cache(q, k, v, pos, inv, ck, cv, cl, qw, kw, 1e-6)
    ref = R.rope_and_cache_reference(q, k, v, pos, inv, ck_r, cv_r, cl, qw, kw, 1e-6)
    assert (out != ref).float().mean().item() < 0.01
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ck, ck_r, rtol=2e-2, atol=2e-2)
    assert torch.equal(cv, cv_r)
