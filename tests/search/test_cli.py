"""`specc cost`, `specc search` and examples/bench_cost_model.py from the command line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specc.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_cost_json_with_nodes_and_sweep(tiny, capsys):
    argv = ["cost", tiny["target"], "--drafter", tiny["dflash"], "--deployment", "h200-bs1", "--tau", "2.5",
            "--json", "--nodes", "--sweep"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "dflash" and out["num_draft"] == 3
    assert out["expected_tokens_per_step"] == pytest.approx(2.5, abs=1e-6)
    assert out["verify"]["nodes"] and "bytes_formula" in out["verify"]["nodes"][0]
    assert out["ar"]["formula"] and out["gap_report"]["rows"]
    assert [r["num_draft"] for r in out["sweep"]] == [1, 3]


def test_cost_text_and_errors(tiny, capsys):
    assert main(["cost", tiny["target"], "--deployment", "h100-bs8", "--passes", ""]) == 0
    text = capsys.readouterr().out
    assert "AR step" in text and "gap report" in text and "target linear weights" in text
    assert main(["cost", tiny["target"], "--deployment", "h100-bs8", "--passes", "no_such_pass"]) == 2
    assert "unknown pass" in capsys.readouterr().err
    assert main(["cost", tiny["target"], "--method", "pard"]) == 2


def test_search_cli_json(tiny, tmp_path, capsys):
    argv = ["search", tiny["target"], "--drafter", tiny["pard"], "--deployment", "h200-bs1", "--rounds", "1",
            "--max-verify", "1", "--verify-tokens", "8", "--memory", str(tmp_path / "mem.json"), "--json", "--quiet",
            "--start-passes", "fuse_qkv,dce"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "pard" and out["deployment"] == "h200-bs1" and out["best"]["verified"]
    assert out["rounds"][0]["gap_report"]["rows"] and out["choice"]["num_draft"] >= 1
    assert (tmp_path / "mem.json").is_file()
    assert main(["search", tiny["target"], "--proposer", "llm"]) == 2
    assert "--endpoint" in capsys.readouterr().err


def test_bench_cost_model_cpu_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_cost_model", ROOT / "examples" / "bench_cost_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "cm.json"
    result = bench.main(["--device", "cpu", "--tiny", "--calibrate", "--quick", "--batches", "1,2", "--qs", "1,4",
                         "--reps", "3", "--out", str(out)])
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 4 and data["deployment"]["calibrated"]
    for row in data["rows"]:
        assert row["predicted_s"] > 0 and row["measured_s"] > 0 and row["launches"] > 0
    assert result["summary"]["median_abs_error"] >= 0
    assert Path(data["calibration_file"]).is_file()


def test_bench_cost_model_config_nodes_and_the_floor_sweep(tmp_path, capsys):
    """--config takes a zoo checkpoint's shapes; --nodes writes each node's priced terms, which
    examples/fit_kernel_floor.py re-prices (floor 0 reproduces the prediction)."""
    spec = importlib.util.spec_from_file_location("bench_cost_model", ROOT / "examples" / "bench_cost_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "cm.json"
    bench.main(["--device", "cpu", "--config", "specc-tiny", "--batches", "1", "--qs", "1", "--context", "16",
                "--reps", "1", "--nodes", "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert row["nodes"] and all(len(n) == 5 for n in row["nodes"])
    spec = importlib.util.spec_from_file_location("fit_kernel_floor", ROOT / "examples" / "fit_kernel_floor.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    (zero,) = fit.errors([out], 0.0)
    assert zero["predicted_s"] == pytest.approx(row["predicted_s"], rel=1e-9)
    (floored,) = fit.errors([out], 1.0)  # a 1 s floor: every kernel at it
    assert floored["predicted_s"] == pytest.approx(sum(n[1] * 1.0 + n[4] for n in row["nodes"]), rel=1e-9)
