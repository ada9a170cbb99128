"""fuse_residual_add: the residual add after a linear becomes the linear's epilogue.

``add(r, linear(x, W, b))`` (either operand order) -> ``linear_add(x, W, b, r)`` (specc.ir.fused)
when the linear's only user is that add and ``r`` has exactly the add's shape and dtype (no
broadcast, no promotion). In a decoder layer these are the attention output projection and the
MLP down projection: at batch 1 each add is a launch of its own that moves a few KB, so fusing
them removes two kernels per layer. The kernel adds ``r`` to the *rounded* product and rounds
again, the same two roundings as the separate ops: bit-identical.

A ``packed_linear`` (pack_weights_12bit) takes the add the same way, as its ``residual``
keyword: the bf12 tensor-core kernel adds it in its epilogue with the same two roundings
(elsewhere its lowering runs the add as a separate op). Linears rewritten by other passes
(norm_linear, tensor-parallel linears followed by an all-reduce) are not matched: run this after
them.
"""

from __future__ import annotations

import torch.fx

from specc.ir import GROUP_KEY, IR, SCOPE_KEY, TensorMeta
from specc.ir.fused import linear_add
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass


def _same(ir: IR, a: torch.fx.Node, b: torch.fx.Node) -> bool:
    ma = ir.meta(a).out
    return isinstance(ma, TensorMeta) and ma.same_as(ir.meta(b).out)


def _fusible(ir: IR, lin: torch.fx.Node) -> bool:
    kind = ir.meta(lin).kind
    return kind == "linear" or (kind == "packed_linear" and lin.kwargs.get("residual") is None)


def candidates(ir: IR) -> list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]]:
    """(add, linear, residual) triples that can fuse."""
    out = []
    for add in ir.calls("add"):
        if len(add.args) != 2 or add.kwargs:
            continue
        for lin, res in ((add.args[1], add.args[0]), (add.args[0], add.args[1])):
            if (isinstance(lin, torch.fx.Node) and isinstance(res, torch.fx.Node) and lin is not res
                    and _fusible(ir, lin) and list(lin.users) == [add]
                    and _same(ir, res, add) and _same(ir, lin, add)):
                out.append((add, lin, res))
                break
    return out


@register_pass
class FuseResidualAdd(Pass):
    """Fold ``residual + linear(x)`` into the linear's epilogue (linear_add)."""

    name = "fuse_residual_add"
    after = ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "pack_weights_12bit", "shard_tensor_parallel")

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        graph = ir.graph
        found = candidates(ir)
        for add, lin, _ in found:
            res = add.args[0] if add.args[1] is lin else add.args[1]  # an earlier fusion may have replaced it
            with graph.inserting_before(add):
                if ir.meta(lin).kind == "packed_linear":
                    fused = graph.create_node("call_function", lin.target, lin.args, {**lin.kwargs, "residual": res},
                                              name=f"{lin.name}_add")
                else:
                    x, w = lin.args[0], lin.args[1]
                    b = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
                    fused = graph.create_node("call_function", linear_add, (x, w, b, res), name=f"{lin.name}_add")
            fused.meta[SCOPE_KEY] = lin.meta.get(SCOPE_KEY, "")
            if lin.meta.get(GROUP_KEY):
                fused.meta[GROUP_KEY] = lin.meta[GROUP_KEY]
            add.replace_all_uses_with(fused)
            graph.erase_node(add)
            graph.erase_node(lin)
        if found:
            ir.refresh()
        return PassResult(bool(found), {"adds": len(found)})

    def ensures(self, ir: IR) -> bool | str:
        left = candidates(ir)
        return True if not left else f"add %{left[0][0].name} still follows linear %{left[0][1].name}"
