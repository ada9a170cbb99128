"""examples/bench_tree.py runs in its CPU smoke mode (tiny shapes, one prompt) and writes its JSON."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bench_tree_smoke(tmp_path):
    out = tmp_path / "tree.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)  # the reference bodies on CPU: a smoke run, not a kernel test
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_tree.py"), "--tiny", "--device", "cpu",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert {r["budget"] for r in result["acceptance"]} == {0, 8}
    assert all(r["lossless_vs_chain"] for r in result["acceptance"] + result["e2e"])
    assert [r["q"] for r in result["steps"]["rows"]] == [4, 8]
