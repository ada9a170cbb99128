"""The lowering of rope_attention (rope_and_cache + attention kernels) equals its eager body."""

import pytest
import torch


@pytest.mark.parametrize("num_ctx,mask_kind", [(0, "causal"), (4, "full")], ids=["target", "dflash"])
def test_kernel_lowering_matches_reference(monkeypatch, num_ctx, mask_kind):
    """rope_and_cache + attention (Triton, interpreter on CPU) == the op's eager body; "dflash":
    keys over [context; block], queries over the block (the last Q key positions), full mask."""
    from specc.codegen import kernel_abi
    from specc.passes.fuse_rope_attention import rope_attention

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setenv("SPECC_KERNELS", "triton")
    g = torch.Generator().manual_seed(0)
    b, q_len, hq, hkv, d, cap = 1, 3, 4, 2, 16, 24
    q = torch.randn(b, q_len, hq, d, generator=g).to(dev)
    k = torch.randn(b, num_ctx + q_len, hkv, d, generator=g).to(dev)
    v = torch.randn(b, num_ctx + q_len, hkv, d, generator=g).to(dev)
    qn, kn = torch.rand(d, generator=g).to(dev) + 0.5, torch.rand(d, generator=g).to(dev) + 0.5
    inv_freq = (1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))).to(dev)
    cache_len = torch.tensor([5], device=dev)
    positions = torch.arange(5, 5 + num_ctx + q_len, device=dev)[None]
    end = 5 + num_ctx + q_len
    caches = [torch.randn(b, hkv, cap, d, generator=g).to(dev) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    want = rope_attention(q, k, v, positions, inv_freq, *ref_caches, cache_len, qn, kn, 1e-6, mask_kind, d ** -0.5)
    got = kernel_abi.rope_attention(q, k, v, positions, inv_freq, *caches, cache_len, qn, kn, 1e-6, mask_kind, d ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[0][:, :, 5:end], ref_caches[0][:, :, 5:end], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[1][:, :, 5:end], ref_caches[1][:, :, 5:end])
