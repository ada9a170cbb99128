"""The element-wise hybrid-target kernels (offset RMSNorm, gated head norm, GDN gates) against
the model ops they replace: fp32 and bf16 inputs (interpreted on CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import gdn_elementwise as K
from specc.models import gdn


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_offset_rms_norm(dev, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, 4, 48, generator=g) * 3).to(dtype).to(dev)
    w = (torch.randn(48, generator=g) * 0.2).to(dtype).to(dev)
    ref = gdn.rms_norm_offset(x.cpu(), w.cpu(), 1e-6)
    got = K.offset_rms_norm(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), ref, **_tol(dtype))
    if dtype == torch.bfloat16:
        assert (got.cpu() != ref).float().mean().item() < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_head_norm(dev, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 5, 4 * 24, generator=g) * 2).to(dtype).to(dev)
    z = (torch.randn(2, 5, 4 * 24, generator=g) * 2).to(dtype).to(dev)
    w = (1 + 0.3 * torch.randn(24, generator=g)).to(dtype).to(dev)
    ref = gdn.gated_head_norm(x.cpu(), z.cpu(), w.cpu(), 1e-6)
    got = K.gated_head_norm(x, z, w, 1e-6)
    torch.testing.assert_close(got.cpu(), ref, **_tol(dtype))
    if dtype == torch.bfloat16:
        assert (got.cpu() != ref).float().mean().item() < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_gates(dev, dtype):
    g = torch.Generator().manual_seed(2)
    b = (torch.randn(2, 7, 6, generator=g) * 3).to(dtype).to(dev)
    a = (torch.randn(2, 7, 6, generator=g) * 8).to(dtype).to(dev)  # some a + dt_bias past the threshold 20
    a[0, 0, 0] = 25.0
    a_log = torch.rand(6, generator=g).log().to(dtype).to(dev)
    dt = torch.ones(6).to(dtype).to(dev)
    ref_g, ref_beta = gdn.gdn_gates(b.cpu(), a.cpu(), a_log.cpu(), dt.cpu())
    got_g, got_beta = K.gdn_gates(b, a, a_log, dt)
    assert got_g.dtype == torch.float32 and got_beta.dtype == dtype
    torch.testing.assert_close(got_g.cpu(), ref_g, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_beta.cpu(), ref_beta, **_tol(dtype))


def test_errors(dev):
    with pytest.raises(ValueError, match="do not fit"):
        K.gated_head_norm(torch.randn(2, 10, device=dev), torch.randn(2, 10, device=dev), torch.ones(4, device=dev), 1e-6)
    with pytest.raises(ValueError, match="differ"):
        K.gdn_gates(torch.randn(2, 4, device=dev), torch.randn(2, 5, device=dev), torch.ones(4, device=dev),
                    torch.ones(4, device=dev))
