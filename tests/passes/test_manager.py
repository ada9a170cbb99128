"""PassManager (ordering, fixed point, timing, dumps, checks), registry, plugins, pipelines."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from specc.cli import main
from specc.ir import trace
from specc.ir.testing import random_model
from specc.models import ops
from specc.passes import (
    Pass, PassError, PassManager, PassResult, PipelineError, available_passes, get_pass, load_plugins, parse_pipeline,
    register_pass,
)


@pytest.fixture
def ir():
    return trace(random_model("qwen3"), "verify")


class Counter(Pass):
    """Changes the IR 'times' times (a counter), to exercise fixed points."""

    name = "test_counter"

    def __init__(self, times: int = 2):
        self.left = times

    def run(self, ir, ctx):
        if self.left:
            self.left -= 1
            return PassResult(True, {"ticks": 1})
        return PassResult(False, {"ticks": 0})


def test_builtin_passes_are_registered():
    passes = available_passes()
    for name in ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce"):
        assert name in passes and passes[name].origin == "builtin" and passes[name].doc
    assert get_pass("fuse_norm_linear").after == ("fuse_qkv", "fuse_gate_up")


def test_order_respects_constraints_and_keeps_given_order_otherwise(ir):
    pm = PassManager(["dce", "fuse_norm_linear", "fuse_gate_up", "fuse_qkv"])
    assert [p.name for p in pm.passes] == ["dce", "fuse_gate_up", "fuse_qkv", "fuse_norm_linear"]
    pm = PassManager().add("fuse_qkv").add("dce", before=["fuse_qkv"])
    assert [p.name for p in pm.passes] == ["dce", "fuse_qkv"]
    with pytest.raises(PipelineError, match="cycle"):
        PassManager().add("fuse_qkv", after=["dce"]).add("dce", after=["fuse_qkv"]).passes


def test_fixed_point_repeats_until_nothing_changes(ir):
    report = PassManager([Counter(2)], fixed_point=True).run(ir)
    assert report.iterations == 3 and report.converged
    assert [r.changed for r in report.records] == [True, True, False]
    assert report.stats("test_counter") == {"ticks": 2}
    report = PassManager([Counter(50)], fixed_point=True, max_iterations=3).run(ir)
    assert not report.converged and "no fixed point" in str(report)
    report = PassManager([Counter(2)]).run(ir)  # without fixed point: one round
    assert report.iterations == 1 and len(report.records) == 1


def test_timing_stats_and_report_text(ir):
    report = PassManager("fuse_qkv,fuse_gate_up").run(ir)
    assert all(r.seconds >= 0 for r in report.records)
    text = str(report)
    assert "fuse_qkv" in text and "groups=2" in text and " ms " in text


def test_requires_skips_with_reason(ir):
    PassManager(["fuse_gate_up"]).run(ir)

    class NeedsMLP(Pass):
        name = "test_needs_mlp"

        def requires(self, ir):
            return True if ir.count("silu_mul_linear") else "needs silu_mul_linear nodes"

        def run(self, ir, ctx):  # pragma: no cover - never runs
            raise AssertionError

    report = PassManager([NeedsMLP()]).run(ir)
    assert report.records[0].skipped == "needs silu_mul_linear nodes"


def test_dump_ir_writes_text_after_each_pass(ir, tmp_path):
    PassManager("fuse_qkv,dce", dump_ir=tmp_path / "d").run(ir)
    files = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert files == ["000-input.txt", "001-fuse_qkv.txt", "002-dce.txt"]
    assert "q_proj" in (tmp_path / "d" / "000-input.txt").read_text()
    assert "qkv_proj" in (tmp_path / "d" / "001-fuse_qkv.txt").read_text()


def test_check_catches_a_pass_that_breaks_invariants(ir):
    class LeavesDeadNode(Pass):
        """Adds an unused node."""

        name = "test_leaves_dead"

        def run(self, ir, ctx):
            x = ir.node("norm")
            with ir.graph.inserting_after(x):
                ir.graph.call_function(ops.silu_mul, (x, x))
            ir.refresh()
            return PassResult(True)

    class ForgetsRefresh(Pass):
        name = "test_forgets_refresh"

        def run(self, ir, ctx):
            x = ir.node("norm")
            with ir.graph.inserting_after(x):
                y = ir.graph.call_function(ops.silu_mul, (x, x))
            ir.node("lm_head").replace_input_with(x, y)
            return PassResult(True)

    with pytest.raises(PassError, match="(?s)after pass test_leaves_dead.*%silu_mul \\(silu_mul\\): unused") as info:
        PassManager([LeavesDeadNode()]).run(trace(random_model("qwen3"), "ar"))
    assert info.value.pass_name == "test_leaves_dead"
    with pytest.raises(PassError, match="no specc metadata"):
        PassManager([ForgetsRefresh()]).run(trace(random_model("qwen3"), "ar"))
    # with checking off the manager does not look
    PassManager([LeavesDeadNode()], check=False).run(trace(random_model("qwen3"), "ar"))


def test_ensures_and_exceptions_name_the_pass(ir):
    class Liar(Pass):
        name = "test_liar"

        def run(self, ir, ctx):
            return PassResult(False)

        def ensures(self, ir):
            return "the moon is not made of cheese"

    class Crashes(Pass):
        name = "test_crashes"

        def run(self, ir, ctx):
            raise KeyError("boom")

    with pytest.raises(PassError, match="test_liar did not establish its postcondition: the moon"):
        PassManager([Liar()]).run(ir)
    with pytest.raises(PassError, match="pass test_crashes failed: KeyError"):
        PassManager([Crashes()]).run(ir)


def test_register_pass_rejects_name_clash():
    class Clash(Pass):
        name = "fuse_qkv"

    with pytest.raises(ValueError, match="already registered"):
        register_pass(Clash)
    with pytest.raises(TypeError):
        register_pass(object)


def test_pipeline_strings(tmp_path, monkeypatch):
    mod = tmp_path / "my_user_passes.py"
    mod.write_text(textwrap.dedent('''
        from specc.passes import Pass, PassResult

        class Noop(Pass):
            """Does nothing, politely."""
            def run(self, ir, ctx):
                return PassResult(False, {"nothing": 1})
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    passes = parse_pipeline("fuse_qkv, +my_user_passes:Noop ,+%s:Noop" % mod)
    assert [p.name for p in passes] == ["fuse_qkv", "noop", "noop"]
    assert available_passes()["noop"].origin == "module my_user_passes"
    with pytest.raises(PipelineError, match="did you mean fuse_gate_up"):
        parse_pipeline("fuse_gate_upp")
    with pytest.raises(PipelineError, match="no attribute 'Nope'"):
        parse_pipeline("+my_user_passes:Nope")
    with pytest.raises(PipelineError, match="write \\+module:Class"):
        parse_pipeline("+my_user_passes")


def test_entry_point_plugins_are_discovered(tmp_path, monkeypatch):
    (tmp_path / "specc_test_plugin.py").write_text(textwrap.dedent('''
        from specc.passes import Pass, PassResult

        class PluginPass(Pass):
            """A pass shipped by an installed plugin."""
            name = "plugin_pass"
            def run(self, ir, ctx):
                return PassResult(False)
    '''))
    dist = tmp_path / "specc_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specc-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[specc.passes]\nplugin_pass = specc_test_plugin:PluginPass\n"
                                           "broken = specc_test_plugin:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    errors = load_plugins(refresh=True)
    try:
        assert "plugin_pass" in available_passes()
        assert available_passes()["plugin_pass"].origin == "plugin specc_test_plugin:PluginPass"
        assert any("broken" in e for e in errors)
        assert parse_pipeline("plugin_pass")[0].name == "plugin_pass"
    finally:
        monkeypatch.undo()
        sys.modules.pop("specc_test_plugin", None)
        load_plugins(refresh=True)


def test_specc_passes_cli(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name in ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce"):
        assert name in out
    assert "after fuse_qkv, fuse_gate_up" in out
    assert main(["passes", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)["passes"]}
    assert listed["fuse_qkv"]["doc"].startswith("Fuse q/k/v")
