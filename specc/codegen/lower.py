"""Lowering: swap each IR leaf op for its kernel-ABI function.

The result is a copy of the step's GraphModule whose call targets are
``specc.codegen.kernel_abi`` functions; everything else (views, splits, adds: free or glue) stays
as torch code. Ops with no kernel (a user's new fused op, say) keep their eager body and are
reported, never silently dropped.

With a measured :class:`~specc.codegen.linear_choice.LinearChoice`, each linear node (plain, with
a norm prologue, with a residual epilogue) whose weight shape the table covers gets the row ranges
in which cuBLAS measured faster (``cublas_rows=...`` in the generated call), and the report
records, per shape, which nodes, which row ranges, which implementation and the measured times.

Residual-norm pairs (``codegen/residual_norm.py``): a linear_add whose sum feeds a norm_linear,
both given cuBLAS rows, becomes one ``kernel_abi.linear_add_norm_linear`` call (and two
``getitem``s) standing where the linear_add stood; at those rows the residual add runs inside the
norm's kernel. The report counts them.

Tree steps: the attention nodes' ancestor mask (a bool step input, as the IR and the GDN ops
read it) is packed into bit words once, by one ``kernel_abi.tree_mask_words`` node inserted
before the first attention, and every attention call gets them as ``tree_words=`` (the kernel
reads words instead of byte tiles; ``codegen/kernels/tree_mask.py``).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import inspect
import operator

import torch.fx

from specc.codegen import kernel_abi as abi
from specc.codegen import residual_norm
from specc.codegen.linear_choice import LinearChoice
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


# attention ops whose tree_mask argument lowering packs into bit words (passed as tree_words=)
TREE_ATTENTION = (ops.attention, rope_attention)


def _tree_mask_arg(node: torch.fx.Node):
    """The node's ``tree_mask`` argument (a graph node, or None when it has none)."""
    mask = _bound(node).get("tree_mask")
    return mask if isinstance(mask, torch.fx.Node) else None


# the linear ops a LinearChoice applies to, and the position of their weight argument
CHOICE_WEIGHT_ARG = {ops.linear: 1, fused.norm_linear: 3, fused.linear_add: 1}


@dataclasses.dataclass
class LoweringReport:
    lowered: dict[str, int]
    eager: dict[str, int]  # leaf ops without a kernel, run through their Python body
    # with a LinearChoice: per measured weight shape, {"N", "K", "nodes", "ranges"} (ranges as
    # ShapeChoice.ranges(): rows, impl and the measured points behind it)
    linear_impl: list[dict] | None = None
    residual_norm_pairs: int = 0  # linear_add + norm_linear pairs lowered as one call (residual_norm.py)

    def summary(self) -> str:
        text = f"lowered {sum(self.lowered.values())} ops to kernels"
        if self.residual_norm_pairs:
            text += f" ({self.residual_norm_pairs} residual-norm pairs)"
        if self.eager:
            text += f"; {sum(self.eager.values())} ops run eagerly ({', '.join(sorted(self.eager))})"
        return text


def _is_leaf_op(target) -> bool:
    module = getattr(target, "__module__", "") or ""
    return callable(target) and not module.startswith(("torch", "_operator", "builtins")) and module != "operator"


def _weight_shape(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[int, int] | None:
    """(N, K) of a linear node's weight when it is a module tensor (else None: not choosable)."""
    pos = CHOICE_WEIGHT_ARG[node.target]
    w = node.args[pos] if len(node.args) > pos else node.kwargs.get("weight")
    if not isinstance(w, torch.fx.Node) or w.op != "get_attr":
        return None
    obj = gm
    for part in w.target.split("."):
        obj = getattr(obj, part, None)
    if not torch.is_tensor(obj) or obj.dim() != 2:
        return None
    return int(obj.shape[0]), int(obj.shape[1])


def lower(gm: torch.fx.GraphModule, linear_choice: LinearChoice | None = None
          ) -> tuple[torch.fx.GraphModule, LoweringReport]:
    """A lowered copy of ``gm`` (parameters shared, graph copied) and what was lowered.
    ``linear_choice``: measured per-shape implementations of the linears (None: Triton for all)."""
    out = copy.copy(gm)  # shallow: shares submodules and tensors
    graph = copy.deepcopy(gm.graph)
    lowered: collections.Counter = collections.Counter()
    eager: collections.Counter = collections.Counter()
    chosen: dict[tuple[int, int], list[str]] = {}
    words: dict[torch.fx.Node, torch.fx.Node] = {}  # tree mask -> its packed words
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = LOWERING.get(node.target)
        if node.target in TREE_ATTENTION and (mask := _tree_mask_arg(node)) is not None:
            if mask not in words:
                with graph.inserting_before(node):
                    words[mask] = graph.call_function(abi.tree_mask_words, (mask,))
                lowered[abi.tree_mask_words.__name__] += 1
            node.kwargs = {**node.kwargs, "tree_words": words[mask]}
        if target is not None:
            if linear_choice is not None and node.target in CHOICE_WEIGHT_ARG:
                shape = _weight_shape(gm, node)
                if shape is not None and linear_choice.shape(*shape) is not None:
                    chosen.setdefault(shape, []).append(node.name)
                    rows = linear_choice.cublas_rows(*shape)
                    if rows:
                        node.kwargs = {**node.kwargs, "cublas_rows": rows}
            node.target = target
            lowered[target.__name__] += 1
        elif _is_leaf_op(node.target):
            eager[getattr(node.target, "__name__", str(node.target))] += 1
    paired = _pair_residual_norms(graph) if linear_choice is not None and residual_norm.enabled() else 0
    out = torch.fx.GraphModule(gm, graph, class_name=gm.__class__.__name__)
    records = None
    if linear_choice is not None:
        records = [{"N": n, "K": k, "nodes": names, "ranges": linear_choice.shape(n, k).ranges()}
                   for (n, k), names in sorted(chosen.items())]
    return out, LoweringReport(dict(lowered), dict(eager), records, paired)


def _bound(node: torch.fx.Node) -> dict:
    """The node's arguments by parameter name, defaults filled in."""
    bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _pair_residual_norms(graph: torch.fx.Graph) -> int:
    """Replace every lowered (linear_add, norm_linear) pair whose linears both got cuBLAS rows by
    one ``kernel_abi.linear_add_norm_linear`` call at the linear_add's place; how many."""
    count = 0
    for add, norm in residual_norm.pairs(graph):
        a, b = _bound(add), _bound(norm)
        if not (a["cublas_rows"] and b["cublas_rows"]):
            continue
        residual_norm.hoist_weights(add, norm)
        with graph.inserting_before(add):
            pair = graph.call_function(abi.linear_add_norm_linear,
                                       (a["x"], a["weight"], a["bias"], a["residual"], b["norm_weight"], b["eps"],
                                        b["weight"], b["bias"]),
                                       {"cublas_rows": a["cublas_rows"], "norm_cublas_rows": b["cublas_rows"]})
            total = graph.call_function(operator.getitem, (pair, 0))
            out = graph.call_function(operator.getitem, (pair, 1))
        norm.replace_all_uses_with(out)
        graph.erase_node(norm)
        add.replace_all_uses_with(total)
        graph.erase_node(add)
        count += 1
    return count
