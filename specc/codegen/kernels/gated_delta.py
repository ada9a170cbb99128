"""Gated DeltaNet step kernels: the GDN layer's two state-owning ops of ``specc.models.gdn``.

- :func:`delta_rule_step`: the gated delta rule over a block of Q tokens (decode Q = 1, chain
  verify, tree verify). One program per (row, value head, block of value columns): the delta
  rule is separable in the state's value columns (``k S``, the rank-1 update and ``q S`` all
  act per column), so a program keeps its ``[dk, BLOCK_V]`` slice of the fp32 state in
  registers for the whole block. It writes the state before the step (entry 1), the state after
  every node (entry 2 + i: the snapshots a commit selects from) and, in a chain, the final state
  into the live entry 0. A tree node whose parent is not the previous node reloads its parent's
  snapshot (entry 2 + parent, or entry 1 for a root child) that the same program wrote before.
- :func:`conv_step`: the depthwise causal convolution + SiLU. One program per (row, block of
  channels) walks the block's nodes in order; each node's K taps follow its ancestor path
  (``parents``; a chain's path is the flat order) back into the committed window. It writes the
  window before the step (entry 1), each node's window (entry 2 + i) and, in a chain, the last
  node's window into entry 0, after every read of the live window.

Snapshots rather than replay: the recurrence computes every per-node state anyway (tree nodes
need their parents' states), so a commit is a selection of entries with no model math; the
replay alternative (keep the per-token inputs, recompute the accepted prefix at commit) is
measured against it by ``examples/bench_hybrid_commit.py`` (docs/hybrid.md).

Both launchers take exactly the model ops' arguments; off CUDA (without the interpreter) they
run the references, which are those ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, next_pow2, precise_exp, \
    round_to, rounded, use_triton
from specc.codegen.kernels.pdl import pdl_args, pdl_wait
from specc.models import gdn

__all__ = ["delta_rule_step", "conv_step", "delta_rule_step_reference", "conv_step_reference"]

L2_EPS = tl.constexpr(1e-6)  # specc.models.gdn.l2norm's eps


@triton.jit
def _delta_rule_kernel(mixed_ptr, g_ptr, beta_ptr, state_ptr, cache_len_ptr, parents_ptr, out_ptr,
                       Q, SLOTS, HV, GROUP, DK, DV, K_OFF, V_OFF,
                       s_mb, s_mq, s_gb, s_gq, s_bb, s_bq, s_sb, s_se, s_sh, s_ob, s_oq, s_pb,
                       scale, CHAIN: tl.constexpr, WRITE_NODES: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = h // GROUP
    rk = tl.arange(0, BLOCK_K)
    rv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mk, mv = rk < DK, rv < DV
    tile = rk[:, None] * DV + rv[None, :]
    tmask = mk[:, None] & mv[None, :]
    head = state_ptr + b * s_sb + h * s_sh
    live = tl.load(cache_len_ptr + b) != 0  # a row starting a sequence reads a zero state
    s = tl.where(live, tl.load(head + tile, mask=tmask, other=0.0), 0.0)
    tl.store(head + s_se + tile, s, mask=tmask)  # entry 1: the state before the step
    for i in range(0, Q):
        if not CHAIN:
            par = tl.load(parents_ptr + b * s_pb + i)
            if par != i - 1:
                tl.debug_barrier()
                entry = tl.where(par >= 0, par + 2, 1)
                s = tl.load(head + entry * s_se + tile, mask=tmask, other=0.0)
        row = mixed_ptr + b * s_mb + i * s_mq
        q = tl.load(row + kh * DK + rk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(row + K_OFF + kh * DK + rk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(row + V_OFF + h * DV + rv, mask=mv, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + L2_EPS) * scale  # as gdn.l2norm: x * rsqrt(|x|^2 + eps)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + L2_EPS)
        g = tl.load(g_ptr + b * s_gb + i * s_gq + h).to(tl.float32)
        beta = tl.load(beta_ptr + b * s_bb + i * s_bq + h).to(tl.float32)
        s = s * precise_exp(g)
        delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], axis=0)
        tl.store(out_ptr + b * s_ob + i * s_oq + h * DV + rv, round_to(o, out_ptr.dtype.element_ty), mask=mv)
        if WRITE_NODES:
            tl.store(head + (i + 2) * s_se + tile, s, mask=tmask)
    if CHAIN:
        tl.store(head + tile, s, mask=tmask)  # entry 0: the live state after the block


@triton.jit
def _conv_kernel(x_ptr, state_ptr, w_ptr, cache_len_ptr, parents_ptr, out_ptr,
                 Q, SLOTS, C, s_xb, s_xq, s_sb, s_se, s_sc, s_ob, s_oq, s_pb,
                 CHAIN: tl.constexpr, KERNEL: tl.constexpr, W: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mc = rc < C
    live = tl.load(cache_len_ptr + b) != 0  # a row starting a sequence reads a zero window
    base = state_ptr + b * s_sb + rc * s_sc
    for j in tl.static_range(W):  # entry 1: the window before the step
        col = tl.where(live, tl.load(base + j, mask=mc, other=0.0), 0.0).to(state_ptr.dtype.element_ty)
        tl.store(base + s_se + j, col, mask=mc)
    tl.debug_barrier()
    for i in range(0, Q):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        e = tl.zeros([], dtype=tl.int64) + i + W  # index into [window (W columns); block (Q nodes)]
        for t in tl.static_range(KERNEL):
            tap = KERNEL - 1 - t
            node = e - W
            in_block = e >= W
            at = rc * 0 + e  # the scalar as a vector: masks must be vectors
            xv = tl.load(x_ptr + b * s_xb + tl.maximum(node, 0) * s_xq + rc, mask=mc & (at >= W), other=0.0)
            wv = tl.load(base + s_se + tl.maximum(e, 0), mask=mc & (at < W), other=0.0)
            val = tl.where(in_block, xv.to(tl.float32), wv.to(tl.float32))
            weight = tl.load(w_ptr + rc * KERNEL + tap, mask=mc, other=0.0).to(tl.float32)
            acc += val * weight  # fp32 products and sum, rounded once below (as F.conv1d)
            if tap >= 1:
                if i < SLOTS:  # node i's window: its path's last W inputs, oldest first
                    tl.store(base + (i + 2) * s_se + (tap - 1), val.to(state_ptr.dtype.element_ty), mask=mc)
            if t < KERNEL - 1:
                if CHAIN:
                    par = node - 1
                else:
                    par = tl.load(parents_ptr + b * s_pb + tl.maximum(node, 0), mask=in_block, other=0)
                e = tl.where(in_block, tl.where(par >= 0, par + W, W - 1), tl.maximum(e - 1, 0))
        acc = rounded(acc, w_ptr.dtype.element_ty)  # the conv's result in the weight's dtype
        y = acc / (1.0 + precise_exp(-acc))
        tl.store(out_ptr + b * s_ob + i * s_oq + rc, round_to(y, out_ptr.dtype.element_ty), mask=mc)
    if CHAIN:
        tl.debug_barrier()
        for j in tl.static_range(W):  # entry 0: the block's last W inputs, after every read of the window
            src = Q + j  # index into [window; block]
            from_x = src >= W
            at = rc * 0 + src
            xv = tl.load(x_ptr + b * s_xb + tl.maximum(src - W, 0) * s_xq + rc, mask=mc & (at >= W), other=0.0)
            wv = tl.load(base + s_se + tl.minimum(src, W - 1), mask=mc & (at < W), other=0.0)
            tl.store(base + j, tl.where(from_x, xv.to(state_ptr.dtype.element_ty), wv), mask=mc)


def _check_state(op, state, ndim, rows, parents, q):
    check_tensor("state", state, op, ndim=ndim)
    if not state.is_contiguous():
        raise ValueError(f"{op}: the state buffer must be contiguous")
    if state.shape[0] < rows:
        raise ValueError(f"{op}: the state holds {state.shape[0]} rows, the block has {rows}")
    if parents is not None and tuple(parents.shape) != (rows, q):
        raise ValueError(f"{op}: parents {tuple(parents.shape)} should be ({rows}, {q})")


def delta_rule_step(mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                    cache_len: torch.Tensor, key_heads: int, parents: torch.Tensor | None = None) -> torch.Tensor:
    """``specc.models.gdn.delta_rule_step`` as one launch (arguments and result the same)."""
    op = "delta_rule_step"
    check_tensor("mixed", mixed, op, ndim=3, dtypes=FLOAT_DTYPES)
    bsz, q = mixed.shape[0], mixed.shape[1]
    _check_state(op, state, 5, bsz, parents, q)
    if state.dtype != torch.float32:
        raise TypeError(f"{op}: the recurrent state must be float32, got {state.dtype}")
    check_same_device(op, mixed=mixed, g=g, beta=beta, state=state, cache_len=cache_len, parents=parents)
    slots = state.shape[1] - 2
    hv, dk, dv = state.shape[2], state.shape[3], state.shape[4]
    if mixed.shape[2] != 2 * key_heads * dk + hv * dv or hv % key_heads:
        raise ValueError(f"{op}: mixed {tuple(mixed.shape)} does not hold q | k | v of {key_heads} key heads x {dk} "
                         f"and {hv} value heads x {dv}")
    if parents is not None and q > slots:
        raise RuntimeError(f"a tree of {q} nodes exceeds the GDN state's {slots} per-node entries: "
                           f"setup_caches(..., max_block={q})")
    if not use_triton(mixed):
        return delta_rule_step_reference(mixed, g, beta, state, cache_len, key_heads, parents)
    mixed, g, beta = mixed.contiguous(), g.contiguous(), beta.contiguous()
    out = torch.empty(bsz, q, hv * dv, dtype=mixed.dtype, device=mixed.device)
    block_v = min(32, next_pow2(dv))
    pars = parents.contiguous() if parents is not None else cache_len
    _delta_rule_kernel[(bsz, hv, triton.cdiv(dv, block_v))](
        mixed, g, beta, state, cache_len, pars, out, q, slots, hv, hv // key_heads, dk, dv,
        key_heads * dk, 2 * key_heads * dk, mixed.stride(0), mixed.stride(1), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1), state.stride(0), state.stride(1), state.stride(2), out.stride(0),
        out.stride(1), pars.stride(0), dk ** -0.5, CHAIN=parents is None,
        WRITE_NODES=parents is not None or q <= slots, BLOCK_K=next_pow2(dk), BLOCK_V=block_v, num_warps=4, **pdl_args(mixed, "gdn"))
    return out


def conv_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, cache_len: torch.Tensor,
              parents: torch.Tensor | None = None) -> torch.Tensor:
    """``specc.models.gdn.conv_step`` as one launch (arguments and result the same)."""
    op = "conv_step"
    check_tensor("x", x, op, ndim=3, dtypes=FLOAT_DTYPES)
    bsz, q, channels = x.shape
    _check_state(op, conv_state, 4, bsz, parents, q)
    kernel = weight.shape[-1]
    if weight.shape != (channels, 1, kernel) or conv_state.shape[2:] != (channels, kernel - 1):
        raise ValueError(f"{op}: weight {tuple(weight.shape)} / state {tuple(conv_state.shape)} do not fit "
                         f"{channels} channels")
    check_same_device(op, x=x, conv_state=conv_state, weight=weight, cache_len=cache_len, parents=parents)
    if not use_triton(x):
        return conv_step_reference(x, conv_state, weight, cache_len, parents)
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    block_c = min(256, next_pow2(channels))
    pars = parents.contiguous() if parents is not None else cache_len
    _conv_kernel[(bsz, triton.cdiv(channels, block_c))](
        x, conv_state, weight, cache_len, pars, out, q, conv_state.shape[1] - 2, channels,
        x.stride(0), x.stride(1), conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        out.stride(0), out.stride(1), pars.stride(0), CHAIN=parents is None, KERNEL=kernel, W=kernel - 1, BLOCK_C=block_c,
        num_warps=4, **pdl_args(x, "gdn"))
    return out


def delta_rule_step_reference(mixed, g, beta, state, cache_len, key_heads, parents=None):
    return gdn.delta_rule_step(mixed, g, beta, state, cache_len, key_heads, parents)


def conv_step_reference(x, conv_state, weight, cache_len, parents=None):
    return gdn.conv_step(x, conv_state, weight, cache_len, parents)
