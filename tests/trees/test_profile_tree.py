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


def test_profile_tree_loop_cpu_check(tmp_path):
    """--loop, the GPU run's check at tiny shapes on the CPU: per budget the loop's verify part,
    the tree step alone with the inputs the loop gave it (re-run: the same logits), the chain at
    the tree's row count and one row fewer, host-op lists of each call, and the linears' weight
    passes; the loop calls the tree step with one input signature at every step (one graph)."""
    out = tmp_path / "loop.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPECC_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # the reference bodies: a check of the script, not of kernels
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "profile_tree.py"), "--loop", "--tiny", "--device",
                           "cpu", "--budgets", "4,16", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [b["budget"] for b in result["budgets"]] == [4, 16]
    for entry in result["budgets"]:
        rows = entry["budget"] + 1
        assert entry["rows"] == rows and entry["context"] > 0
        loop = entry["loop"]
        (signature, calls), = loop["signatures"].items()  # one signature across every step
        assert signature == f"(1, {rows}) int64, (1, {rows}) int64, (1,) int64, (1, {rows}, {rows}) bool"
        assert calls >= 3 * 2  # three passes of at least two steps each
        assert set(loop["part_ms_per_step"]) == {"draft", "plan", "verify", "accept", "commit"}
        assert loop["verify_ms_per_step"] > 0 and loop["profile"]["calls"] >= 1 and loop["profile"]["kernels"]
        # one device -> host copy per step (the CPU's KV compaction reference reads its counts: CPU only)
        assert loop["host_reads_by_name"]["tolist"] == loop["audited_steps"] >= 1
        assert loop["audit_per_step"]["blocking_uploads"] == 0 and loop["glue_ops_by_name"]
        assert entry["alone"]["rerun_max_abs_diff"] == 0.0 and entry["alone"]["ms"] > 0
        assert entry["alone"]["profile"]["calls"] == 3
        assert set(entry["chain"]) == {str(rows), str(rows - 1)}
        for chain in entry["chain"].values():
            assert chain["ms"] > 0 and chain["profile"]["calls"] == 3 and chain["profile"]["us_per_call"] > 0
        for n_rows, lin in entry["linears"].items():
            assert lin["rows"] == int(n_rows) and lin["weight_read_factor"] == 1.0
            assert all(s["weight_passes"] == 1 and s["us"] > 0 for s in lin["shapes"])
        assert entry["diff_us"]["loop_minus_alone"] and entry["diff_us"]["alone_minus_chain_same_rows"]


def test_qwen3_8b_tree_rows_and_weight_passes():
    """The row counts the 8B tree runs verify: N + 1 rows for the default budgets N = 15 / 31 / 63
    (and the chain's 16) read every Qwen3-8B linear weight once with the default configs; one row
    past 64 takes two 64-row tiles (two passes: on the H200 still faster than one 128-row tile,
    which is why the budgets keep N + 1 on the tile edges)."""
    from specc.codegen.kernels import linear as L
    from specc.search.tree_cost import BUDGETS

    shapes = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)]
    for rows in [16] + [n + 1 for n in BUDGETS if n + 1 <= 64]:
        assert [L.weight_passes(rows, n, k) for n, k in shapes] == [1] * len(shapes), rows
    assert [L.weight_passes(65, n, k) for n, k in shapes] == [2] * len(shapes)
    for n in BUDGETS:  # every default budget's rows are a power of two
        assert (n + 1) & n == 0, n
    for n, k in shapes[:4]:  # the 32 bucket: the 16-row tiles timed widened to one 32-row tile (h200-run6.md)
        assert L.get_config(17, n, k).block_m == 32 and L.get_config(17, n, k).kind == "dot"
    for n, k in (shapes[0], shapes[2]):  # q/k/v and gate_up: the 16 bucket's winners widened
        assert L.get_config(17, n, k) == L.get_config(16, n, k).replace(block_m=32)
    for n, k in (shapes[1], shapes[3]):  # o and down: the tiles widened in run 6, not run 31's 16-row ones
        assert L.get_config(17, n, k).split_k == 2 and not L.get_config(17, n, k).tma
