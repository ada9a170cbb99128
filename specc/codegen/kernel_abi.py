"""The kernel ABI that generated modules call: one function per lowered op kind.

Each function has exactly the signature of the IR leaf op it replaces (``specc.models.ops`` and
``specc.ir.fused``), so lowering is a 1:1 swap of call targets and the generated source reads
like the model definition. Dispatch: CUDA tensors go to the Triton kernels of
``specc.codegen.kernels``; CPU tensors run the reference bodies (the leaf ops themselves), or the
same Triton kernels under the interpreter when ``SPECC_KERNELS=triton`` and ``TRITON_INTERPRET=1``
(slow; used by tests to prove generated code drives the kernels).
"""

from __future__ import annotations

import os

import torch

from specc.ir import fused
from specc.models import ops


def use_triton(t: torch.Tensor) -> bool:
    if t.is_cuda:
        return os.environ.get("SPECC_KERNELS", "triton") != "reference"
    return os.environ.get("SPECC_KERNELS") == "triton" and os.environ.get("TRITON_INTERPRET") == "1"


def embedding(ids, weight):
    if use_triton(weight):
        from specc.codegen.kernels import embedding as k

        return k.embedding(ids, weight)
    return ops.embedding(ids, weight)


def linear(x, weight, bias=None):
    if use_triton(x):
        from specc.codegen.kernels import linear as k

        return k.linear(x, weight, bias)
    return ops.linear(x, weight, bias)


def norm_linear(x, norm_weight, eps, weight, bias=None):
    if use_triton(x):
        from specc.codegen.kernels import linear as k

        return k.linear(x, weight, bias, norm_weight=norm_weight, eps=eps)
    return fused.norm_linear(x, norm_weight, eps, weight, bias)


def rms_norm(x, weight, eps):
    if use_triton(x):
        from specc.codegen.kernels import rmsnorm as k

        return k.rms_norm(x, weight, eps)
    return ops.rms_norm(x, weight, eps)


def silu_mul(gate, up):
    if use_triton(gate):
        from specc.codegen.kernels import swiglu as k

        return k.silu_mul(gate, up)
    return ops.silu_mul(gate, up)


def rope_tables(positions, inv_freq, dtype_like):
    return ops.rope_tables(positions, inv_freq, dtype_like)


def rope(x, cos, sin):
    return ops.rope(x, cos, sin)


def write_kv(k, v, cache_k, cache_v, cache_len) -> None:
    """Scatter the block's K/V into the static cache at slots cache_len[b] + i (no host sync)."""
    num_new = k.shape[1]
    slots = cache_len[:, None] + torch.arange(num_new, device=k.device)[None, :]
    rows = torch.arange(k.shape[0], device=k.device)[:, None].expand(-1, num_new)
    cache_k[rows, :, slots] = k.to(cache_k.dtype)
    cache_v[rows, :, slots] = v.to(cache_v.dtype)


def attention(q, k, v, cache_k, cache_v, cache_len, mask_kind, scale):
    if use_triton(q):
        from specc.codegen.kernels import attention as kern

        write_kv(k, v, cache_k, cache_v, cache_len)
        return kern.attention(q, cache_k, cache_v, cache_len, k.shape[1], mask_kind, scale)
    return ops.attention(q, k, v, cache_k, cache_v, cache_len, mask_kind, scale)
