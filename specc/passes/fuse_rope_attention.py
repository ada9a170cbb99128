"""fuse_rope_attention: per-head q/k norm + rotary embedding + KV-cache write + attention, as one op.

In a decoder layer the query and key of each attention go through (Qwen3) a per-head RMSNorm and
the rotary embedding, the rotated keys and the values are written into the KV cache, and then
attention runs: a dozen small elementwise kernels around one attention kernel, at every layer of
every step. This pass rewrites

    attention(rope([rms_norm](q), cos, sin), rope([rms_norm](k), cos, sin), v, cache_k, cache_v, cache_len, ...)
    with (cos, sin) = rope_tables(positions, inv_freq, _)

into ``rope_attention(q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, q_norm, k_norm,
eps, mask_kind, scale)``, which codegen lowers to two kernels: ``rope_and_cache`` (norm, rotation
with cos/sin computed in-kernel, cache write) and the attention kernel. The op's eager body calls
the same leaf ops in the same order, so on CPU the rewritten step is bit-identical. Two patterns
are fused: the target's (q and k rotated with the same cos/sin, as many keys as queries) and the
DFlash drafter's (keys over [context; block], queries over the block only, rotated with the last
Q rows of the keys' cos/sin: ``cos[:, -Q:]``). The kernel takes q's positions as the last Q of
the keys', so both lower to the same two kernels; in a DFlash layer that replaces about a dozen
launches (two per-head norms, two rotations, the rotate-half cats, the K/V scatters).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from specc.ir import IR, SCOPE_KEY, Cost, OpCall, register_op
from specc.ir.rules import attention_cost
from specc.models.fused_ops import rope_attention  # the eager body
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass


@register_op(rope_attention, "rope_attention", impure=True, cache_args=(5, 6))
def _rope_attention_rule(op: OpCall) -> Cost:
    """Attention's costs plus the norm/rotation arithmetic; q and k are read once, never rewritten."""
    q, k = op.tensor(0, "q"), op.tensor(1, "k")
    cost = attention_cost(op, q, k, op.tensor(2, "v"), op.tensor(5, "cache_k"), op.tensor(6, "cache_v"),
                          op.tensor(7, "cache_len"), op.arg(11, "mask_kind"), op.arg(12, "scale"), cache_args=(5, 6),
                          tree_mask=op.tensor(13, "tree_mask", optional=True), tree_arg=13)
    cost.flops = cost.flops + 7 * (q.numel + k.numel)
    cost.attrs["qk_norm"] = op.arg(8, "q_norm_weight") is not None
    return cost


def _unnormed(ir: IR, node: torch.fx.Node):
    """(input, norm weight, eps) of an optional per-head rms_norm feeding rope."""
    if node.op == "call_function" and ir.meta(node).kind == "rms_norm" and len(node.users) == 1:
        return node.args[0], node.args[1], node.args[2]
    return node, None, None


def _trailing_rows(ir: IR, table: torch.fx.Node, source: torch.fx.Node, rows) -> bool:
    """Is ``table`` ``source[:, -rows:]`` (the last ``rows`` positions of a [B, T, D] cos/sin)?"""
    if table.op != "call_function" or ir.meta(table).kind != "slice" or table.args[0] is not source:
        return False
    index = table.args[1] if len(table.args) > 1 else None
    if not (isinstance(index, tuple) and len(index) == 2 and all(isinstance(i, slice) for i in index)):
        return False
    whole, tail = index
    if (whole.start, whole.stop, whole.step) != (None, None, None) or tail.stop is not None or tail.step is not None:
        return False
    start = ir.meta(tail.start).out if isinstance(tail.start, torch.fx.Node) else tail.start
    try:
        return bool(sympy.simplify(sympy.sympify(start) + rows) == 0)
    except (TypeError, sympy.SympifyError):
        return False


def _match(ir: IR, attn: torch.fx.Node):
    q_rot, k_rot = attn.args[0], attn.args[1]
    for rot in (q_rot, k_rot):
        if rot.op != "call_function" or ir.meta(rot).kind != "rope" or len(rot.users) != 1:
            return None
    same_tables = q_rot.args[1] is k_rot.args[1] and q_rot.args[2] is k_rot.args[2]
    if not same_tables:  # DFlash: q rotated with the last Q rows of k's tables
        rows = ir.meta(q_rot).shape[1]
        if not all(_trailing_rows(ir, q_t, k_t, rows) for q_t, k_t in zip(q_rot.args[1:3], k_rot.args[1:3])):
            return None
    cos = k_rot.args[1]
    tables = cos.args[0] if cos.op == "call_function" and cos.args else None
    if tables is None or tables.op != "call_function" or ir.meta(tables).kind != "rope_tables":
        return None
    q, qn, eps_q = _unnormed(ir, q_rot.args[0])
    k, kn, eps_k = _unnormed(ir, k_rot.args[0])
    if (qn is None) != (kn is None) or (qn is not None and eps_q != eps_k):
        return None
    return q, k, qn, kn, eps_q, tables.args[0], tables.args[1]


@register_pass
class FuseRopeAttention(Pass):
    """Fuse q/k norm + rotary embedding + KV write into attention (rope_attention)."""

    name = "fuse_rope_attention"
    # the sharding pass rewrites the per-head views between the projections and the attention
    after = ("shard_tensor_parallel",)

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        graph = ir.graph
        fused = 0
        for attn in list(ir.calls("attention")):
            m = _match(ir, attn)
            if m is None:
                continue
            q, k, qn, kn, eps, positions, inv_freq = m
            _, _, v, cache_k, cache_v, cache_len, mask_kind, scale = attn.args[:8]
            tree = attn.args[8:9]  # the tree verify step's mask (chain steps have none)
            with graph.inserting_before(attn):
                new = graph.create_node(
                    "call_function", rope_attention,
                    (q, k, v, positions, inv_freq, cache_k, cache_v, cache_len, qn, kn,
                     1e-6 if eps is None else eps, mask_kind, scale, *tree), name=f"rope_{attn.name}")
            new.meta[SCOPE_KEY] = attn.meta.get(SCOPE_KEY, "")
            attn.replace_all_uses_with(new)
            graph.erase_node(attn)
            fused += 1
        if fused:
            ir.remove_dead()
            ir.refresh()
        return PassResult(fused > 0, {"fused": fused})
