"""examples/bench_sampling.py and examples/bench_sampling_ops.py run in small CPU smoke settings
and write their JSON (their real runs: docs/benchmarks/sampling.md and a GPU)."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(script, *argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *argv], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_bench_sampling_smoke(tmp_path):
    out = tmp_path / "s.json"
    _run("bench_sampling.py", "--prompts", "1", "--new-tokens", "6", "--budgets", "4", "--temperatures", "0,1.0",
         "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert {(r["method"], r["budget"], r["temperature"]) for r in rows} == {
        (m, b, t) for m in ("pard", "dflash") for b in (0, 4) for t in (0.0, 1.0)}
    assert all(1.0 <= r["tau"] <= 16 and r["steps"] >= 1 for r in rows)


def test_bench_sampling_ops_smoke(tmp_path):
    out = tmp_path / "ops.json"
    _run("bench_sampling_ops.py", "--device", "cpu", "--vocab", "512", "--k", "3", "--budget", "4", "--batch", "1,2",
         "--iters", "1", "--out", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    modes = {r["mode"] for r in rows}
    assert "greedy" in modes and any("mixed" in m for m in modes) and len(modes) == 5  # greedy, 3 settings, mixed
    assert len(rows) == 2 * len(modes) and {r["batch"] for r in rows} == {1, 2}
    assert all(r["chain_ms"] > 0 and r["tree_ms"] > 0 for r in rows)
