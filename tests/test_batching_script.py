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
                                      "--batches", "2", "--out-dir", str(out), "--audit"])
    bench_batching.main()
    rows = [json.loads(line) for line in (out / "batching.jsonl").read_text().splitlines()]
    assert [r["system"] for r in rows] == ["ar", "one-level", "two-level", "per-request"]
    for row in rows:
        assert row["batch"] == 2 and row["pair"] == "tiny-qwen3+pard"
        assert row["predicted_tokens_per_s"] > 0
        assert ("skipped" in row) != ("tokens_per_s" in row)
        if "tokens_per_s" in row:
            assert row["tokens"] == 8 and row["tokens_per_s"] > 0
            assert row["decode_steps"] > 0 and 0 < row["decode_seconds"] < row["seconds"]
            audit = row["audit"]  # one device -> host read per step (two-level: up to two), no blocking upload
            assert 1 <= audit["host_reads_per_step"] <= 2 and audit["blocking_uploads_per_step"] == 0
            assert audit["forwards_per_step"] >= 1
    run = json.loads((out / "run.json").read_text())
    assert "replayed" in run["notice"] and run["acceptance"] == "tau:3"


def _flip_batched_ar(monkeypatch):
    """Batched AR's request 0 gets a different token at position 1 (a forced divergence)."""
    from examples import bench_batching

    real = bench_batching.drive

    def flipped(loop, prompts, *args, **kwargs):
        run = real(loop, prompts, *args, **kwargs)
        if loop.drafter is None and len(prompts) > 1:
            run.results[0].tokens[1] = (run.results[0].tokens[1] + 1) % 500
        return run

    monkeypatch.setattr(bench_batching, "drive", flipped)


def _argv(out, *extra):
    return ["bench_batching.py", "--device", "cpu", "--shapes", "tiny-qwen3", "--drafter-shapes", "pard",
            "--acceptance", "tau:3", "--tokens", "4", "--batches", "2", "--out-dir", str(out), *extra]


def test_bench_batching_stops_at_a_difference_that_is_no_tie(tmp_path, monkeypatch):
    import pytest

    from examples import bench_batching

    _flip_batched_ar(monkeypatch)
    monkeypatch.setattr(sys, "argv", _argv(tmp_path / "run"))
    with pytest.raises(SystemExit, match="request 0 position 1.*not timing a wrong system"):
        bench_batching.main()


def test_bench_batching_records_a_tie_and_keeps_timing(tmp_path, monkeypatch):
    from examples import bench_batching

    _flip_batched_ar(monkeypatch)
    out = tmp_path / "run"
    # every margin of the tiny random model lies below this tolerance: the difference counts as a tie
    monkeypatch.setattr(sys, "argv", _argv(out, "--tie-tolerance", "1e9"))
    bench_batching.main()
    rows = [json.loads(line) for line in (out / "batching.jsonl").read_text().splitlines()]
    ar = rows[0]
    assert ar["system"] == "ar" and ar["tokens_per_s"] > 0
    (tie,) = ar["ties"]
    assert (tie["request"], tie["position"]) == (0, 1) and tie["expected"] != tie["got"]
    assert 0 < tie["margin"] < 1e9 and tie["fp32_margin"] is not None
    assert [r["system"] for r in rows] == ["ar", "one-level", "two-level", "per-request"]
