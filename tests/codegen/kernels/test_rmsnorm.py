"""rms_norm (+ fused residual add) against ops.rms_norm."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import rmsnorm as N
from specc.models import ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [48, 100])
def test_rms_norm(dev, dtype, n):
    torch.manual_seed(n)
    x = (torch.randn(2, 3, n) * 3).to(dtype).to(dev)
    w = (1 + 0.1 * torch.randn(n)).to(dtype).to(dev)
    y = N.rms_norm(x, w, 1e-6)
    ref = ops.rms_norm(x, w, 1e-6)
    assert y.shape == x.shape and y.dtype == ref.dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y, ref, **tol)
    if dtype != torch.float32:
        assert (y != ref).float().mean().item() < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_residual(dev, dtype):
    torch.manual_seed(1)
    x = torch.randn(4, 64).to(dtype).to(dev)
    r = torch.randn(4, 64).to(dtype).to(dev)
    w = torch.rand(64).to(dtype).to(dev) + 0.5
    y, s = N.rms_norm(x, w, 1e-5, residual=r)
    assert torch.equal(s, x + r)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y, ops.rms_norm(x + r, w, 1e-5), **tol)
    # in place into the residual stream
    r2 = r.clone()
    y2, s2 = N.rms_norm(x, w, 1e-5, residual=r2, sum_out=r2)
    assert s2 is r2 and torch.equal(r2, x + r) and torch.equal(y2, y)


def test_rms_norm_mixed_dtype_weight(dev):
    x = torch.randn(3, 32, device=dev).bfloat16()
    w = torch.rand(32, device=dev) + 0.5  # fp32 weight: output fp32, like ops.rms_norm
    y = N.rms_norm(x, w, 1e-6)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ops.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_rms_norm_errors(dev):
    with pytest.raises(ValueError, match="expects"):
        N.rms_norm(torch.randn(2, 8, device=dev), torch.ones(7, device=dev), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        N.rms_norm(torch.randn(2, 8, device=dev), torch.ones(8, device=dev), 1e-6,
                   residual=torch.randn(2, 7, device=dev))


@pytest.mark.gpu
def test_rms_norm_bf16_gpu():
    x = torch.randn(64, 4096, device="cuda").bfloat16()
    r = torch.randn(64, 4096, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(4096, device="cuda")).bfloat16()
    y, s = N.rms_norm(x, w, 1e-6, residual=r)
    ref = ops.rms_norm(x + r, w, 1e-6)
    assert torch.equal(s, x + r)
    assert (y != ref).float().mean().item() < 0.01
    torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2)
