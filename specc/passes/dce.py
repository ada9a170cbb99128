"""dce: dead-code elimination.

Erases nodes nobody uses (keeping inputs, the output and ops that write KV caches) and deletes
parameters/buffers of the GraphModule that no node refers to any more (e.g. the separate q/k/v
weights after fuse_qkv made fused copies), so the compiled module does not carry them.
"""

from __future__ import annotations

from specc.ir import IR
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass


@register_pass
class DeadCodeElimination(Pass):
    """Remove unused nodes, and weights no node reads any more."""

    name = "dce"

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        nodes = ir.remove_dead()
        attrs = ir.remove_unused_attributes()
        return PassResult(bool(nodes or attrs), {"nodes": nodes, "attributes": attrs})

    def ensures(self, ir: IR) -> bool | str:
        dead = [n.name for n in ir.graph.nodes if not n.users and not ir.is_impure(n)]
        return True if not dead else f"still unused: %{dead[0]}"
