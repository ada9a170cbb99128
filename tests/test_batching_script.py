"""examples/bench_batching.py (its GPU run measures Qwen3-8B shapes on the H200): the CPU smoke
path writes a JSON line per (pair, system, B) with the cost model's prediction beside it, and says
which mechanisms the runtime cannot run yet instead of timing something else."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def test_bench_batching_cpu_smoke(tmp_path, monkeypatch):
    from examples import bench_batching

    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["bench_batching.py", "--device", "cpu", "--shapes", "tiny-qwen3",
                                      "--drafter-shapes", "pard", "--acceptance", "tau:3", "--tokens", "4",
                                      "--batches", "2", "--out-dir", str(out)])
    bench_batching.main()
    rows = [json.loads(line) for line in (out / "batching.jsonl").read_text().splitlines()]
    assert [r["system"] for r in rows] == ["ar", "one-level", "two-level", "per-request"]
    for row in rows:
        assert row["batch"] == 2 and row["pair"] == "tiny-qwen3+pard"
        assert row["predicted_tokens_per_s"] > 0
        assert ("skipped" in row) != ("tokens_per_s" in row)
        if "tokens_per_s" in row:
            assert row["tokens"] == 8 and row["tokens_per_s"] > 0
    run = json.loads((out / "run.json").read_text())
    assert "replayed" in run["notice"] and run["acceptance"] == "tau:3"
