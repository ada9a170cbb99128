"""fuse_norm_linear fires where a norm feeds only linears, saves activation bytes, keeps outputs."""

from __future__ import annotations

import pytest

from specc.ir import evaluate
from specc.passes import PassManager


@pytest.mark.parametrize("name", ["verify", "verify_capture", "pard_draft", "dflash_draft"])
def test_fuse_norm_linear_fires_and_keeps_outputs(steps, apply_checked, name):
    step = steps[name]
    before = step.trace()
    ir, report = apply_checked(step, ["fuse_qkv", "fuse_gate_up", "fuse_norm_linear"])
    n = step.num_layers
    stats = report.stats("fuse_norm_linear")
    # per layer: input norm -> qkv, post-attention norm -> gate_up; the final norm feeds the LM
    # head only in plain target steps (DFlash slices it first; a capturing target also returns it
    # when it captures the last layer). DFlash's input norm also feeds the context cat: not fused.
    if name == "dflash_draft":
        expected = n
    elif name == "verify_capture":
        expected = 2 * n + (0 if (n - 1) in step.model.capture_layers else 1)
    else:
        expected = 2 * n + 1
    assert stats["norms"] == expected and stats["linears"] == expected
    assert ir.count("norm_linear") == expected
    values = {"B": 1, "Q": 4, "C": 16, "N": 2}
    saved = evaluate(before.totals().bytes - ir.totals().bytes, values)
    assert saved > 0  # the normed activations are no longer written and read back
    assert ir.totals().weight_bytes == before.totals().weight_bytes


def test_norm_linear_runs_after_the_sibling_fusions(steps):
    ir = steps["verify"].trace()
    report = PassManager(["fuse_norm_linear", "fuse_qkv", "fuse_gate_up"]).run(ir)
    assert report.order == ["fuse_qkv", "fuse_gate_up", "fuse_norm_linear"] and report.reordered
    # one prologue per fused GEMM instead of one per projection
    assert report.stats("fuse_norm_linear")["linears"] == 2 * steps["verify"].num_layers + 1


def test_without_sibling_fusion_each_linear_gets_the_prologue(steps, apply_checked):
    ir, report = apply_checked(steps["pard_draft"], ["fuse_norm_linear"])
    n = steps["pard_draft"].num_layers
    assert report.stats("fuse_norm_linear") == {"norms": 2 * n + 1, "linears": 5 * n + 1}
