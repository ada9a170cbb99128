"""swiglu / silu_mul against ops.silu_mul."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import swiglu as S
from specc.models import ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_swiglu_fused_and_separate(dev, dtype):
    torch.manual_seed(0)
    gate_up = (torch.randn(2, 3, 2 * 1100) * 4).to(dtype).to(dev)  # I = 1100 > one block
    gate, up = gate_up[..., :1100], gate_up[..., 1100:]
    ref = ops.silu_mul(gate, up)
    y = S.swiglu(gate_up)
    y2 = S.silu_mul(gate.contiguous(), up.contiguous())
    y3 = S.silu_mul(gate, up)  # strided views
    assert y.shape == (2, 3, 1100) and y.dtype == dtype
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for out in (y, y2, y3):
        torch.testing.assert_close(out, ref, **tol)
    if dtype != torch.float32:  # same roundings as torch: (nearly) bit-identical
        assert (y != ref).float().mean().item() < 0.01


def test_swiglu_errors(dev):
    with pytest.raises(ValueError, match="even"):
        S.swiglu(torch.randn(2, 5, device=dev))
    with pytest.raises(ValueError, match="must match"):
        S.silu_mul(torch.randn(2, 4, device=dev), torch.randn(2, 5, device=dev))


@pytest.mark.gpu
def test_swiglu_bf16_gpu():
    gate_up = (torch.randn(64, 2 * 12288, device="cuda") * 3).bfloat16()
    ref = S.swiglu_reference(gate_up)
    y = S.swiglu(gate_up)
    assert (y != ref).float().mean().item() < 0.01
    torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2)
