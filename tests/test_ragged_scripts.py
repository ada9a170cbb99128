"""examples/bench_ragged_verify.py runs in a small CPU smoke setting and writes its JSON (its real
run is on a GPU: the command in its docstring)."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_bench_ragged_verify_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_ragged_verify", ROOT / "examples" / "bench_ragged_verify.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "ragged.json"
    bench.main(["--device", "cpu", "--shapes", "tiny-qwen3", "--batches", "1,3", "--k", "3", "--k1", "1",
                "--context", "8", "--reps", "1", "--alphas", "0.9,0.1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["dense_s"] > 0 and row["packed_s"] > 0 and row["two_level_s"] > 0
        assert len(row["packed_ks"]) == row["batch"] and all(0 <= k <= 3 for k in row["packed_ks"])
        assert row["packed_tokens"] == sum(k + 1 for k in row["packed_ks"]) <= row["dense_tokens"]
        assert 0 <= row["level2_rows"] <= row["batch"]
