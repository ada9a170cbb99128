"""examples/custom_pass.py: a user's pass, through the Python API and the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specc.cli import main
from specc.ir import evaluate
from specc.passes import PassManager, parse_pipeline

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_pass.py"


@pytest.fixture(scope="module")
def custom():
    sys.path.insert(0, str(ROOT))
    try:
        import examples.custom_pass as module
    finally:
        sys.path.remove(str(ROOT))
    return module


@pytest.mark.parametrize("name", ["verify", "pard_draft", "dflash_draft"])
def test_custom_pass_fires_and_keeps_outputs(steps, apply_checked, custom, name):
    step = steps[name]
    before = step.trace()
    ir, report = apply_checked(step, ["fuse_gate_up", custom.FuseSiluMulDown()])
    assert report.stats("fuse_silu_mul_down") == {"fused": step.num_layers}
    assert ir.count("silu_mul_linear") == step.num_layers and ir.count("silu_mul") == 0
    values = {"B": 1, "Q": 4, "C": 8, "N": 2}
    saved = evaluate(before.totals().bytes - ir.totals().bytes, values)
    assert saved > 0
    node = ir.calls("silu_mul_linear")[0]
    assert ir.meta(node).scope.endswith("mlp.down_proj")


def test_custom_pass_by_name_after_import(custom):
    passes = parse_pipeline("fuse_gate_up,fuse_silu_mul_down")
    assert [p.name for p in passes] == ["fuse_gate_up", "fuse_silu_mul_down"]
    # the class registered by importing the example (the same file may be loaded twice: as a
    # module and by path; the registry keeps one entry for the one definition)
    assert type(passes[1]).__qualname__ == custom.FuseSiluMulDown.__qualname__


def test_custom_pass_through_the_cli(checkpoints, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["ir", checkpoints["target"], "--step", "verify", "--check", "--json",
                 "--after", "fuse_gate_up,+examples.custom_pass:FuseSiluMulDown"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert [p["name"] for p in d["passes"]] == ["fuse_gate_up", "fuse_silu_mul_down"]
    assert d["passes"][1]["stats"] == {"fused": 4}
    assert sum(n["kind"] == "silu_mul_linear" for n in d["nodes"]) == 4
    # and as a file path, from anywhere
    code = main(["ir", checkpoints["target"], "--step", "ar", "--after", f"+{EXAMPLE}:FuseSiluMulDown", "--brief"])
    out, err = capsys.readouterr()
    assert code == 0, err and "silu_mul_linear" in out


def test_example_main_runs(custom, capsys):
    custom.main()  # what `python examples/custom_pass.py` runs
    out = capsys.readouterr().out
    assert "outputs identical: True" in out and "fused=2" in out


def test_custom_pass_in_a_manager_with_constraints(custom):
    pm = PassManager([custom.FuseSiluMulDown(), "fuse_gate_up"])
    assert [p.name for p in pm.passes] == ["fuse_gate_up", "fuse_silu_mul_down"]
