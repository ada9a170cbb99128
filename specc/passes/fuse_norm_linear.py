"""fuse_norm_linear: an rms_norm whose output feeds only linears becomes their prologue.

(Shape queries of the norm's output, ``x.shape[0]`` in the attention code, do not count as uses:
they are redirected to the norm's input, which has the same shape.)

``linear(rms_norm(x, g, eps), W, b)`` -> ``norm_linear(x, g, eps, W, b)`` (specc.ir.fused): a
kernel normalises the row while loading it for the GEMM, so the normed activation is never
written to memory and read back. When the norm feeds several linears each gets the prologue
(recomputing a norm is cheap next to a GEMM); run fuse_qkv / fuse_gate_up first so there is
usually just one. Norms with other users (Qwen3's q/k norms feed rope, a DFlash target's last
norm is also captured) are left alone.
"""

from __future__ import annotations

import torch.fx

from specc.ir import GROUP_KEY, IR, SCOPE_KEY
from specc.ir.fused import norm_linear
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass


def _is_linear_input(ir: IR, user: torch.fx.Node, norm: torch.fx.Node) -> bool:
    return ir.meta(user).kind == "linear" and user.args[0] is norm and norm not in user.args[1:]


def candidates(ir: IR) -> list[torch.fx.Node]:
    """rms_norm nodes whose users are linears (as their input) and shape queries only."""
    out = []
    for norm in ir.calls("rms_norm"):
        users = list(norm.users)
        linears = [u for u in users if _is_linear_input(ir, u, norm)]
        if linears and all(u in linears or ir.meta(u).kind == "shape" for u in users):
            out.append(norm)
    return out


@register_pass
class FuseNormLinear(Pass):
    """Make an rms_norm that feeds only linears the prologue of fused norm_linear ops."""

    name = "fuse_norm_linear"
    after = ("fuse_qkv", "fuse_gate_up")

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        graph = ir.graph
        norms = candidates(ir)
        linears = 0
        for norm in norms:
            x, g, eps = norm.args[0], norm.args[1], norm.args[2]
            for user in list(norm.users):
                if ir.meta(user).kind == "shape":  # rms_norm keeps the shape: ask the input instead
                    user.replace_input_with(norm, x)
            for lin in list(norm.users):
                w = lin.args[1]
                b = lin.args[2] if len(lin.args) > 2 else None
                with graph.inserting_before(lin):
                    fused = graph.create_node("call_function", norm_linear, (x, g, eps, w, b), name=f"norm_{lin.name}")
                fused.meta[SCOPE_KEY] = lin.meta.get(SCOPE_KEY, "")
                if lin.meta.get(GROUP_KEY):
                    fused.meta[GROUP_KEY] = lin.meta[GROUP_KEY]
                lin.replace_all_uses_with(fused)
                graph.erase_node(lin)
                linears += 1
            graph.erase_node(norm)
        if norms:
            ir.refresh()
        return PassResult(bool(norms), {"norms": len(norms), "linears": linears})

    def ensures(self, ir: IR) -> bool | str:
        left = candidates(ir)
        return True if not left else f"rms_norm %{left[0].name} still feeds only linears"
