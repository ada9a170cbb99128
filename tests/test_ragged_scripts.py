"""examples/bench_ragged_verify.py and bench_packed_step.py run in a small CPU smoke setting and write their JSON (its real
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


def test_bench_packed_step_smoke(tmp_path):
    """Every row at one k, dense and packed: the same tokens per step (the packing changes the
    verify's layout, not what is accepted), and a profiled pass that counted the steps' work."""
    spec = importlib.util.spec_from_file_location("bench_packed_step", ROOT / "examples" / "bench_packed_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "packed.json"
    bench.main(["--shapes", "tiny-qwen3", "--batch", "3", "--ks", "2", "--tokens", "8", "--profile", "2",
                "--deployment", "cpu", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["k"], r["packed"]) for r in rows] == [(2, False), (2, True)]
    assert all(r["step_ms"] > 0 and r["steps"] > 0 for r in rows)
    assert rows[0]["tokens_per_step"] == rows[1]["tokens_per_step"] > 1
    assert all(r["kernels"]["ranges"] == r["steps"] and r["kernels"]["launches"] > 0 for r in rows)


def test_bench_buckets_smoke(tmp_path):
    """Occupancy rows off and on (on: steps at the bucket's width, fewer rows than the slots), a
    drain of spread budgets, and a trained pair whose tokens the buckets leave unchanged."""
    spec = importlib.util.spec_from_file_location("bench_buckets", ROOT / "examples" / "bench_buckets.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.spread(4, 16) == [2, 6, 11, 16]
    out = tmp_path / "buckets.json"
    bench.main(["--shapes", "tiny-qwen3", "--capacity", "8", "--running", "2", "--tokens", "8",
                "--deployment", "cpu", "--real", "specc-tiny:specc-tiny-dflash", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [(r["running"], r["buckets"]) for r in report["occupancy"]] == [(2, False), (2, True)]
    assert [r["buckets"] for r in report["drain"]] == [False, True]
    assert all(r["steps"] > 0 and r["step_ms"] > 0 for r in report["occupancy"] + report["drain"])
    assert report["real"]["budgets"] == bench.spread(8, 8) and report["real"]["differences"] == []


def test_profile_batch_parts_smoke(tmp_path):
    """The per-part device times of the batched speculative and AR steps add up to the profiled
    step (the parts cover the device's timeline)."""
    spec = importlib.util.spec_from_file_location("profile_batch_parts", ROOT / "examples" / "profile_batch_parts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "parts.json"
    rows = bench.main(["--shapes", "tiny-qwen3", "--batches", "2", "--tokens", "6", "--deployment", "cpu",
                       "--out", str(out)])
    assert set(rows) == {"spec-B2", "ar-B2"} and json.loads(out.read_text()) == rows
    for row in rows.values():
        parts = row["parts_ms_per_step"]
        assert {"draft", "verify", "accept", "between"} <= set(parts) and row["steps"] > 0
        assert parts["verify"] > 0 and row["step_ms_profiled"] > 0


def test_profile_batch_parts_kernels_and_greedy_verifier(tmp_path):
    """``--kernels``: each speculative part's ops inside its own ``part:NAME`` range (on the CPU
    the host ops); ``--greedy-verifier``: the same loop with the greedy chain verifier, its parts
    timed too."""
    spec = importlib.util.spec_from_file_location("profile_batch_parts", ROOT / "examples" / "profile_batch_parts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--shapes", "tiny-qwen3", "--batches", "2", "--tokens", "6", "--deployment", "cpu",
                       "--kernels", "--greedy-verifier"])
    assert set(rows) == {"spec-B2", "ar-B2", "spec-greedy-B2"}
    kernels = rows["spec-B2"]["kernels"]
    assert {"draft", "verify", "accept"} <= set(kernels)
    assert all(k["top"] and k["kernel_us"] > 0 for k in kernels.values())
    assert {"draft", "verify", "accept"} <= set(rows["spec-greedy-B2"]["parts_ms_per_step"])


def test_profile_batch_parts_host_profile(tmp_path):
    """``--host-profile N``: the speculative rows carry cProfile's N functions with the most own
    time per decode step, largest first, the loop's own step among the functions called and the
    admissions' prefills left out."""
    spec = importlib.util.spec_from_file_location("profile_batch_parts", ROOT / "examples" / "profile_batch_parts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--shapes", "tiny-qwen3", "--batches", "2", "--tokens", "6", "--deployment", "cpu",
                       "--host-profile", "400"])
    host = rows["spec-B2"]["host"]
    assert "host" not in rows["ar-B2"] and host["decode_steps"] > 0
    own = [r["us_per_step"] for r in host["top"]]
    assert len(own) > 20 and own == sorted(own, reverse=True) and own[0] > 0
    assert all(r["cum_us_per_step"] >= r["us_per_step"] - 1e-6 and r["calls_per_step"] > 0 for r in host["top"])
    assert any("speculate" in r["function"] for r in host["top"])
    assert not any("prefill_slot" in r["function"] for r in host["top"])  # admissions are not profiled
