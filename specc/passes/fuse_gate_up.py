"""fuse_gate_up: the MLP's gate and up projections become one linear + split.

Matches ``silu_mul(gate, up)`` where gate and up are linears of the same input used only there.
"""

from __future__ import annotations

import torch.fx

from specc.ir import IR
from specc.passes._linear_fusion import fusable, fuse_linears
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass


def gate_up_pairs(ir: IR) -> list[list[torch.fx.Node]]:
    pairs = []
    for node in ir.calls("silu_mul"):
        gate, up = node.args[0], node.args[1]
        if not all(isinstance(n, torch.fx.Node) and ir.meta(n).kind == "linear" and list(n.users) == [node]
                   for n in (gate, up)):
            continue
        if gate is not up and fusable(ir, [gate, up]):
            pairs.append([gate, up])
    return pairs


@register_pass
class FuseGateUp(Pass):
    """Fuse the gate and up projections feeding silu_mul into one linear over concatenated weights."""

    name = "fuse_gate_up"

    def requires(self, ir: IR) -> bool | str:
        return True if ir.count("silu_mul") else "no silu_mul in this step"

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        pairs = gate_up_pairs(ir)
        for pair in pairs:
            fuse_linears(ir, pair)  # keeps member order: split piece 0 is gate, 1 is up
        if pairs:
            ir.refresh()
        return PassResult(bool(pairs), {"pairs": len(pairs)})

    def ensures(self, ir: IR) -> bool | str:
        left = gate_up_pairs(ir)
        return True if not left else f"{len(left)} gate/up pairs left unfused (e.g. %{left[0][0].name})"
