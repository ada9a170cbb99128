"""bisect finds the first pass application that breaks a check (a deliberately broken pass)."""

from __future__ import annotations

import operator

import torch

from specc.ir import trace
from specc.ir.testing import random_model, run_step
from specc.passes import Pass, PassResult, bisect, outputs_match


class SwapGateUp(Pass):
    """Broken on purpose: silu_mul(gate, up) -> silu_mul(up, gate). Lints fine, wrong numbers."""

    name = "test_swap_gate_up"

    def run(self, ir, ctx):
        n = 0
        for act in ir.calls("silu_mul"):
            act.args = (act.args[1], act.args[0])
            n += 1
        return PassResult(n > 0, {"swapped": n})


class BreaksShapes(Pass):
    """Broken on purpose: slices the first residual add's output (the graph no longer lints)."""

    name = "test_breaks_shapes"

    def run(self, ir, ctx):
        add = ir.calls("add")[0]
        with ir.graph.inserting_after(add):
            sliced = ir.graph.call_function(operator.getitem, (add, (Ellipsis, slice(0, 8))))
        add.replace_all_uses_with(sliced, delete_user_cb=lambda u: u is not sliced)
        ir.refresh()
        return PassResult(True)


def _setup():
    model = random_model("llama")
    factory = lambda: trace(model, "verify")  # noqa: E731
    ir = factory()
    inputs = ir.example_inputs({"Q": 5, "C": 0})
    return factory, inputs, run_step(model, inputs)


def test_bisect_finds_the_broken_pass():
    factory, inputs, expected = _setup()
    pipeline = ["fuse_qkv", "fuse_gate_up", SwapGateUp(), "fuse_norm_linear", "dce"]
    report = bisect(factory, pipeline, outputs_match(inputs, expected))
    assert report.found and report.first_bad == 3 and report.pass_name == "test_swap_gate_up"
    assert "max |diff|" in report.message
    text = str(report)
    assert "first bad pass application #3 test_swap_gate_up" in text
    assert report.checks_run <= 5  # initial, full pipeline, log2(5) prefixes
    assert "silu_mul" in report.diff


def test_bisect_reports_a_pass_that_breaks_the_ir():
    factory, inputs, expected = _setup()
    report = bisect(factory, ["fuse_qkv", BreaksShapes(), "fuse_gate_up"], outputs_match(inputs, expected))
    assert report.pass_name == "test_breaks_shapes"
    assert "broke the IR" in report.message


def test_bisect_with_a_clean_pipeline_and_a_failing_start():
    factory, inputs, expected = _setup()
    report = bisect(factory, "fuse_qkv,fuse_gate_up,fuse_norm_linear,dce", outputs_match(inputs, expected))
    assert not report.found and report.first_bad is None and "passes after the whole pipeline" in str(report)
    report = bisect(factory, "fuse_qkv", lambda ir: (False, "always wrong"))
    assert report.first_bad == 0 and "before any pass" in str(report)


def test_bisect_accepts_bool_checks():
    factory, inputs, expected = _setup()

    def check(ir):
        ir.reset_caches()
        with torch.no_grad():
            return torch.equal(ir(*inputs), expected)

    report = bisect(factory, ["fuse_gate_up", "fuse_qkv", SwapGateUp()], check)
    assert report.first_bad == 3 and report.message == "check failed"
