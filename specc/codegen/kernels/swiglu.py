"""SwiGLU activation ``silu(gate) * up`` (``specc.models.ops.silu_mul``).

Two entry points: :func:`swiglu` reads a fused gate_up projection ``[..., 2I]`` (gate in the
first half, up in the second, as one linear over the concatenated weights produces) and
:func:`silu_mul` takes separate gate and up ``[..., I]``. Rounding follows torch on 16-bit
tensors: ``silu(gate)`` is computed in fp32 (``g / (1 + exp(-g))``) and rounded to the dtype,
then the product is rounded again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specc.codegen.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    precise_exp,
    round_to,
    rounded,
    use_triton,
)
from specc.codegen.kernels.pdl import pdl_args, pdl_wait

__all__ = ["swiglu", "silu_mul", "silu_mul_reference", "swiglu_reference"]

_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, I, stride_g, stride_u, stride_y, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
    s = rounded(g / (1.0 + precise_exp(-g)), y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * stride_y + offs, round_to(s * u, y_ptr.dtype.element_ty), mask=mask)


def _launch(gate2, up2, out_shape, dtype, device):
    m, i = gate2.shape
    y = torch.empty(out_shape, dtype=dtype, device=device)
    y2 = y.view(-1, i)
    if m and i:
        _silu_mul_kernel[(m, triton.cdiv(i, _BLOCK))](
            gate2, up2, y2, i, gate2.stride(0), up2.stride(0), y2.stride(0), BLOCK=_BLOCK,
            num_warps=4, **pdl_args(gate2, "silu_mul"))
    return y


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for gate, up ``[..., I]`` of one dtype; returns ``[..., I]``."""
    op = "silu_mul"
    check_tensor("gate", gate, op, dtypes=FLOAT_DTYPES)
    check_tensor("up", up, op, dtypes=FLOAT_DTYPES)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"{op}: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} "
                         f"{up.dtype} must match")
    check_same_device(op, gate=gate, up=up)
    if not use_triton(gate):
        return silu_mul_reference(gate, up)
    if gate.dim() == 0:
        raise ValueError(f"{op}: gate must have at least one dim")
    return _launch(_rows(gate), _rows(up), gate.shape, gate.dtype, gate.device)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate_up[..., :I]) * gate_up[..., I:]`` for gate_up ``[..., 2I]``; returns ``[..., I]``."""
    op = "swiglu"
    check_tensor("gate_up", gate_up, op, dtypes=FLOAT_DTYPES)
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"{op}: last dim of gate_up must be even (gate | up), got "
                         f"{tuple(gate_up.shape)}")
    if not use_triton(gate_up):
        return swiglu_reference(gate_up)
    i = gate_up.shape[-1] // 2
    gu = _rows(gate_up)
    return _launch(gu[:, :i], gu[:, i:], (*gate_up.shape[:-1], i), gate_up.dtype, gate_up.device)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
