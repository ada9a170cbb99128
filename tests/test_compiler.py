"""`specc compile` end to end on tiny checkpoints: every target x drafter, run == HF greedy,
verification recorded, artifacts refused when tampered, nothing written when verification fails."""

import json

import pytest
from helpers import PROMPT, hf_greedy, hf_model

from specc.cli import main
from specc.codegen.artifact import ArtifactError
from specc.compiler import VerificationFailed, compile_artifact
from specc.runtime.engine import load

IDS = ",".join(map(str, PROMPT))


@pytest.mark.parametrize("drafter_key,method", [(None, "ar"), ("ar_same", "ar-draft"), ("pard_same", "pard"),
                                                ("dflash", "dflash")])
def test_compile_run_verify_every_drafter(checkpoints, tmp_path, capsys, drafter_key, method):
    out = tmp_path / "model.specc"
    argv = ["compile", checkpoints["target"], "-o", str(out), "--deployment", "cpu", "--verify-tokens", "12"]
    if drafter_key:
        argv += ["--drafter", checkpoints[drafter_key]]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    assert "token forcing PASS" in summary and "fuse_qkv" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == method and manifest["verification"]["passed"]
    assert {r["name"] for r in manifest["passes"]["applied"]["target"] if r["changed"]} >= {"fuse_qkv", "fuse_gate_up"}
    assert not manifest["lowering"]["target"]["eager"]

    assert main(["run", str(out), "--input-ids", IDS, "--max-new-tokens", "12", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    target = hf_model(checkpoints["target"])
    assert payload["tokens"] == hf_greedy(target, PROMPT, 12, target.config.eos_token_id)
    assert payload["method"] == method

    assert main(["verify", str(out), "--tokens", "8"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["verify", str(out), "--tokens", "8", "--fp32-audit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["audited_ties"] == []  # fp32 stock: nothing to audit
    assert report["audit"] == "fp32 audit: not needed (stock runs in fp32)"


@pytest.mark.parametrize("family", ["qwen3"], indirect=True)
def test_speculative_artifact_predicted_slower_than_ar_is_built_and_said(checkpoints, tmp_path, capsys):
    """A drafter that is never right: the best speculative configuration is predicted slower than
    AR; compile still builds the speculative artifact asked for, and one line says so."""
    out = tmp_path / "slow.specc"
    assert main(["compile", checkpoints["target"], "--drafter", checkpoints["ar_random"], "-o", str(out),
                 "--verify-tokens", "8", "--memory", str(tmp_path / "memory")]) == 0
    lines = capsys.readouterr().out.splitlines()
    manifest = json.loads((out / "manifest.json").read_text())
    speedup = manifest["prediction"]["speedup"]
    assert manifest["method"] == "ar-draft" and manifest["num_draft"] >= 1 and speedup < 0.99
    warning = [line for line in lines if "slower than AR" in line]
    assert warning == [f"predicted slower than AR ({speedup:.2f}x): `specc compile` without --drafter builds the "
                       "AR artifact"]
    assert lines.index(warning[0]) == 1 + next(i for i, line in enumerate(lines) if line.startswith("predicted on"))
    ar = compile_artifact(checkpoints["target"], out=tmp_path / "ar.specc", max_new_tokens=8, memory=False)
    assert not any("slower than AR" in line for line in ar.summary_lines)


def test_stream_matches_generate(checkpoints, tmp_path):
    out = tmp_path / "s.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=8)
    engine = load(out)
    streamed = list(engine.stream(PROMPT, 10, eos_token_id=()))
    assert streamed == engine.generate(PROMPT, 10, eos_token_id=()).tokens
    assert engine.last_stats["tokens"] == 10
    profiled = engine.generate(PROMPT, 10, eos_token_id=(), profile=True)
    assert profiled.tokens == streamed
    parts = engine.last_stats["part_seconds"]
    assert set(parts) == {"prefill", "draft", "verify", "accept"} and all(v > 0 for v in parts.values())


def test_failed_verification_writes_nothing(checkpoints, tmp_path, capsys):
    out = tmp_path / "broken.specc"
    code = main(["compile", checkpoints["target"], "-o", str(out), "--verify-tokens", "6",
                 "--passes", "fuse_qkv,+broken_passes:FlipFirstLinear"])
    assert code == 1
    assert "verification failed" in capsys.readouterr().err
    assert not out.exists()
    assert not list(tmp_path.glob(".broken.specc*"))
    with pytest.raises(VerificationFailed, match="mismatch"):
        compile_artifact(checkpoints["target"], out=out, passes="+broken_passes:FlipFirstLinear", max_new_tokens=6)


def test_user_pass_without_kernel_runs_eagerly_and_is_reported(checkpoints, tmp_path):
    out = tmp_path / "user.specc"
    result = compile_artifact(checkpoints["target"], out=out, max_new_tokens=6,
                              passes="fuse_gate_up,+examples.custom_pass:FuseSiluMulDown")
    assert result.manifest["lowering"]["target"]["eager"] == {"silu_mul_linear": 4}
    assert "eager" in "\n".join(result.summary_lines)


def test_tampered_and_incomplete_artifacts_are_refused(checkpoints, tmp_path, capsys):
    out = tmp_path / "t.specc"
    compile_artifact(checkpoints["target"], out=out, max_new_tokens=4)
    (out / "target.py").write_text((out / "target.py").read_text() + "\n# edited\n")
    with pytest.raises(ArtifactError, match="does not match its manifest hash"):
        load(out)
    assert main(["run", str(out), "--input-ids", IDS]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    compile_artifact(checkpoints["target"], out=out, max_new_tokens=4)  # replaces the tampered one
    (out / "weights.safetensors").unlink()
    with pytest.raises(ArtifactError, match="missing file weights.safetensors"):
        load(out)
    with pytest.raises(ArtifactError, match="not a specc artifact"):
        load(tmp_path)


def test_compile_bad_inputs(checkpoints, tmp_path, capsys):
    assert main(["compile", checkpoints["target"], "-o", str(tmp_path / "x"), "--deployment", "nope"]) == 2
    assert "unknown deployment" in capsys.readouterr().err
    assert main(["compile", checkpoints["target"], "-o", str(tmp_path / "x"), "--passes", "no_such_pass"]) == 2
    assert "no_such_pass" in capsys.readouterr().err
    bad = tmp_path / "choice.json"
    bad.write_text(json.dumps({"shapes": [{"N": 8, "K": 8, "points": [{"M": 1, "impl": "cutlass"}]}]}))
    for table, message in ((bad, "impl must be one of"), (tmp_path / "missing.json", "unreadable linear choice")):
        assert main(["compile", checkpoints["target"], "-o", str(tmp_path / "x"), "--linears", str(table)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def _linear_shapes(checkpoint: str) -> list[tuple[int, int]]:
    """(N, K) of the target's linears after the default fusions (qkv, o, gate_up, down, lm_head)."""
    from pathlib import Path

    c = json.loads((Path(checkpoint) / "config.json").read_text())
    h, inter = c["hidden_size"], c["intermediate_size"]
    d = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    return [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter), (c["vocab_size"], h)]


def test_calibrated_cublas_choice_is_lowered_forced_and_recorded(checkpoints, tmp_path, monkeypatch):
    """A calibrated deployment whose record picks cuBLAS from 2 rows up: the compiled steps call it
    for every multi-row linear (verify blocks, prefill), token forcing still passes (fp32 CPU),
    and the manifest records which linears, which rows, which implementation."""
    import dataclasses

    from specc.codegen.kernels import linear_cublas
    from specc.codegen.linear_choice import LinearChoice
    from specc.search.calibrate import Calibration, write_calibration
    from specc.search.deployments import BUILTIN

    shapes = _linear_shapes(checkpoints["target"])
    table = LinearChoice.forced(shapes, rows=(2, None), source="forced for a test")
    dep_file = tmp_path / "cpu-cublas.json"
    write_calibration(dep_file, dataclasses.replace(BUILTIN["cpu"], calibrated=True),
                      Calibration(deployment="cpu", device="cpu", linear_choice=table.to_json()))
    rows_seen: list[int] = []
    real = linear_cublas.linear_cublas
    monkeypatch.setattr(linear_cublas, "linear_cublas",
                        lambda x, *a, **k: rows_seen.append(x.numel() // x.shape[-1]) or real(x, *a, **k))
    out = tmp_path / "cublas.specc"
    result = compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, deployment=str(dep_file),
                              max_new_tokens=8, tree="off")
    manifest = result.manifest
    assert manifest["verification"]["passed"]
    assert rows_seen and min(rows_seen) >= 2  # the forced range only
    assert manifest["linear_choice"] == {"source": "forced for a test", "margin": 0.0, "summary": table.summary()}
    for role in ("target", "drafter"):  # PARD's drafter has the target's shapes
        records = {(r["N"], r["K"]): r for r in manifest["lowering"][role]["linear_impl"]}
        assert set(records) == set(shapes), role
        for r in records.values():
            assert r["nodes"] and [(x["rows"], x["impl"]) for x in r["ranges"]] == [([1, 1], "triton"),
                                                                                   ([2, None], "cublas")]
    assert "cublas_rows = ((2, None),)" in (out / "target.py").read_text()
    assert any("linears with cuBLAS row ranges" in line for line in result.summary_lines)
    # the same deployment with `--linears triton`: no cuBLAS calls, no records
    calls = len(rows_seen)
    plain = tmp_path / "plain.specc"
    assert main(["compile", checkpoints["target"], "--drafter", checkpoints["pard_same"], "-o", str(plain),
                 "--deployment", str(dep_file), "--verify-tokens", "4", "--tree", "off", "--linears", "triton"]) == 0
    manifest = json.loads((plain / "manifest.json").read_text())
    assert manifest["linear_choice"] is None and "linear_impl" not in manifest["lowering"]["target"]
    assert len(rows_seen) == calls
    # a table file is read as given
    from specc.compiler import _linear_choice

    path = tmp_path / "choice.json"
    path.write_text(json.dumps(table.to_json()))
    assert _linear_choice(BUILTIN["cpu"], str(path)) == table and _linear_choice(BUILTIN["cpu"], None) is None
    # a built-in H200 deployment without a calibration: its GPU's stated rule; False: none
    from specc.codegen.linear_choice import RowRule

    assert isinstance(_linear_choice(BUILTIN["h200-bs16"], None), RowRule)
    assert _linear_choice(BUILTIN["h200-bs16"], False) is None


@pytest.mark.parametrize("family", ["qwen3"], indirect=True)  # the choice is the family's own: one is enough
def test_first_and_second_compile_choose_alike(checkpoints, tmp_path):
    """An empty search memory: compile measures stock's acceptance at the largest drafts per step it
    sweeps before choosing k, so it chooses what the next compile (reading that measurement from
    the memory) chooses, not the method's default k priced at E = 1; the summary says which
    acceptance chose. The choice is the fastest configuration priced, trees included."""
    from specc.pairing import resolve_pair
    from specc.search.choose import choose_pipeline
    from specc.search.defaults import default_num_draft, k_choices
    from specc.search.memory import Memory

    target, drafter = checkpoints["target"], checkpoints["pard_same"]
    memory = tmp_path / "memory"
    first = compile_artifact(target, drafter, out=tmp_path / "a.specc", max_new_tokens=8, memory=str(memory))
    second = compile_artifact(target, drafter, out=tmp_path / "b.specc", max_new_tokens=8, memory=str(memory))
    none = compile_artifact(target, drafter, out=tmp_path / "c.specc", max_new_tokens=8, memory=False)
    m1, m2, m3 = first.manifest, second.manifest, none.manifest
    for m in (m2, m3):
        assert (m["num_draft"], m["passes"]["pipeline"], m["tree"]["budget"]) == \
            (m1["num_draft"], m1["passes"]["pipeline"], m1["tree"]["budget"])
        assert m["prediction"]["tokens_per_s"] == m1["prediction"]["tokens_per_s"]
    pair = resolve_pair(target, drafter)
    default_k, k_max = default_num_draft(pair), max(k_choices(pair, default_num_draft(pair)))
    assert "measured for this choice" in m1["prediction"]["choice_acceptance"]
    assert f"k={k_max}" in m1["prediction"]["choice_acceptance"]
    assert "(search memory)" in m2["prediction"]["choice_acceptance"]
    assert any("chosen with acceptance measured by stock" in line for line in first.summary_lines)
    mem = Memory.open("qwen3", "cpu", memory)
    assert mem.find_acceptance(pair.target.name, pair.drafter.name, pair.method).measured_k == k_max
    # the k chosen is the fastest priced with that acceptance, and faster than the default k
    # (the drafter is the target: only its first draft is right, so more drafts only cost)
    choice = choose_pipeline(pair, "cpu", str(memory))
    priced = [c["tokens_per_s"] for c in choice.prediction["candidates"] if "tokens_per_s" in c]
    assert choice.num_draft == m1["num_draft"] and choice.prediction["tokens_per_s"] == max(priced)
    at_default = choose_pipeline(pair, "cpu", str(memory), num_draft=default_k).prediction["tokens_per_s"]
    assert m1["num_draft"] != default_k and choice.prediction["tokens_per_s"] > at_default
    chosen = next(r for r in m1["tree"]["candidates"] if r["budget"] == m1["tree"]["budget"])
    assert chosen["tokens_per_s"] == max(r["tokens_per_s"] for r in m1["tree"]["candidates"])


def test_drafter_passes_give_the_drafter_its_own_pipeline(checkpoints, tmp_path, capsys):
    """--drafter-passes: 12-bit weights for the target only. The drafter's step is built (and
    priced) with its own pipeline, the manifest records both, and token forcing still passes."""
    dep = tmp_path / "cpu-bf16.json"
    dep.write_text(json.dumps({"base": "cpu", "name": "cpu-bf16", "dtype": "bfloat16"}))
    bf16 = "fuse_qkv,fuse_gate_up,fuse_norm_linear,dce"
    packed = "fuse_qkv,fuse_gate_up,fuse_norm_linear,pack_weights_12bit,dce"
    out = tmp_path / "own.specc"
    assert main(["compile", checkpoints["target"], "--drafter", checkpoints["dflash"], "-o", str(out),
                 "--deployment", str(dep), "--verify-tokens", "8", "--passes", packed, "--drafter-passes", bf16,
                 "--memory", str(tmp_path / "memory")]) == 0
    assert "token forcing PASS" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["passes"]["pipeline"] == packed and manifest["passes"]["drafter_pipeline"] == bf16
    applied = {role: {r["name"] for r in recs if r["changed"]} for role, recs in manifest["passes"]["applied"].items()}
    assert "pack_weights_12bit" in applied["target"] and "pack_weights_12bit" not in applied["drafter"]
    assert manifest["lowering"]["target"]["lowered"].get("packed_linear", 0) > 0
    assert "packed_linear" not in manifest["lowering"]["drafter"]["lowered"]
    assert manifest["step_costs"]["drafter"]["weight_bytes"] > 0
    assert load(out).generate(PROMPT, 8, eos_token_id=()).tokens  # loads and runs

    # without it the drafter gets the target's pipeline, recorded as such
    same = compile_artifact(checkpoints["target"], checkpoints["dflash"], deployment=str(dep), out=tmp_path / "same",
                            passes=packed, max_new_tokens=4, memory=False)
    assert same.manifest["passes"]["drafter_pipeline"] == packed
    assert same.manifest["lowering"]["drafter"]["lowered"].get("packed_linear", 0) > 0
    assert same.manifest["step_costs"]["drafter"]["weight_bytes"] < manifest["step_costs"]["drafter"]["weight_bytes"]
    ar = compile_artifact(checkpoints["target"], out=tmp_path / "ar", max_new_tokens=4, memory=False)
    assert ar.manifest["passes"]["drafter_pipeline"] is None


def test_drafter_passes_bad_inputs_fail_before_loading(checkpoints, tmp_path, capsys):
    base = ["compile", checkpoints["target"], "-o", str(tmp_path / "x")]
    for extra, fragment in ((["--drafter", checkpoints["dflash"], "--drafter-passes", "no_such_pass"],
                             "--drafter-passes 'no_such_pass'"),
                            (["--drafter-passes", "dce"], "no drafter network")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1, (extra, err)
    assert not (tmp_path / "x").exists()
