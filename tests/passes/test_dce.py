"""dce removes dead nodes and the weights fusions replaced; outputs unchanged."""

from __future__ import annotations

from specc.ir.testing import assert_same_outputs, run_step
from specc.models import ops
from specc.passes import PassManager


def test_dce_removes_dead_nodes(steps):
    step = steps["verify"]
    expected = step.expected()
    ir = step.trace()
    graph = ir.graph
    x = ir.node("layers_0_add")
    with graph.inserting_after(x):
        graph.call_function(ops.silu_mul, (x, x))
    ir.refresh()
    report = PassManager(["dce"], check=False).run(ir)
    assert report.stats("dce") == {"nodes": 1, "attributes": 0}
    ir.lint()
    assert_same_outputs(expected, run_step(ir, step.inputs))


def test_dce_drops_weights_replaced_by_fused_copies(steps, apply_checked):
    step = steps["verify"]
    ir, report = apply_checked(step, ["fuse_qkv", "fuse_gate_up", "dce"])
    n = step.num_layers
    assert report.stats("dce") == {"nodes": 0, "attributes": 5 * n}
    names = {name for name, _ in ir.gm.named_parameters()}
    assert "layers.0.self_attn.qkv_proj.weight" in names and "layers.0.self_attn.q_proj.weight" not in names
    assert not any(name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")) for name in names)
    assert hasattr(step.model.layers[0].self_attn, "q_proj")  # the model keeps its own weights
    assert not PassManager(["dce"]).run(ir).changed


def test_dce_keeps_cache_writes(steps):
    ir = steps["dflash_draft"].trace()
    report = PassManager(["dce"]).run(ir)
    assert not report.changed and ir.count("attention") == steps["dflash_draft"].num_layers
