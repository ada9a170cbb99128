"""fuse_gate_up fires once per MLP and leaves every step's outputs unchanged."""

from __future__ import annotations

import pytest

from specc.passes import PassManager


@pytest.mark.parametrize("name", ["verify", "verify_capture", "pard_draft", "dflash_draft"])
def test_fuse_gate_up_fires_and_keeps_outputs(steps, apply_checked, name):
    step = steps[name]
    before = step.trace()
    ir, report = apply_checked(step, ["fuse_gate_up"])
    assert report.stats("fuse_gate_up") == {"pairs": step.num_layers}
    assert ir.count("linear") == before.count("linear") - step.num_layers
    assert ir.totals().weight_bytes == before.totals().weight_bytes
    for act in ir.calls("silu_mul"):  # gate is piece 0, up piece 1 of the same split
        gate, up = act.args
        assert gate.args[0] is up.args[0] and (gate.args[1], up.args[1]) == (0, 1)
        assert ir.meta(gate.args[0]).kind == "split"
    assert not PassManager(["fuse_gate_up"]).run(ir).changed


def test_gate_up_then_qkv_in_one_pipeline(steps, apply_checked):
    ir, report = apply_checked(steps["verify"], "fuse_gate_up,fuse_qkv")
    n = steps["verify"].num_layers
    assert report.stats("fuse_qkv")["groups"] == n and report.stats("fuse_gate_up")["pairs"] == n
    assert ir.count("linear") == 4 * n + 1  # qkv, o_proj, gate_up, down per layer; lm_head
