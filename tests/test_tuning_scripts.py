"""The profiling and tuning scripts in examples/ (their GPU parts run on the H200; here: the CPU
smoke path of profile_step.py, the candidate grids, and the hooks that install sweep results)."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specc.codegen.kernels import attention as A  # noqa: E402
from specc.codegen.kernels import linear as L  # noqa: E402


def test_profile_step_cpu_smoke(tmp_path, monkeypatch):
    from examples import profile_step

    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["profile_step.py", "--tiny", "--device", "cpu", "--q", "1,4", "--reps", "2", "--out", str(out)])
    profile_step.main()
    res = json.loads(out.read_text())
    assert set(res["steps"]) == {"1", "4"} and all(v["ms"] > 0 for v in res["steps"].values())
    # tiny Qwen3: fused qkv, o, fused gate_up, down, lm_head
    assert sorted(map(tuple, res["linear_shapes"])) == [(64, 64), (64, 128), (128, 64), (256, 64), (512, 64)]


def test_profile_step_ablations_time_the_steps_again_and_restore_the_kernels(tmp_path, monkeypatch):
    from examples import profile_step
    from specc.codegen.kernels import rmsnorm, rope

    kernels = rmsnorm.rms_norm, rope.rope_and_cache, L.get_config
    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["profile_step.py", "--tiny", "--device", "cpu", "--q", "1,4", "--reps", "2",
                                      "--ablate-norm", "--ablate-rope", "--unfuse-norm", "--out", str(out)])
    profile_step.main()
    res = json.loads(out.read_text())
    for key in ("steps_without_norm_kernels", "steps_without_rope_kernels", "steps_norm_unfused"):
        assert set(res[key]) == {"1", "4"} and all(v["ms"] > 0 for v in res[key].values())
    assert (rmsnorm.rms_norm, rope.rope_and_cache, L.get_config) == kernels  # no stand-in outlives its timing


def test_profile_step_stand_ins_take_the_arguments_of_the_kernels_they_replace():
    """An ablation's stand-in is called where the kernel was, with the kernel's arguments (a stand-in
    without ``residual`` once failed a B = 16 profile on the GPU, where residual-norm pairs pass it)."""
    import inspect

    from examples import profile_step
    from specc.codegen.kernels import rmsnorm, rope

    for kernel, stand_in in ((rmsnorm.rms_norm, profile_step.skip_norm), (rope.rope_and_cache, profile_step.skip_rope)):
        assert list(inspect.signature(kernel).parameters) == list(inspect.signature(stand_in).parameters)


def test_profile_step_named_config_at_batch(tmp_path, monkeypatch):
    """--config and --batch: a small named target profiled at batch 3 (the small-model calibration
    profiles); --tune refuses a batch."""
    from examples import profile_step

    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["profile_step.py", "--config", "tiny", "--batch", "3", "--device", "cpu",
                                      "--q", "2", "--reps", "2", "--out", str(out)])
    profile_step.main()
    res = json.loads(out.read_text())
    assert res["batch"] == 3 and res["config"] == "tiny" and res["steps"]["2"]["ms"] > 0
    monkeypatch.setattr(sys, "argv", ["profile_step.py", "--tiny", "--batch", "2", "--tune", "4", "--device", "cpu"])
    with pytest.raises(SystemExit):
        profile_step.main()


def test_swept_attention_plans_are_used(tmp_path, monkeypatch):
    from examples import profile_step

    sweep = {"best": {"16@1152": {"block_m": 32, "num_splits": 7, "fused_merge": True, "us": 1.0}}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sweep))
    monkeypatch.setattr(A, "launch_plan", A.launch_plan)  # restored after the test
    profile_step.use_swept_attention(str(path))
    plan = A.launch_plan(1, 16, 32, 8, 128, 1100, torch.device("cpu"))
    assert (plan["block_m"], plan["num_splits"], plan["fused_merge"]) == (32, 7, True)
    other = A.launch_plan(1, 4, 32, 8, 128, 1152, torch.device("cpu"))  # not swept: the shipped plan
    assert other["num_splits"] == 18 and other["fused_merge"] is False


def test_linear_sweep_candidates_and_install(tmp_path):
    from examples import bench_steps, sweep_linear

    for m in (4, 16, 64):
        cands = sweep_linear.candidates(m)
        assert len(cands) == len(set(cands)) == 180
        assert all(c.kind == "dot" and c.block_m == max(16, m) for c in cands)
    best = L.LinearConfig("dot", block_m=16, block_n=16, block_k=128, split_k=3, num_stages=3)
    path = tmp_path / "lin.json"
    path.write_text(json.dumps({"best": {"4:o": [{"config": best.__dict__, "us": 1.0}]}}))
    try:
        installed = bench_steps.install_linear_sweep(str(path))
        assert L.get_config(3, 4096, 4096) == best and installed[0]["shape"] == "o"
    finally:
        L.clear_configs()
    assert L.get_config(3, 4096, 4096) != best


@pytest.mark.parametrize("num_q,bms", [(1, {16}), (16, {16, 32, 64})])
def test_attention_sweep_candidates(num_q, bms):
    pytest.importorskip("triton")
    from examples import sweep_attention

    cands = list(sweep_attention.candidates(num_q))
    assert {c["block_m"] for c in cands} == bms
    assert not any(c["fused_merge"] and c["num_splits"] == 1 for c in cands)


def test_bench_linears_cpu_smoke(tmp_path):
    """examples/bench_linears.py on CPU: calibration lines, both step variants with predictions,
    the goal ratios, and the "on" lowering recorded (a forced choice: CPU times no Triton linear)."""
    from examples import bench_linears

    out = tmp_path / "l.json"
    res = bench_linears.main(["--device", "cpu", "--tiny", "--batches", "1", "--qs", "1,4", "--reps", "2",
                              "--bs1-attention-plan", "--out", str(out)])
    assert json.loads(out.read_text())["goals"] == res["goals"]
    assert res["linears"] and all(r["cublas_ms"] > 0 and "triton_ms" not in r for r in res["linears"])
    variants = ("off", "on", "on-bs1-attention")
    assert {(r["linear_choice"], r["Q"]) for r in res["steps"]} == {(v, q) for v in variants for q in (1, 4)}
    assert all(r["measured_ms"] > 0 and r["predicted_ms"] > 0 for r in res["steps"])
    assert set(res["goals"]) == {f"{v}: verify B=1 Q=4 / AR B=1" for v in variants}
    assert res["lowering_on"] and all([x["impl"] for x in r["ranges"]] == ["triton", "cublas"]
                                      for r in res["lowering_on"])
    assert "profiles" not in res  # the kernel profile needs CUDA
    cat = bench_linears.kernel_category
    assert [cat(n) for n in ("_gemm_kernel", "sm90_xmma_gemm_bf16bf16", "nvjet_tst_128x64", "_attn_split_kernel",
                             "_rmsnorm_kernel", "_attn_merge_kernel")] == ["linear"] * 3 + ["attention", "other",
                                                                             "attention"]
    assert [bench_linears.node_category(k) for k in ("norm_linear", "linear_add", "rope_attention", "swiglu")] == [
        "linear", "linear", "attention", "other"]


def test_bs1_attention_plan_switches_the_rule_around_each_call():
    """bench_linears' bs1-rule variant plans a batched verify block as the bs1 rule does while it
    runs (a graph captured inside keeps that plan) and restores the batched rule after."""
    pytest.importorskip("triton")
    from examples import bench_linears
    from specc.codegen.kernels.attention import launch_plan

    def splits():
        return launch_plan(16, 16, 32, 8, 128, 1040, torch.device("cpu"), sms=132)["num_splits"]

    seen = []
    wrapped = bench_linears.Bs1AttentionPlan(lambda *a: seen.append(splits()))
    wrapped()
    assert seen == [4] and splits() == 1


def test_bench_bf12_tiny_runs_both_layouts(tmp_path):
    """examples/bench_bf12.py end to end on the CPU (interpreter, tiny shapes): the GPU run
    cannot fail on a typo in the kernel sweep; every config it times is checked correct, and the
    step rows time each layout it names (the pass runs with that layout's ``pack_version``)."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bf12.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root), "SPECC_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(root / "examples" / "bench_bf12.py"), "--tiny", "--quick", "--steps",
                           "--shapes", "o", "--ms", "1,16", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    rows = [r for r in lines if r["kind"] == "linear"]
    assert [r["M"] for r in rows] == [1, 16]
    res = json.loads(out.read_text())
    for r in res["linear"]:
        assert r["v1_config"] == "table" and r["v2_us"] > 0 and r["v2_rel_err"] < 1e-5
        assert all(c["ok"] for c in r["v2_configs"]), r["v2_configs"]
        assert 0 < r["v2_hbm_frac"] and r["v2_bytes"] < 0.8 * 2 * r["N"] * r["K"] + 200
        assert "tensor-core kernel cannot run" in r["mma_error"]  # GPU only (and these tiny shapes): said so
    steps = [(r["step"], r["variant"], r["pack_stats"]["format_version"]) for r in res["steps"]]
    variants = ["packed_v1", "packed_v2", "packed_v2_prefetch", "packed_v2_u2w4", "packed_v2_triton",
                "packed_v3"]
    layout = {"packed_v1": 1, "packed_v3": 3}
    assert steps == [(step, v, layout.get(v, 2)) for step in ("AR", "verify Q=16") for v in variants]
    for r in res["steps"]:  # fp32 on the CPU: the same weights give the same logits
        assert r["same_greedy_tokens"] and r["flips_are_ties"] and r["max_abs_logit_diff"] < 1e-4


def test_bench_bf12_builds_only_the_step_variants_asked_for(tmp_path):
    """``--step-variants`` keeps a GPU call to the steps it needs (the unpacked one is always the
    yardstick), and a misspelt variant stops the run before any step is built."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bf12.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root), "SPECC_THREADS": "1"}
    base = [sys.executable, str(root / "examples" / "bench_bf12.py"), "--tiny", "--quick", "--shapes", "o",
            "--ms", "1", "--layouts", "v2", "--out", str(out)]
    proc = subprocess.run(base + ["--step-variants", "packed_v2_u2w4"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = json.loads(out.read_text())["steps"]
    assert [(r["step"], r["variant"]) for r in steps] == [("AR", "packed_v2_u2w4"),
                                                          ("verify Q=16", "packed_v2_u2w4")]
    bad = subprocess.run(base + ["--step-variants", "packed_v4"], capture_output=True, text=True, env=env,
                         timeout=300, cwd=root)
    assert bad.returncode != 0 and "unknown --step-variants ['packed_v4']" in bad.stdout + bad.stderr
    assert json.loads(out.read_text())["steps"] == []  # the kernel half is kept, no step was built


def test_bench_bf12_experiments_change_one_choice_each_and_restore_it():
    """Run 29's step experiments: ``packed_v3_norm_fused`` lets the tensor-core kernel fuse the norm
    at one row again, ``packed_v3_mid_u1w8`` / ``packed_v3_mid16_u1w8`` give q/k/v's launch (2.9
    waves of blocks on 132 SMs) 1 super-group x 8 warps at 1-8 / 9-16 rows and leave the other
    shapes and row counts alone; the shipped choices are back afterwards."""
    from examples import bench_bf12
    from specc.codegen.kernels import linear_bf12_mma as mma

    qkv, down = (6144, 4096), (4096, 12288)
    shipped = {(m, s): mma.get_config(m, *s, 132) for m in (1, 16) for s in (qkv, down)}
    with bench_bf12._kernel_choice("packed_v3_norm_fused"):
        assert mma.fuses_norm(1, 4096) and not mma.fuses_norm(16, 4096)
    with bench_bf12._kernel_choice("packed_v3_mid_u1w8"):
        assert mma.get_config(1, *qkv, 132) == mma.Bf12MmaConfig(unroll=1, warps=8, prefetch=True)
        assert mma.get_config(16, *qkv, 132) == shipped[(16, qkv)] and mma.get_config(1, *down, 132) == shipped[(1, down)]
    with bench_bf12._kernel_choice("packed_v3_mid16_u1w8"):
        assert mma.get_config(16, *qkv, 132) == mma.Bf12MmaConfig(unroll=1, warps=8, prefetch=False)
        assert mma.get_config(1, *qkv, 132) == shipped[(1, qkv)]
    assert not mma.fuses_norm(1, 4096)
    assert {(m, s): mma.get_config(m, *s, 132) for m in (1, 16) for s in (qkv, down)} == shipped


def test_bench_bf12_candidates_at_rows_between_powers_of_two():
    """24 rows: the Triton kernel's candidates take the 32-row tile (row tiles are powers of two;
    run 34's first sweep at 24 rows stopped on a 24-row tile), the tensor-core kernel's its
    shipped launch first and nothing above 32 rows."""
    from examples import bench_bf12
    from specc.codegen.kernels import linear_bf12_mma as mma

    assert {c.block_m for c in bench_bf12.candidates_v2(24)} == {32}
    shipped = mma.get_config(24, 4096, 4096, 132)
    assert bench_bf12.configs_for("mma3", 24, True, False, (4096, 4096), 132)[0] == shipped
    assert bench_bf12.candidates_mma(33) == []


def test_large_gemm_tiles_fit_shared_memory_and_registers():
    """``sweep_linear --dot large``: tiles for 128-512 rows, none with a row tile past the rows'
    power of two, every one within ~200 KB of shared memory and ~128 accumulator registers a
    thread, and each computes the product (interpreted, fp32)."""
    from examples import sweep_linear

    for m in (128, 256, 512):
        cands = sweep_linear.large_dot_candidates(m)
        assert len(cands) == len(set(cands)) > 100
        for c in cands:
            assert c.kind == "dot" and 64 <= c.block_m <= max(64, m) and not c.swap_ab
            assert (c.block_m + c.block_n) * c.block_k * 2 * c.num_stages <= 200 * 1024
            assert c.block_m * c.block_n <= 128 * 32 * c.num_warps
    x, w = torch.randn(130, 256), torch.randn(192, 256)
    c = L.LinearConfig("dot", block_m=256, block_n=64, block_k=64, split_k=2, num_warps=8, num_stages=3,
                       swap_ab=False)
    assert L.use_triton(x)  # the interpreter (tests/conftest.py): the kernel itself runs
    assert torch.allclose(L.linear(x, w, config=c), x @ w.T, atol=1e-3, rtol=1e-4)


def test_gemm_variants_cpu_smoke_and_record_merge(tmp_path):
    """``bench_gemm_variants.py``: the CPU smoke run times its variants, and ``--record`` merges
    the cuBLAS times into a linear-choice table the built-in rules can load (a point measured
    again replaces the old one)."""
    from examples import bench_gemm_variants
    from specc.codegen.linear_choice import LinearChoice

    out, record = tmp_path / "v.json", tmp_path / "times.json"
    argv = ["--device", "cpu", "--small", "--ms", "8,16", "--reps", "2", "--out", str(out), "--record", str(record)]
    first = bench_gemm_variants.main(argv)
    assert {r["M"] for r in first["rows"]} == {8, 16} and all(r["cublas"]["us"] > 0 for r in first["rows"])
    bench_gemm_variants.main(argv[:4] + ["16,32"] + argv[5:])
    table = LinearChoice.from_json(json.loads(record.read_text()))
    assert [p.m for p in table.shape(64, 64).points] == [8, 16, 32]
    assert all(p.impl == "cublas" and p.cublas_s > 0 for p in table.shape(64, 192).points)


def test_ab_linear_configs_alternates_in_one_process_and_restores_the_table(tmp_path):
    from examples import ab_linear_configs

    before = L.get_config(4, 64, 64)
    alt = '4,64,64={"kind": "dot", "block_m": 16, "block_n": 16, "block_k": 16, "split_k": 1}'
    res = ab_linear_configs.main(["--tiny", "--device", "cpu", "--q", "4", "--context", "8", "--rounds", "2",
                                  "--reps", "2", "--alt", alt, "--out", str(tmp_path / "ab.json")])
    assert json.loads((tmp_path / "ab.json").read_text())["median_ms"] == res["median_ms"]
    assert all(len(res["ms"][k]) == 2 and min(res["ms"][k]) > 0 for k in ("shipped", "alternative", "q1"))
    assert res["configs"][0]["alternative"]["block_n"] == 16 and res["configs"][0]["shipped"] == \
        __import__("dataclasses").asdict(before)
    assert L.get_config(4, 64, 64) == before  # the override is gone
    with pytest.raises(SystemExit):
        ab_linear_configs.main(["--tiny", "--device", "cpu", "--alt", "4,64=[]"])
