"""examples/profile_tree.py in its CPU smoke mode: tiny shapes, interpreted kernels; the chain and
the tree step under both mask formats are profiled, every layer's attention counted, and the two
formats give the same logits."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_profile_tree_cpu_smoke(tmp_path):
    out = tmp_path / "profile.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPECC_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "profile_tree.py"), "--device", "cpu", "--tiny",
                           "--q", "4", "--context", "8", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["q"] == 4 and set(row["steps"]) == {"chain", "tree words", "tree bytes"}
    for step in row["steps"].values():
        assert step["attention_calls_per_step"] == result["layers"] and step["attention_us_per_step"] > 0
    assert row["steps"]["tree bytes"]["max_abs_logit_diff_vs_words"] < 1e-4
