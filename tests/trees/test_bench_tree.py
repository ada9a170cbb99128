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


def test_bench_tree_e2e_8b_tiny_check(tmp_path):
    """The H200 --e2e-8b path end to end at tiny shapes on the CPU: AR, chain and a tree, replayed
    acceptance (the default: DFlash's published tau + specc-tiny's measured rank split)."""
    from specc.bench.acceptance import parse_tree_acceptance

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_tree.py"), "--e2e-8b", "--tiny-check",
                           "--budgets", "16", "--new-tokens", "10", "--out-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "tree-e2e-8b.json").read_text())
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"ar", "chain", "tree 16"} and result["num_draft"] == 15
    assert "tiny-dflash-ranks.json" in result["acceptance"]["spec"] and "assumed" in result["acceptance"]["tree_source"]
    model = parse_tree_acceptance(result["acceptance"]["spec"], 15)
    assert rows["tree 16"]["predicted"]["tokens_per_step"] == model.expected_tokens(16, 15)
    assert rows["ar"]["tokens_per_step"] == 1.0 and rows["tree 16"]["tokens_per_step"] >= 1.0
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["speedup_vs_chain"]["predicted"] > 0 and r["speedup_vs_ar"]["measured"] > 0
