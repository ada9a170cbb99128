"""fuse_qkv: the q/k/v projections that read the same input become one linear + split.

Matches linears that share their input and whose outputs flow (through views, q/k norms, rope)
into an attention's q, k or v (dense or ragged attention). In Llama/Qwen3 layers that is q_proj, k_proj, v_proj; in a DFlash
drafter layer it is k_proj and v_proj (they read [context; noise], q_proj reads only the noise).
One GEMM instead of three reads the same weight bytes but the input once, with one launch.
"""

from __future__ import annotations

import torch.fx

from specc.ir import IR
from specc.passes._linear_fusion import fusable, fuse_linears, linear_parts
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass

_THROUGH = {"view", "rms_norm", "rope", "slice", "getitem", "split"}
_ATTENTION = ("attention", "ragged_attention")  # kinds whose arguments 0..2 are q, k, v


def feeds_attention(ir: IR, node: torch.fx.Node) -> bool:
    """Does ``node``'s value reach an attention's q/k/v argument through shape/norm/rope ops?"""
    frontier, seen = [node], set()
    while frontier:
        n = frontier.pop()
        for user in n.users:
            kind = ir.meta(user).kind
            if kind in _ATTENTION and any(i < len(user.args) and user.args[i] is n for i in range(3)):
                return True
            if kind in _THROUGH and user not in seen:
                seen.add(user)
                frontier.append(user)
    return False


def qkv_groups(ir: IR) -> list[list[torch.fx.Node]]:
    by_input: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in ir.calls("linear"):
        x = linear_parts(node)[0]
        if isinstance(x, torch.fx.Node) and feeds_attention(ir, node):
            by_input.setdefault(x, []).append(node)
    return [g for g in by_input.values() if fusable(ir, g)]


@register_pass
class FuseQKV(Pass):
    """Fuse q/k/v projections reading the same input into one linear over concatenated weights."""

    name = "fuse_qkv"

    def requires(self, ir: IR) -> bool | str:
        return True if any(ir.count(kind) for kind in _ATTENTION) else "no attention in this step"

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        groups = qkv_groups(ir)
        for group in groups:
            fuse_linears(ir, group)
        if groups:
            ir.refresh()
        return PassResult(bool(groups), {"groups": len(groups), "linears": sum(len(g) for g in groups)})

    def ensures(self, ir: IR) -> bool | str:
        left = qkv_groups(ir)
        return True if not left else f"{len(left)} q/k/v groups left unfused (e.g. %{left[0][0].name})"
