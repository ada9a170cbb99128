"""The cuBLAS lowering of a linear: ``torch.nn.functional.linear`` (cuBLAS / cuBLASLt on CUDA,
torch's CPU GEMM elsewhere), chosen per shape and row range by ``codegen.linear_choice`` where it
measured faster than the Triton linear (large M: batched verification).

The fusions the Triton kernel does in one launch become separate ops here, with the reference's
roundings: the RMSNorm prologue is normalised first by the caller (``kernel_abi`` runs the
``rms_norm`` kernel, as the Triton launcher does for its dot kernel), the bias goes to cuBLAS's
epilogue (added in fp32, rounded once, as the Triton epilogue and ``F.linear`` do), and the
residual is added to the *rounded* product in a second op (``residual + linear(x)``, bit-identical
to the unfused graph given the product). Only the GEMM's summation order differs from the
Triton kernel's: the same fp32 accumulation, another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_cublas(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight^T (+ bias) (+ residual)``: x ``[..., K]``, weight ``[N, K]`` of x's dtype,
    bias ``[N]``, residual of the output's shape and dtype."""
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y
