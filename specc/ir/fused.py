"""Fused ops that built-in passes introduce, with their eager semantics and IR rules.

Each fused op's eager body calls the same leaf ops in the same order as the unfused graph, so a
rewritten graph computes bit-identical results on CPU; its *cost* is what a fused kernel moves
(the intermediate never goes to memory). Codegen lowers these kinds to fused kernels.
"""

from __future__ import annotations

import torch
import torch.fx

from specc.ir.meta import TensorMeta
from specc.ir.rules import Cost, OpCall, linear_cost, register_op
from specc.models.fused_ops import linear_add, norm_linear  # the eager bodies

__all__ = ["linear_add", "norm_linear"]


@register_op(norm_linear, "norm_linear")
def _norm_linear(op: OpCall) -> Cost:
    """rms_norm as the prologue of a linear: the normed activation is never stored."""
    x, nw = op.tensor(0, "x"), op.tensor(1, "norm_weight")
    eps = op.arg(2, "eps")
    w, b = op.tensor(3, "weight"), op.tensor(4, "bias", optional=True)
    op.check(nw.ndim == 1 and op.same(nw.shape[0], x.shape[-1]), f"norm weight {nw} does not match last dim of {x}")
    normed = TensorMeta(x.shape, torch.promote_types(nw.dtype, x.dtype))
    cost = linear_cost(op, normed, w, b)
    cost.flops = cost.flops + 4 * x.numel
    cost.attrs = {**cost.attrs, "eps": float(eps)}
    return cost


@register_op(linear_add, "linear_add")
def _linear_add(op: OpCall) -> Cost:
    """A linear whose epilogue adds the residual stream: the product is never stored."""
    x, w = op.tensor(0, "x"), op.tensor(1, "weight")
    b, r = op.tensor(2, "bias", optional=True), op.tensor(3, "residual")
    cost = linear_cost(op, x, w, b)
    out = cost.out
    op.check(r.same_as(out), f"residual {r} must match the linear's output {out}")
    cost.flops = cost.flops + out.numel
    return cost
