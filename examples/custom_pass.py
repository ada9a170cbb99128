"""A pass written the way a user would: fuse SiLU(gate) * up into the down projection.

In a SwiGLU MLP, ``silu_mul`` writes a [B, Q, intermediate] activation that the down projection
immediately reads back. A kernel can form the product while loading the GEMM's input instead;
this pass rewrites ``linear(silu_mul(gate, up), W_down)`` into one ``silu_mul_linear`` node, and
the IR's cost metadata shows the bytes saved. Three pieces, each a few lines:

1. the fused op's eager semantics (a plain function; same math, same order => same numbers),
2. its IR rule (output shape + FLOPs; bytes are derived from the inputs and output),
3. the pass (find the pattern, rewrite, ``ir.refresh()``, report a count).

Run it:
    python examples/custom_pass.py
    specc ir MODEL --step ar --after fuse_gate_up,+examples.custom_pass:FuseSiluMulDown --check
(docs/writing-passes.md walks through this file.)
"""

from __future__ import annotations

import torch

from specc.ir import IR, Cost, OpCall, linear_cost, register_op
from specc.models import ops
from specc.passes import Pass, PassContext, PassResult, register_pass


# 1. The fused op. Its body calls the same leaf ops as the unfused graph, so on CPU the
#    rewritten graph is bit-identical; codegen would lower kind "silu_mul_linear" to one kernel.
def silu_mul_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``linear(silu(gate) * up, weight, bias)`` with the gating in the GEMM prologue."""
    return ops.linear(ops.silu_mul(gate, up), weight, bias)


# 2. Its rule: check the inputs fit, give the output shape and the FLOPs. The framework reads
#    each tensor input once (gate, up, the weight) and writes the output once -- the gated
#    activation in between is never stored, which is the saving the cost model will see.
@register_op(silu_mul_linear, "silu_mul_linear")
def _silu_mul_linear_rule(op: OpCall) -> Cost:
    """silu_mul as the prologue of the down projection: the gated activation is never stored."""
    gate, up = op.tensor(0, "gate"), op.tensor(1, "up")
    weight, bias = op.tensor(2, "weight"), op.tensor(3, "bias", optional=True)
    op.check(len(gate.shape) == len(up.shape) and all(op.same(a, b) for a, b in zip(gate.shape, up.shape)),
             f"gate {gate} and up {up} differ")
    cost = linear_cost(op, gate, weight, bias)  # shape/dtype checks and 2*M*K*N
    cost.flops = cost.flops + 5 * gate.numel
    return cost


# 3. The pass.
@register_pass
class FuseSiluMulDown(Pass):
    """Fuse silu_mul into the down projection that consumes it (silu_mul_linear)."""

    name = "fuse_silu_mul_down"
    after = ("fuse_gate_up",)  # fine either way; after it, gate/up come from one fused GEMM

    def requires(self, ir: IR) -> bool | str:
        return True if ir.count("silu_mul") else "no silu_mul in this step"

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        graph = ir.graph
        fused = 0
        for act in ir.calls("silu_mul"):
            users = list(act.users)
            if len(users) != 1 or ir.meta(users[0]).kind != "linear" or users[0].args[0] is not act:
                continue
            down = users[0]
            gate, up = act.args
            weight = down.args[1]
            bias = down.args[2] if len(down.args) > 2 else None
            with graph.inserting_before(down):
                new = graph.call_function(silu_mul_linear, (gate, up, weight, bias))
            new.meta.update({k: v for k, v in down.meta.items() if k.startswith("specc_")})  # keep scope
            down.replace_all_uses_with(new)
            graph.erase_node(down)
            graph.erase_node(act)
            fused += 1
        if fused:
            ir.refresh()  # derive metadata for the new nodes (lint would flag them otherwise)
        return PassResult(fused > 0, {"fused": fused})

    def ensures(self, ir: IR) -> bool | str:
        return True if ir.count("silu_mul_linear") or not ir.count("silu_mul") else "nothing was fused"


def main() -> None:
    """Run the pass through the Python API on a tiny random Qwen3 and show what it changed."""
    from specc.ir import fmt_bytes, trace
    from specc.models import CausalLM, model_config_from_hf
    from specc.passes import PassManager

    cfg = model_config_from_hf(dict(model_type="qwen3", vocab_size=128, hidden_size=64, intermediate_size=256,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    torch.manual_seed(0)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    model.setup_caches(1, 64)

    ir = trace(model, "verify")
    inputs = ir.example_inputs({"B": 1, "Q": 5, "C": 0})
    with torch.no_grad():
        ir.reset_caches()
        expected = model(*inputs)
        before = ir.totals().evaluate({"B": 1, "Q": 5, "C": 0})
        report = PassManager(["fuse_gate_up", FuseSiluMulDown()], check=True).run(ir)
        ir.reset_caches()
        got = ir(*inputs)
    after = ir.totals().evaluate({"B": 1, "Q": 5, "C": 0})
    print(report)
    print(f"silu_mul_linear nodes: {ir.count('silu_mul_linear')}, outputs identical: {torch.equal(expected, got)}")
    print(f"activation bytes per step at B=1, Q=5: {fmt_bytes(before['activation_read'] + before['activation_written'])}"
          f" -> {fmt_bytes(after['activation_read'] + after['activation_written'])}")


if __name__ == "__main__":
    main()
