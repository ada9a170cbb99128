"""Lowering: swap each IR leaf op for its kernel-ABI function.

The result is a copy of the step's GraphModule whose call targets are
``specc.codegen.kernel_abi`` functions; everything else (views, splits, adds: free or glue) stays
as torch code. Ops with no kernel (a user's new fused op, say) keep their eager body and are
reported, never silently dropped.
"""

from __future__ import annotations

import collections
import copy
import dataclasses

import torch.fx

from specc.codegen import kernel_abi as abi
from specc.models import fused_ops as fused
from specc.models import gdn, ops
from specc.models.fused_ops import packed_linear, rope_attention

LOWERING = {
    ops.embedding: abi.embedding,
    ops.linear: abi.linear,
    ops.rms_norm: abi.rms_norm,
    ops.silu_mul: abi.silu_mul,
    ops.rope_tables: abi.rope_tables,
    ops.rope: abi.rope,
    ops.attention: abi.attention,
    ops.ragged_attention: abi.ragged_attention,
    fused.norm_linear: abi.norm_linear,
    fused.linear_add: abi.linear_add,
    packed_linear: abi.packed_linear,
    rope_attention: abi.rope_attention,
    gdn.conv_step: abi.conv_step,
    gdn.delta_rule_step: abi.delta_rule_step,
    gdn.gdn_gates: abi.gdn_gates,
    gdn.gated_head_norm: abi.gated_head_norm,
    gdn.rms_norm_offset: abi.rms_norm_offset,
    gdn.tree_parents: abi.tree_parents,
}


@dataclasses.dataclass
class LoweringReport:
    lowered: dict[str, int]
    eager: dict[str, int]  # leaf ops without a kernel, run through their Python body

    def summary(self) -> str:
        text = f"lowered {sum(self.lowered.values())} ops to kernels"
        if self.eager:
            text += f"; {sum(self.eager.values())} ops run eagerly ({', '.join(sorted(self.eager))})"
        return text


def _is_leaf_op(target) -> bool:
    module = getattr(target, "__module__", "") or ""
    return callable(target) and not module.startswith(("torch", "_operator", "builtins")) and module != "operator"


def lower(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, LoweringReport]:
    """A lowered copy of ``gm`` (parameters shared, graph copied) and what was lowered."""
    out = copy.copy(gm)  # shallow: shares submodules and tensors
    graph = copy.deepcopy(gm.graph)
    lowered: collections.Counter = collections.Counter()
    eager: collections.Counter = collections.Counter()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = LOWERING.get(node.target)
        if target is not None:
            node.target = target
            lowered[target.__name__] += 1
        elif _is_leaf_op(node.target):
            eager[getattr(node.target, "__name__", str(node.target))] += 1
    out = torch.fx.GraphModule(gm, graph, class_name=gm.__class__.__name__)
    return out, LoweringReport(dict(lowered), dict(eager))
