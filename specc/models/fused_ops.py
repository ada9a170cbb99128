"""Eager reference bodies of the fused ops that built-in passes introduce: the one place they live.

Each body calls the same leaf ops (``specc.models.ops``) in the same order as the unfused graph,
so a rewritten graph computes bit-identical results on CPU. Their IR rules (shapes, bytes,
FLOPs) are registered beside the passes that introduce them (``specc.ir.fused`` for
norm_linear / linear_add; ``specc.passes.pack_weights_12bit``, ``specc.passes.fuse_rope_attention``);
codegen's kernel ABI runs these bodies on CPU and lowers the kinds to fused kernels on the GPU.
"""

from __future__ import annotations

import torch
import torch.fx

from specc.formats.bf12 import Packed12
from specc.models import ops

__all__ = ["linear_add", "norm_linear", "packed_linear", "rope_attention"]


@torch.fx.wrap
def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear(rms_norm(x, norm_weight, eps), weight, bias)`` with the norm as the GEMM prologue."""
    return ops.linear(ops.rms_norm(x, norm_weight, eps), weight, bias)


@torch.fx.wrap
def linear_add(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               residual: torch.Tensor) -> torch.Tensor:
    """``residual + linear(x, weight, bias)`` with the add in the GEMM epilogue (the product is
    rounded, then the sum: the same two roundings as the separate ops)."""
    return residual + ops.linear(x, weight, bias)


_UNPACKED: dict = {}  # sm tensor identity -> (tensor ref, unpacked bf16 weight): eager body cache


@torch.fx.wrap
def packed_linear(x, sm, ex, base, esc_idx, esc_val, n: int, k: int, base_mode: str, bias=None,
                  norm_weight=None, eps: float = 1e-6, version: int = 1, residual=None):
    """``[residual +] linear([rms_norm](x), W, bias)`` with W given by its bf12 planes (exact
    bf16 weights; ``version``: the planes' layout, see ``specc.formats.bf12``); the residual add
    (``fuse_residual_add``) is the separate op's: the product rounded, then the sum."""
    key = (sm.data_ptr(), sm.device, tuple(sm.shape))
    hit = _UNPACKED.get(key)
    if hit is None or hit[0] is not sm:
        packed = Packed12(sm=sm, ex=ex, base=base, esc_idx=esc_idx, esc_val=esc_val, shape=(n, k), base_mode=base_mode,
                          version=version)
        hit = (sm, packed.unpack())
        _UNPACKED[key] = hit
    if norm_weight is not None:
        x = ops.rms_norm(x, norm_weight, eps)
    y = ops.linear(x, hit[1].to(x.dtype), bias)
    return y if residual is None else residual + y


@torch.fx.wrap
def rope_attention(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, q_norm_weight, k_norm_weight,
                   eps: float, mask_kind: str, scale: float, tree_mask=None):
    """``attention(rope(norm(q)), rope(norm(k)), v, ...)`` with cos/sin from positions (norms optional).
    ``positions`` are the keys' [B, Qk]; the queries are the last Q of them (Q < Qk: DFlash)."""
    if q_norm_weight is not None:
        q = ops.rms_norm(q, q_norm_weight, eps)
        k = ops.rms_norm(k, k_norm_weight, eps)
    cos, sin = ops.rope_tables(positions, inv_freq, q)
    first_q = k.shape[1] - q.shape[1]  # the queries' rows of the keys' tables
    q, k = ops.rope(q, cos[:, first_q:], sin[:, first_q:]), ops.rope(k, cos, sin)
    return ops.attention(q, k, v, cache_k, cache_v, cache_len, mask_kind, scale, tree_mask)
