"""IR rules of the hybrid (gated DeltaNet + gated attention) targets' leaf ops (``specc.models.gdn``,
``torch.sigmoid`` and ``Tensor.chunk`` of the gated attention).

The two ops that own a GDN layer's state, ``gdn_conv`` (the conv window) and
``gated_delta_rule`` (the recurrent matrix state), are registered like attention: impure, with
their state buffer as a cache argument, so the buffer's get_attr node is a ``kv_cache`` node
carrying its ``StateSpec`` (kinds ``conv`` / ``recurrent``) and the cost model sees the state
traffic as cache bytes. They read the live entry of B rows and write the state before the step,
one snapshot per block node (what a commit selects from) and, in a chain, the live entry again:
``Q + 2`` entries per row for a chain, ``Q + 1`` for a tree. (A prefill-sized chain longer than
the buffer's capacity writes fewer; the rule charges the verify case.)

FLOPs: the conv 2 * K per output element (+ SiLU); the delta rule ~7 * dk * dv per token and
value head (decay, k S, the rank-1 update, q S), as the recurrence computes it.
"""

from __future__ import annotations

import sympy
import torch

from specc.ir.meta import TensorMeta
from specc.ir.rules import Cost, OpCall, register_op
from specc.ir.symbols import ZERO, same
from specc.models import gdn


def _check_rows(op: OpCall, x: TensorMeta, cache_len: TensorMeta, parents: TensorMeta | None) -> None:
    bsz, q = x.shape[0], x.shape[1]
    op.check(cache_len.ndim == 1 and same(cache_len.shape[0], bsz), f"cache_len {cache_len} should be [{bsz}]")
    if parents is not None:
        op.check(parents.ndim == 2 and same(parents.shape[0], bsz) and same(parents.shape[1], q),
                 f"parents {parents} should be [{bsz}, {q}]")


def _entries_written(q, parents) -> sympy.Expr:
    """State entries a step writes per row: before + one per node (+ the live one in a chain)."""
    return q + (1 if parents is not None else 2)


@register_op(gdn.rms_norm_offset, "offset_rms_norm")
def _offset_rms_norm(op: OpCall) -> Cost:
    """zero-centred RMSNorm (scale 1 + weight), fp32 statistics"""
    x, w = op.tensor(0, "x"), op.tensor(1, "weight")
    op.check(w.ndim == 1 and same(w.shape[0], x.shape[-1]), f"norm weight {w} does not match last dim of {x}")
    return Cost(TensorMeta(x.shape, x.dtype), flops=5 * x.numel, attrs={"eps": float(op.arg(2, "eps"))})


@register_op(gdn.gated_head_norm, "gated_rms_norm")
def _gated_head_norm(op: OpCall) -> Cost:
    """RMSNorm per value head of the GDN output, times SiLU of the output gate"""
    x, gate, w = op.tensor(0, "x"), op.tensor(1, "gate"), op.tensor(2, "weight")
    op.check(x.same_as(gate) or all(same(a, b) for a, b in zip(x.shape, gate.shape)), f"x {x} and gate {gate} differ")
    op.check(w.ndim == 1, f"norm weight must be 1-D, got {w}")
    dim, head = x.shape[-1], w.shape[0]
    op.check(isinstance(dim, sympy.Integer) and int(dim) % int(head) == 0,
             f"last dim {dim} of {x} is not a multiple of the head dim {head}")
    return Cost(TensorMeta(x.shape, x.dtype), flops=10 * x.numel,
                attrs={"eps": float(op.arg(3, "eps")), "head_dim": int(head)})


@register_op(gdn.tree_parents, "tree_parents")
def _tree_parents(op: OpCall) -> Cost:
    """each draft-tree node's parent from the ancestor mask"""
    mask, like = op.tensor(0, "tree_mask"), op.tensor(1, "like")
    op.check(mask.ndim in (2, 3) and same(mask.shape[-1], mask.shape[-2]), f"tree_mask {mask} should be [B, Q, Q]")
    return Cost(TensorMeta((like.shape[0], mask.shape[-1]), torch.long), flops=mask.numel, reads={1: ZERO})


@register_op(gdn.gdn_gates, "gdn_gates")
def _gdn_gates(op: OpCall) -> Cost:
    """GDN decay g = -exp(A_log) softplus(a + dt_bias) and write strength beta = sigmoid(b)"""
    b, a = op.tensor(0, "b"), op.tensor(1, "a")
    a_log, dt_bias = op.tensor(2, "a_log"), op.tensor(3, "dt_bias")
    op.check(all(same(x, y) for x, y in zip(a.shape, b.shape)) and a.ndim == b.ndim, f"a {a} and b {b} differ")
    for name, t in (("A_log", a_log), ("dt_bias", dt_bias)):
        op.check(t.ndim == 1 and same(t.shape[0], a.shape[-1]), f"{name} {t} does not match {a}")
    return Cost((TensorMeta(a.shape, torch.float32), TensorMeta(b.shape, b.dtype)), flops=6 * a.numel)


@register_op(gdn.conv_step, "gdn_conv", impure=True, cache_args=(1,))
def _conv_step(op: OpCall) -> Cost:
    """depthwise causal conv + SiLU over the block with the layer's conv window (along ancestor paths in a tree)"""
    x, state, w = op.tensor(0, "x"), op.tensor(1, "conv_state"), op.tensor(2, "weight")
    cache_len, parents = op.tensor(3, "cache_len"), op.tensor(4, "parents", optional=True)
    op.check(x.ndim == 3, f"conv input must be [B, Q, C], got {x}")
    op.check(state.ndim == 4 and same(state.shape[2], x.shape[-1]),
             f"conv state {state} does not hold [*, *, {x.shape[-1]}, K - 1] windows")
    op.check(w.ndim == 3 and same(w.shape[0], x.shape[-1]) and same(w.shape[2], state.shape[3] + 1),
             f"conv weight {w} should be [{x.shape[-1]}, 1, {state.shape[3] + 1}]")
    _check_rows(op, x, cache_len, parents)
    bsz, q, ch = x.shape
    kernel = w.shape[2]
    entry = bsz * ch * (kernel - 1) * state.itemsize
    return Cost(TensorMeta(x.shape, x.dtype), flops=(2 * kernel + 4) * x.numel, reads={1: entry},
                cache_writes={1: entry * _entries_written(q, parents)},
                attrs={"kernel": int(kernel), "channels": int(ch), "tree": parents is not None})


@register_op(gdn.delta_rule_step, "gated_delta_rule", impure=True, cache_args=(3,))
def _delta_rule_step(op: OpCall) -> Cost:
    """the gated delta rule over the block from the layer's recurrent state, one state per node"""
    mixed, g, beta = op.tensor(0, "mixed"), op.tensor(1, "g"), op.tensor(2, "beta")
    state, cache_len = op.tensor(3, "state"), op.tensor(4, "cache_len")
    hk, parents = op.arg(5, "key_heads"), op.tensor(6, "parents", optional=True)
    op.check(state.ndim == 5, f"recurrent state must be [Bmax, entries, Hv, dk, dv], got {state}")
    op.check(state.dtype == torch.float32, f"recurrent state must be fp32, got {state.dtype}")
    hv, dk, dv = (int(s) for s in state.shape[2:])
    op.check(isinstance(hk, int) and hk > 0 and hv % hk == 0, f"value heads {hv} not a multiple of key heads {hk}")
    op.check(mixed.ndim == 3 and same(mixed.shape[-1], 2 * hk * dk + hv * dv),
             f"mixed {mixed} should be [B, Q, {2 * hk * dk + hv * dv}] (q | k | v)")
    for name, t in (("g", g), ("beta", beta)):
        op.check(t.ndim == 3 and all(same(a, b) for a, b in zip(t.shape, (*mixed.shape[:2], hv))),
                 f"{name} {t} should be [{mixed.shape[0]}, {mixed.shape[1]}, {hv}]")
    _check_rows(op, mixed, cache_len, parents)
    bsz, q = mixed.shape[0], mixed.shape[1]
    entry = bsz * hv * dk * dv * state.itemsize
    return Cost(TensorMeta((bsz, q, hv * dv), mixed.dtype), flops=7 * bsz * q * hv * dk * dv, reads={3: entry},
                cache_writes={3: entry * _entries_written(q, parents)},
                attrs={"key_heads": hk, "value_heads": hv, "key_dim": dk, "value_dim": dv,
                       "tree": parents is not None})


@register_op(torch.sigmoid, "sigmoid")
def _sigmoid(op: OpCall) -> Cost:
    """elementwise logistic (the gated attention's output gate)"""
    x = op.tensor(0, "input")
    return Cost(TensorMeta(x.shape, x.dtype), flops=4 * x.numel)


@register_op("chunk", "split", view=True)
def _chunk(op: OpCall) -> Cost:
    t, chunks, dim = op.tensor(0), op.arg(1, "chunks"), op.arg(2, "dim", 0)
    d = dim % t.ndim
    size = t.shape[d]
    op.check(isinstance(chunks, int) and isinstance(size, sympy.Integer) and int(size) % chunks == 0,
             f"chunk({chunks}) needs a static dim divisible by it, got {size}")
    shape = list(t.shape)
    shape[d] = sympy.Integer(int(size) // chunks)
    return Cost(tuple(TensorMeta(tuple(shape), t.dtype) for _ in range(chunks)),
                attrs={"dim": dim, "sections": [int(size) // chunks] * chunks})
