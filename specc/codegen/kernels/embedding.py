"""Embedding lookup: a row gather ``weight[ids]`` (``specc.models.ops.embedding``).

Ids outside ``[0, V)`` give zero rows (no host sync to check them; the reference raises).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specc.codegen.kernels._common import check_same_device, check_tensor, next_pow2, use_triton
from specc.codegen.kernels.pdl import pdl_args, pdl_wait

__all__ = ["embedding", "embedding_reference"]


@triton.jit
def _embedding_kernel(ids_ptr, w_ptr, y_ptr, V, H, stride_w, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    tok = tl.load(ids_ptr + row).to(tl.int64) + tl.zeros((BLOCK,), dtype=tl.int64)
    ok = mask & (tok >= 0) & (tok < V)
    vals = tl.load(w_ptr + tok * stride_w + offs, mask=ok, other=0.0)
    tl.store(y_ptr + row.to(tl.int64) * H + offs, vals, mask=mask)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight[ids]``: ids int ``[...]``, weight ``[V, H]`` (unit stride along H) -> ``[..., H]``."""
    op = "embedding"
    check_tensor("ids", ids, op, dtypes=(torch.int64, torch.int32))
    check_tensor("weight", weight, op, ndim=2)
    check_same_device(op, ids=ids, weight=weight)
    if not use_triton(weight):
        return embedding_reference(ids, weight)
    v, h = weight.shape
    if weight.stride(-1) != 1:
        raise ValueError(f"{op}: weight needs unit stride along H, got {tuple(weight.stride())}")
    flat = ids.reshape(-1).contiguous()
    y = torch.empty(*ids.shape, h, dtype=weight.dtype, device=weight.device)
    if flat.numel() and h:
        block = min(1024, max(16, next_pow2(h)))
        _embedding_kernel[(flat.numel(), triton.cdiv(h, block))](
            flat, weight, y, v, h, weight.stride(0), BLOCK=block, num_warps=4,
            **pdl_args(weight, "embedding"))
    return y


def embedding_reference(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, weight)
