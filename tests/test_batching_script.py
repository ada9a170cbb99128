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
                                      "--batches", "2", "--out-dir", str(out), "--audit", "--kernels"])
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
            # decode tokens (the first token of each request comes from its prefill) / decode seconds
            assert abs(row["decode_tokens_per_s"] * row["decode_seconds"] - (8 - 2)) < 1e-6
            # steady: B x tokens per request-step / step time; uneven finishing makes it the larger
            step_s = row["decode_seconds"] / row["decode_steps"]
            assert abs(row["steady_tokens_per_s"] - 2 * row["tokens_per_step"] / step_s) < 1e-6
            assert row["steady_tokens_per_s"] >= row["decode_tokens_per_s"] * (1 - 1e-9)
            assert "vs_ar_decode" in row and "vs_ar_steady" in row
            audit = row["audit"]  # one device -> host read per step (two-level: up to two), no blocking upload
            assert 1 <= audit["host_reads_per_step"] <= 2 and audit["blocking_uploads_per_step"] == 0
            assert audit["forwards_per_step"] >= 1
    assert rows[0]["vs_ar_decode"] == rows[0]["vs_ar_steady"] == 1.0
    kernels = rows[1]["kernels"]  # --kernels: the one-level pass's decode steps, by op (host ops on the CPU)
    assert kernels["what"] == "cpu_op" and kernels["ranges"] == rows[1]["decode_steps"]
    assert kernels["range_ms"] > 0 and kernels["launches"] > 0 and kernels["top"][0]["us_per_range"] > 0
    assert all("kernels" not in r for r in rows if r["system"] != "one-level")
    run = json.loads((out / "run.json").read_text())
    assert "replayed" in run["notice"] and run["acceptance"] == "tau:3"


def test_kernels_in_ranges_counts_only_kernels_launched_inside_the_ranges():
    """A kernel belongs to the range its launch (by correlation id) was issued in: kernels of a
    graph launch inside a step count, a prefill's kernel launched outside does not."""
    from specc.bench.gaps import kernels_in_ranges

    ev = [{"name": "step", "ph": "X", "ts": 100.0, "dur": 50.0},
          {"name": "step", "ph": "X", "ts": 300.0, "dur": 50.0},
          {"name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 110.0, "args": {"correlation": 1}},
          {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 200.0, "args": {"correlation": 2}},
          {"name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 320.0, "args": {"correlation": 3}},
          {"name": "gemm(a)", "cat": "kernel", "ts": 120.0, "dur": 10.0, "args": {"correlation": 1}},
          {"name": "attn", "cat": "kernel", "ts": 131.0, "dur": 4.0, "args": {"correlation": 1}},
          {"name": "prefill", "cat": "kernel", "ts": 210.0, "dur": 30.0, "args": {"correlation": 2}},
          {"name": "gemm(b)", "cat": "kernel", "ts": 330.0, "dur": 12.0, "args": {"correlation": 3}}]
    out = kernels_in_ranges({"traceEvents": ev}, "step")
    assert out["what"] == "kernel" and out["ranges"] == 2 and out["range_ms"] == 0.05
    assert out["kernel_us"] == 13.0 and out["launches"] == 1.5
    assert [(r["kernel"], r["calls_per_range"], r["us_per_range"]) for r in out["top"]] == [("gemm", 1.0, 11.0),
                                                                                         ("attn", 0.5, 2.0)]


def _flip_batched_ar(monkeypatch):
    """Batched AR's request 0 gets a different token at position 1 (a forced divergence)."""
    from specc.bench import batched

    real = batched.drive

    def flipped(loop, prompts, *args, **kwargs):
        run = real(loop, prompts, *args, **kwargs)
        if loop.drafter is None and len(prompts) > 1:
            run.results[0].tokens[1] = (run.results[0].tokens[1] + 1) % 500
        return run

    monkeypatch.setattr(batched, "drive", flipped)


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


def test_linears_used_says_which_choice_the_steps_take():
    """run.json says what the linears ran: a built-in H200 deployment the stated rule (runs 5b-8
    ran Triton everywhere before it existed), a GPU without one Triton at every row count, a
    calibrated file its measured table."""
    import argparse

    import torch

    from examples import bench_batching

    opts = argparse.Namespace(linears="auto", deployment="h200-bs1")
    assert bench_batching.linears_used(opts, torch.device("cpu")) == "triton"
    assert bench_batching.linears_used(opts, torch.device("cuda")).startswith("built-in rule for NVIDIA H200")
    opts = argparse.Namespace(linears="auto", deployment="a100-bs16")
    said = bench_batching.linears_used(opts, torch.device("cuda"))
    assert said.startswith("triton at every row count (deployment a100-bs16 has no calibration record")
    run8 = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "linears-h200-run8.deployment.json"
    opts = argparse.Namespace(linears="auto", deployment=str(run8))
    assert bench_batching.linears_used(opts, torch.device("cuda")).startswith("per-shape choice of ")
