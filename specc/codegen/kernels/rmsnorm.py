"""Standalone RMSNorm, optionally fused with the residual add before it.

``rms_norm(x, w, eps)`` is ``specc.models.ops.rms_norm``: fp32 statistics,
``w * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` (output dtype promote(w, x)). With
``residual``: ``s = x + residual`` (rounded to x's dtype, as the model's ``x = x + attn(...)``)
is normalised and both are returned, ``(rms_norm(s), s)``; ``sum_out`` may alias ``residual`` or
``x`` to update the residual stream in place. One program per row, the whole row in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    next_pow2,
    round_to,
    rounded,
    use_triton,
)
from specc.codegen.kernels.pdl import pdl_args, pdl_wait

__all__ = ["rms_norm", "rms_norm_reference", "MAX_HIDDEN"]

MAX_HIDDEN = 65536


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, N, stride_x, stride_r, stride_y, stride_s,
                    eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    h = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        h = rounded(h + r, s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + offs, round_to(h, s_ptr.dtype.element_ty), mask=mask)
    ms = tl.sum(h * h, axis=0) / N
    rstd = tl.rsqrt(ms + eps)
    n = rounded(h * rstd, x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, round_to(w * n, y_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, sum_out: torch.Tensor | None = None):
    """RMSNorm over the last dim of x ``[..., N]`` with weight ``[N]``.

    Without residual returns ``y``; with residual (same shape and dtype as x) returns
    ``(y, s)`` where ``s = x + residual`` (written into ``sum_out`` if given; it may alias x or
    residual). y's dtype is promote(weight, x).
    """
    op = "rms_norm"
    check_tensor("x", x, op, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, op, ndim=1, dtypes=FLOAT_DTYPES)
    n = weight.shape[0]
    if x.dim() < 1 or x.shape[-1] != n:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}, weight expects [..., {n}]")
    if residual is not None:
        check_tensor("residual", residual, op, dtypes=FLOAT_DTYPES)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"{op}: residual must match x ({tuple(x.shape)}, {x.dtype}); got "
                             f"{tuple(residual.shape)}, {residual.dtype}")
    if sum_out is not None:
        if residual is None:
            raise ValueError(f"{op}: sum_out needs a residual")
        if sum_out.shape != x.shape or sum_out.dtype != x.dtype:
            raise ValueError(f"{op}: sum_out must match x ({tuple(x.shape)}, {x.dtype})")
    check_same_device(op, x=x, weight=weight, residual=residual, sum_out=sum_out)
    if not use_triton(x):
        y, s = rms_norm_reference(x, weight, eps, residual)
        if residual is None:
            return y
        if sum_out is not None:
            sum_out.copy_(s)
            s = sum_out
        return y, s
    if n > MAX_HIDDEN:
        raise ValueError(f"{op}: hidden size {n} > {MAX_HIDDEN} is not supported")
    y = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    x2 = _rows(x, n)
    y2 = y.view(-1, n)
    m = x2.shape[0]
    if residual is not None:
        r2 = _rows(residual, n)
        if sum_out is None:
            sum_out = torch.empty_like(x)
        s2 = sum_out.view(-1, n) if sum_out.is_contiguous() else None
        if s2 is None:
            raise ValueError(f"{op}: sum_out must be contiguous")
    else:
        r2 = s2 = x2
    if m:
        block = max(16, next_pow2(n))
        _rmsnorm_kernel[(m,)](x2, r2, weight, y2, s2, n, x2.stride(0), r2.stride(0),
                              y2.stride(0), s2.stride(0), float(eps),
                              HAS_RES=residual is not None, BLOCK=block,
                              num_warps=max(1, min(16, block // 512)), **pdl_args(x2, "rms_norm"))
    return y if residual is None else (y, sum_out)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None):
    """Pure torch: ``(ops.rms_norm(s), s)`` with ``s = x (+ residual)``."""
    s = x if residual is None else x + residual
    sf = s.float()
    sf = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * sf.to(s.dtype), s
