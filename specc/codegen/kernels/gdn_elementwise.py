"""The element-wise ops around a hybrid target's GDN and gated-attention layers, one launch each
(their reference bodies are a dozen torch ops apiece, ``specc.models.gdn``):

- :func:`offset_rms_norm`: zero-centred RMSNorm, ``(x * rsqrt(mean(x^2) + eps) * (1 + w))``
  in fp32, rounded once (``gdn.rms_norm_offset``); one program per row of the last dim;
- :func:`gated_head_norm`: RMSNorm per value head of the GDN output times ``SiLU(gate)``
  (``gdn.gated_head_norm``), rounding where the reference rounds: the normed head, its product
  with the weight, the gated result; one program per (row, head);
- :func:`gdn_gates`: ``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32) and
  ``beta = sigmoid(b)`` (b's dtype) per token and value head (``gdn.gdn_gates``).

Off CUDA (without the interpreter) each launcher runs its reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from specc.codegen.kernels._common import FLOAT_DTYPES, INTERPRETED, check_tensor, next_pow2, precise_exp, round_to, \
    rounded, use_triton
from specc.codegen.kernels.pdl import pdl_args, pdl_wait
from specc.models import gdn

__all__ = ["offset_rms_norm", "gated_head_norm", "gdn_gates"]

_LOG1P = tl.constexpr(not INTERPRETED)  # libdevice when compiled; the interpreter has no libdevice


@triton.jit
def _log1p(x):
    if _LOG1P:
        return libdevice.log1p(x)
    else:
        return tl.log(1.0 + x)


@triton.jit
def _offset_norm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + offs, round_to(x * rstd * (1.0 + w), y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, D, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    head = tl.program_id(0).to(tl.int64)  # (row, head) flattened: heads are contiguous D-blocks
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(x_ptr + head * D + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = rounded(x * rstd, y_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    scaled = rounded(w * normed, y_ptr.dtype.element_ty)
    z = tl.load(z_ptr + head * D + offs, mask=mask, other=0.0).to(tl.float32)
    gate = z / (1.0 + precise_exp(-z))
    tl.store(y_ptr + head * D + offs, round_to(scaled * gate, y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gates_kernel(b_ptr, a_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, H, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    a = tl.load(a_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x = a + dt
    softplus = tl.where(x > 20.0, x, _log1p(precise_exp(x)))  # torch's softplus (threshold 20)
    decay = precise_exp(tl.load(alog_ptr + offs, mask=mask, other=0.0).to(tl.float32))
    tl.store(g_ptr + row * H + offs, -decay * softplus, mask=mask)
    b = tl.load(b_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(beta_ptr + row * H + offs, round_to(1.0 / (1.0 + precise_exp(-b)), beta_ptr.dtype.element_ty), mask=mask)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``specc.models.gdn.rms_norm_offset`` in one launch."""
    check_tensor("x", x, "offset_rms_norm", dtypes=FLOAT_DTYPES)
    if not use_triton(x):
        return gdn.rms_norm_offset(x, weight, eps)
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0]:
        _offset_norm_kernel[(x2.shape[0],)](x2, weight, y, n, float(eps), BLOCK=next_pow2(n), num_warps=4, **pdl_args(x2, "gdn"))
    return y.view(x.shape)


def gated_head_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``specc.models.gdn.gated_head_norm`` in one launch."""
    check_tensor("x", x, "gated_head_norm", dtypes=FLOAT_DTYPES)
    if x.shape != gate.shape or x.shape[-1] % weight.shape[0]:
        raise ValueError(f"gated_head_norm: x {tuple(x.shape)}, gate {tuple(gate.shape)} and head dim "
                         f"{weight.shape[0]} do not fit")
    if not use_triton(x):
        return gdn.gated_head_norm(x, gate, weight, eps)
    d = weight.shape[0]
    x2, z2 = x.reshape(-1, d).contiguous(), gate.reshape(-1, d).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0]:
        _gated_norm_kernel[(x2.shape[0],)](x2, z2, weight, y, d, float(eps), BLOCK=next_pow2(d), num_warps=4, **pdl_args(x2, "gdn"))
    return y.view(x.shape)


def gdn_gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """``specc.models.gdn.gdn_gates`` in one launch: (g fp32, beta in b's dtype)."""
    check_tensor("b", b, "gdn_gates", dtypes=FLOAT_DTYPES)
    if a.shape != b.shape:
        raise ValueError(f"gdn_gates: a {tuple(a.shape)} and b {tuple(b.shape)} differ")
    if not use_triton(b):
        return gdn.gdn_gates(b, a, a_log, dt_bias)
    h = b.shape[-1]
    b2, a2 = b.reshape(-1, h).contiguous(), a.reshape(-1, h).contiguous()
    g = torch.empty(a2.shape, dtype=torch.float32, device=b.device)
    beta = torch.empty_like(b2)
    if b2.shape[0]:
        _gates_kernel[(b2.shape[0],)](b2, a2, a_log, dt_bias, g, beta, h, BLOCK=next_pow2(h), num_warps=1, **pdl_args(b2, "gdn"))
    return g.view(a.shape), beta.view(b.shape)
