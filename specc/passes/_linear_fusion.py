"""Shared mechanics of the sibling-linear fusions (fuse_qkv, fuse_gate_up).

Linears that read the same input become one linear over their weights concatenated along the
output dim, followed by a ``split`` of the result. The concatenated weight is a new frozen
parameter on the GraphModule (one copy made at pass time; on the meta device it stays meta), so
the rewritten graph still runs and computes the same numbers: each output column is the same dot
product as before.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from specc.ir import GROUP_KEY, IR, SCOPE_KEY
from specc.models import ops


def linear_parts(node: torch.fx.Node):
    """(x, weight get_attr node, bias node or None) of a linear node."""
    x = node.args[0]
    w = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    return x, w, b


def fusable(ir: IR, group: list[torch.fx.Node]) -> bool:
    """Same input, weights are plain parameters of one dtype/device/in-features, biases all or none."""
    if len(group) < 2:
        return False
    parts = [linear_parts(n) for n in group]
    if len({id(p[0]) for p in parts}) != 1:
        return False
    ws = [p[1] for p in parts]
    if not all(isinstance(w, torch.fx.Node) and ir.meta(w).kind == "weight" for w in ws):
        return False
    metas = [ir.meta(w).tensor for w in ws]
    if len({(m.dtype, m.shape[1]) for m in metas}) != 1:
        return False
    tensors = [ir.get_tensor(w) for w in ws]
    if len({t.device for t in tensors}) != 1:
        return False
    biases = [p[2] for p in parts]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return False
    if not all(b is None or (isinstance(b, torch.fx.Node) and ir.meta(b).kind == "weight") for b in biases):
        return False
    return True


def _fused_names(ir: IR, group: list[torch.fx.Node]) -> tuple[str, str]:
    """(weight qualname, node name) for the fused linear, from the members' weight names:
    layers.0.self_attn.{q,k,v}_proj.weight -> layers.0.self_attn.qkv_proj.weight."""
    targets = [linear_parts(n)[1].target for n in group]
    split = [t.rsplit(".", 2) for t in targets]
    if all(len(s) == 3 and s[2] == "weight" for s in split) and len({s[0] for s in split}) == 1:
        leaves = [s[1][: -len("_proj")] if s[1].endswith("_proj") else s[1] for s in split]
        joined = "".join(leaves) if all(len(x) == 1 for x in leaves) else "_".join(leaves)
        module = f"{split[0][0]}.{joined}_proj"
    else:
        module = "fused_" + "_".join(group[0].name.split("_")[-2:])
    return f"{module}.weight", module.replace(".", "_")


def fuse_linears(ir: IR, group: list[torch.fx.Node]) -> torch.fx.Node:
    """Replace ``group`` (fusable linears, graph order) by linear(x, cat(W)) + split; returns the
    fused linear node. Leaves metadata stale: call ``ir.refresh()`` when done."""
    graph = ir.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    group = sorted(group, key=order.__getitem__)
    parts = [linear_parts(n) for n in group]
    x = parts[0][0]
    ws = [p[1] for p in parts]
    bs = [p[2] for p in parts]
    weight_name, node_name = _fused_names(ir, group)
    with torch.no_grad():
        fused_w = torch.cat([ir.get_tensor(w).detach() for w in ws], dim=0)
        fused_b = torch.cat([ir.get_tensor(b).detach() for b in bs], dim=0) if bs[0] is not None else None
    weight_name = ir.add_weight(weight_name, fused_w)
    bias_name = ir.add_weight(weight_name.rsplit(".", 1)[0] + ".bias", fused_b) if fused_b is not None else None
    sizes = [int(ir.get_tensor(w).shape[0]) for w in ws]
    scope = weight_name.rsplit(".", 1)[0]
    groups = {n.meta.get(GROUP_KEY) for n in group}
    with graph.inserting_before(group[0]):
        w_node = graph.get_attr(weight_name)
        b_node = graph.get_attr(bias_name) if bias_name else None
        fused = graph.create_node("call_function", ops.linear, (x, w_node, b_node), name=node_name)
        pieces = graph.create_node("call_function", torch.split, (fused, sizes), {"dim": -1}, name=f"{node_name}_split")
        outs = [graph.create_node("call_function", operator.getitem, (pieces, i), name=f"{m.name}_part")
                for i, m in enumerate(group)]
    group_tag = next(iter(groups)) if len(groups) == 1 else None
    for n in (w_node, b_node, fused, pieces, *outs):
        if n is not None:
            n.meta[SCOPE_KEY] = scope
            if group_tag is not None:
                n.meta[GROUP_KEY] = group_tag
    for member, out in zip(group, outs):
        member.replace_all_uses_with(out)
        graph.erase_node(member)
    for old in ws + [b for b in bs if b is not None]:
        if not old.users:
            graph.erase_node(old)
    return fused
