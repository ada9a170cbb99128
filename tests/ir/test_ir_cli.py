"""`specc ir`: text and JSON output for every step, config-only real sizes, passes, errors."""

from __future__ import annotations

import json

import pytest

from specc.cli import main

from test_metadata import QWEN3_8B, QWEN3_8B_DFLASH, expected_weight_bytes_per_step


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_output_lists_nodes_and_totals(checkpoints, capsys):
    code, out, err = _run(capsys, "ir", checkpoints["target"], "--step", "verify", "--new-tokens", "5", "--context", "9")
    assert code == 0, err
    assert "specc IR:" in out and "step verify" in out
    for needle in ("layers_0_self_attn_q_proj", "linear", "attention", "[B, Q, 64]", "weights read",
                   "KV cache read", "total bytes moved", "at B=1, Q=5, C=9", "FLOPs"):
        assert needle in out, needle
    assert "B = batch rows" in out  # symbols are explained


def test_json_output_matches_the_ir(checkpoints, capsys):
    code, out, _ = _run(capsys, "ir", checkpoints["target"], "--step", "prefill", "--json", "-Q", "7", "-B", "2")
    assert code == 0
    d = json.loads(out)
    assert d["step"] == "prefill" and d["values"] == {"B": 2, "Q": 7, "C": 0}
    kinds = {n["kind"] for n in d["nodes"]}
    assert {"embedding", "linear", "attention", "rms_norm", "rope", "silu_mul", "input", "output"} <= kinds
    lm = next(n for n in d["nodes"] if n["name"] == "lm_head")
    assert lm["out"]["shape"] == ["B", "Q", "96"] and lm["flops"]["value"] == 2 * 14 * 64 * 96
    assert d["totals"]["bytes"]["value"] > d["totals"]["weight_bytes"]["value"] > 0


@pytest.mark.parametrize("drafter", ["dflash", "pard_same", "ar_random"])
def test_draft_step_of_each_drafter(checkpoints, capsys, drafter):
    code, out, err = _run(capsys, "ir", checkpoints["target"], "--drafter", checkpoints[drafter], "--step", "draft",
                          "--json")
    assert code == 0, err
    d = json.loads(out)
    if drafter == "dflash":
        assert d["model_kind"] == "dflash" and set(d["symbols"]) == {"B", "Q", "C", "N"}
        assert any(n["group"] == "dflash_context" for n in d["nodes"])
        assert d["nodes"][-1]["out"]["shape"] == ["B", "Q - 1", "96"]
    else:
        assert d["model_kind"] == "causal_lm" and "drafter" in d["title"]


def test_dflash_target_verify_captures_hidden(checkpoints, capsys):
    code, out, _ = _run(capsys, "ir", checkpoints["target"], "--drafter", checkpoints["dflash"], "--step", "verify",
                        "--json")
    assert code == 0
    out_node = json.loads(out)["nodes"][-1]
    assert len(out_node["out"]) == 2 and out_node["out"][1]["shape"] == ["B", "Q", "128"]  # 2 layers x 64


def test_config_only_real_size_totals(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_8B))
    code, out, err = _run(capsys, "ir", cfg, "--config-only", "--step", "ar", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["totals"]["weight_bytes"]["value"] == expected_weight_bytes_per_step(QWEN3_8B)
    code, out, _ = _run(capsys, "ir", cfg, "--config-only", "--step", "ar", "--totals")
    assert code == 0 and "15.14 GB" in out and "layers_0_self_attn_q_proj" not in out
    drafter = tmp_path / "dflash"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(QWEN3_8B_DFLASH))
    code, out, err = _run(capsys, "ir", cfg, "--config-only", "--drafter", drafter, "--step", "draft", "--brief")
    assert code == 0, err
    assert "dflash_context" in out and "at B=1, Q=16, C=1024, N=4" in out


def test_passes_and_dump(checkpoints, capsys, tmp_path):
    code, out, err = _run(capsys, "ir", checkpoints["target"], "--step", "ar", "--check", "--brief",
                          "--after", "fuse_qkv,fuse_gate_up,fuse_norm_linear,dce", "--dump-ir", tmp_path)
    assert code == 0, err
    assert "passes applied" in out and "groups=4" in out and "norm_linear" in out
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps == ["000-input.txt", "001-fuse_qkv.txt", "002-fuse_gate_up.txt", "003-fuse_norm_linear.txt",
                     "004-dce.txt"]
    assert "qkv_proj" in (tmp_path / "001-fuse_qkv.txt").read_text()


@pytest.mark.parametrize("argv,needle", [
    (["--step", "draft"], "--drafter"),
    (["--step", "ar", "--new-tokens", "4"], "one new token"),
    (["--after", "fuse_qvk"], "did you mean fuse_qkv"),
    (["--after", "+no_such_module_xyz:P"], "cannot import"),
    (["--batch", "0"], "--batch must be >= 1"),
])
def test_bad_input_is_one_line_exit_2(checkpoints, capsys, argv, needle):
    code, out, err = _run(capsys, "ir", checkpoints["target"], *argv)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_drafter_as_model_and_missing_checkpoint(checkpoints, capsys, tmp_path):
    code, _, err = _run(capsys, "ir", checkpoints["dflash"])
    assert code == 2 and "--drafter" in err
    code, _, err = _run(capsys, "ir", tmp_path / "nope")
    assert code == 2 and "nope" in err
