"""The kernel ABI that generated modules call: one function per lowered op kind.

Each function has exactly the signature of the IR leaf op it replaces (``specc.models.ops`` and
``specc.ir.fused``), so lowering is a 1:1 swap of call targets and the generated source reads
like the model definition; the linears add one keyword, ``cublas_rows``, where lowering chose
cuBLAS for some row counts (``codegen/linear_choice.py``), and the tree attentions add
``tree_words``, the step's ancestor mask packed once by ``tree_mask_words`` (the one function
here with no IR op of its own). Dispatch: CUDA tensors go to the Triton kernels of
``specc.codegen.kernels``; CPU tensors run the reference bodies (the leaf ops themselves), or the
same Triton kernels under the interpreter when ``SPECC_KERNELS=triton`` and ``TRITON_INTERPRET=1``
(slow; used by tests to prove generated code drives the kernels).
"""

from __future__ import annotations

import torch

from specc.codegen.kernels import batch_invariant
from specc.codegen.kernels.dispatch import use_triton
from specc.codegen.kernels.tree_mask import pack_tree_mask, unpack_tree_mask
from specc.codegen.linear_choice import in_rows
from specc.models import fused_ops as fused
from specc.models import gdn, ops


def embedding(ids, weight):
    if use_triton(weight, opt_in=True):
        from specc.codegen.kernels import embedding as k

        return k.embedding(ids, weight)
    return ops.embedding(ids, weight)


# Linears take ``cublas_rows``: the row ranges (inclusive; hi None = no bound) in which lowering
# chose cuBLAS for this weight shape from measurements (codegen/linear_choice.py); other rows run
# the Triton kernel (on CPU: the reference, or the interpreted kernel when opted in). In the
# batch-invariant mode (kernels/batch_invariant.py, read at each call) every row count runs the
# Triton kernel: a choice by row count would change a row's summation order with its batch.


def _cublas(x, cublas_rows) -> bool:
    return (bool(cublas_rows) and not batch_invariant.enabled()
            and in_rows(x.numel() // max(x.shape[-1], 1), cublas_rows))


def linear(x, weight, bias=None, cublas_rows=()):
    if _cublas(x, cublas_rows):
        from specc.codegen.kernels.linear_cublas import linear_cublas

        return linear_cublas(x, weight, bias)
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import linear as k

        return k.linear(x, weight, bias)
    return ops.linear(x, weight, bias)


def linear_add(x, weight, bias, residual, cublas_rows=()):
    if _cublas(x, cublas_rows):
        from specc.codegen.kernels.linear_cublas import linear_cublas

        return linear_cublas(x, weight, bias, residual=residual)
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import linear as k

        return k.linear(x, weight, bias, residual=residual)
    return fused.linear_add(x, weight, bias, residual)


def norm_linear(x, norm_weight, eps, weight, bias=None, cublas_rows=()):
    if _cublas(x, cublas_rows):
        from specc.codegen.kernels.linear_cublas import linear_cublas

        return linear_cublas(rms_norm(x, norm_weight, eps), weight, bias)
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import linear as k

        return k.linear(x, weight, bias, norm_weight=norm_weight, eps=eps)
    return fused.norm_linear(x, norm_weight, eps, weight, bias)


def linear_add_norm_linear(x, weight, bias, residual, norm_weight, eps, weight2, bias2=None, cublas_rows=(),
                           norm_cublas_rows=()):
    """``h = linear_add(x, weight, bias, residual)`` and ``y = norm_linear(h, norm_weight, eps,
    weight2, bias2)``, returned as ``(h, y)``: a residual-norm pair (``codegen/residual_norm.py``;
    no IR op of its own, lowering pairs the two nodes). Where both linears run cuBLAS at these
    rows: GEMM, the rms_norm kernel adding the residual as it loads the row (it writes the sum
    too), GEMM, one kernel fewer than the separate calls and bit-identical to them; elsewhere
    the two calls."""
    if _cublas(x, cublas_rows) and _cublas(x, norm_cublas_rows):
        from specc.codegen.kernels import linear_cublas as cu

        product = cu.linear_cublas(x, weight, bias)
        if use_triton(x, opt_in=True):
            from specc.codegen.kernels import rmsnorm as k

            normed, h = k.rms_norm(product, norm_weight, eps, residual=residual)
        else:
            h = residual + product
            normed = ops.rms_norm(h, norm_weight, eps)
        return h, cu.linear_cublas(normed, weight2, bias2)
    h = linear_add(x, weight, bias, residual, cublas_rows=cublas_rows)
    return h, norm_linear(h, norm_weight, eps, weight2, bias2, cublas_rows=norm_cublas_rows)


def rms_norm(x, weight, eps):
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import rmsnorm as k

        return k.rms_norm(x, weight, eps)
    return ops.rms_norm(x, weight, eps)


def silu_mul(gate, up):
    if use_triton(gate, opt_in=True):
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


def tree_mask_words(tree_mask):
    """The tree step's ancestor mask packed into bit words, once per step for every attention
    (``tree_words=``; inserted by lowering, not an IR op: ``codegen/kernels/tree_mask.py``)."""
    return pack_tree_mask(tree_mask)


def _reference_mask(tree_mask, tree_words, num_q):
    """The bool mask the reference bodies read: unpacked from the words when given, so CPU runs
    of generated tree steps check the packing too."""
    return tree_mask if tree_words is None else unpack_tree_mask(tree_words, num_q)


def attention(q, k, v, cache_k, cache_v, cache_len, mask_kind, scale, tree_mask=None, tree_words=None):
    if use_triton(q, opt_in=True):
        from specc.codegen.kernels import attention as kern

        write_kv(k, v, cache_k, cache_v, cache_len)
        return kern.attention(q, cache_k, cache_v, cache_len, k.shape[1], mask_kind, scale, tree_mask=tree_mask,
                              tree_words=tree_words)
    return ops.attention(q, k, v, cache_k, cache_v, cache_len, mask_kind, scale,
                         _reference_mask(tree_mask, tree_words, q.shape[1]))


def ragged_attention(q, k, v, cache_k, cache_v, cache_len, row_slots, row_starts, scale):
    """Packed rows (ragged verify): the K/V write kernel, then the split kernel (+ merge) on CUDA."""
    if use_triton(q, opt_in=True):
        from specc.codegen.kernels import ragged_attention as kern

        return kern.ragged_attention(q, k, v, cache_k, cache_v, cache_len, row_slots, row_starts, scale)
    return ops.ragged_attention(q, k, v, cache_k, cache_v, cache_len, row_slots, row_starts, scale)


_PACKED: dict = {}  # sm tensor identity -> Packed12 (the kernel keeps per-weight state on it)


def packed_linear(x, sm, ex, base, esc_idx, esc_val, n, k, base_mode, bias=None, norm_weight=None, eps=1e-6,
                  version=1, residual=None):
    """The bf12 tensor-core kernel where it runs (layouts 2 and 3, 1 .. 32 rows in one launch:
    the residual epilogue fused; the norm by the rms_norm kernel first unless
    ``linear_bf12_mma.fuses_norm``); else the Triton bf12 kernel with the rms_norm kernel before
    it and the residual add after it, as separate ops."""
    if not use_triton(x, opt_in=True):
        return fused.packed_linear(x, sm, ex, base, esc_idx, esc_val, n, k, base_mode, bias, norm_weight, eps,
                                   version, residual)
    from specc.codegen.kernels.linear_bf12 import linear_bf12
    from specc.codegen.kernels.linear_bf12_mma import fuses_norm, launches_for, linear_bf12_mma
    from specc.formats.bf12 import WIDE_LAYOUTS, Packed12

    key = (sm.data_ptr(), sm.device, tuple(sm.shape))
    hit = _PACKED.get(key)
    if hit is None or hit[0] is not sm:
        hit = (sm, Packed12(sm=sm, ex=ex, base=base, esc_idx=esc_idx, esc_val=esc_val, shape=(n, k), base_mode=base_mode,
                            version=version))
        _PACKED[key] = hit
    rows = x.numel() // k
    if version in WIDE_LAYOUTS and launches_for(rows):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k)
        r2 = None if residual is None else residual.reshape(-1, n)
        if norm_weight is None or fuses_norm(rows, k):
            y = linear_bf12_mma(x2, hit[1], bias, norm_weight=norm_weight, eps=eps, residual=r2)
        else:
            y = linear_bf12_mma(rms_norm(x2, norm_weight, eps), hit[1], bias, residual=r2)
        if y is not None:
            return y.reshape(*lead, n)
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    y = linear_bf12(x, hit[1], bias)
    return y if residual is None else residual + y


def rope_attention(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, q_norm_weight, k_norm_weight,
                   eps, mask_kind, scale, tree_mask=None, tree_words=None):
    """Two kernels on CUDA: rope_and_cache (q/k norm, rotation, KV write) then attention
    (``tree_mask``: the tree verify step's ancestor mask, ``tree_words`` the same packed, read by
    the attention kernel)."""
    if not use_triton(q, opt_in=True):
        return fused.rope_attention(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, q_norm_weight,
                                    k_norm_weight, eps, mask_kind, scale,
                                    _reference_mask(tree_mask, tree_words, q.shape[1]))
    from specc.codegen.kernels import attention as attn
    from specc.codegen.kernels import rope

    q_rot = rope.rope_and_cache(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, q_norm_weight,
                                k_norm_weight, eps)
    return attn.attention(q_rot, cache_k, cache_v, cache_len, k.shape[1], mask_kind, scale, tree_mask=tree_mask,
                          tree_words=tree_words)


# --------------------------------------------------------------------------- hybrid (GDN) targets


def conv_step(x, conv_state, weight, cache_len, parents=None):
    """The GDN conv with its window state: one Triton launch on CUDA."""
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import gated_delta as kern

        return kern.conv_step(x, conv_state, weight, cache_len, parents)
    return gdn.conv_step(x, conv_state, weight, cache_len, parents)


def delta_rule_step(mixed, g, beta, state, cache_len, key_heads, parents=None):
    """The gated delta rule with per-node state snapshots: one Triton launch on CUDA."""
    if use_triton(mixed, opt_in=True):
        from specc.codegen.kernels import gated_delta as kern

        return kern.delta_rule_step(mixed, g, beta, state, cache_len, key_heads, parents)
    return gdn.delta_rule_step(mixed, g, beta, state, cache_len, key_heads, parents)


# element-wise GDN / gated-attention ops: one Triton launch each on CUDA (kernels/gdn_elementwise.py)
def gdn_gates(b, a, a_log, dt_bias):
    if use_triton(b, opt_in=True):
        from specc.codegen.kernels import gdn_elementwise as kern

        return kern.gdn_gates(b, a, a_log, dt_bias)
    return gdn.gdn_gates(b, a, a_log, dt_bias)


def gated_head_norm(x, gate, weight, eps):
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import gdn_elementwise as kern

        return kern.gated_head_norm(x, gate, weight, eps)
    return gdn.gated_head_norm(x, gate, weight, eps)


def rms_norm_offset(x, weight, eps):
    if use_triton(x, opt_in=True):
        from specc.codegen.kernels import gdn_elementwise as kern

        return kern.offset_rms_norm(x, weight, eps)
    return gdn.rms_norm_offset(x, weight, eps)


def tree_parents(tree_mask, like):
    """Its reference body everywhere (a few small ops on the [B, Q, Q] mask)."""
    return gdn.tree_parents(tree_mask, like)
