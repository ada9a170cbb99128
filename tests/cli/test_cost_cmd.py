"""`specc cost`'s deployment header (rates in units that fit them) and its KV-cache context:
the default capped at the models' positions (and said so), a larger --context refused."""

import json

from specc.cli import main


def _cost(capsys, *argv):
    code = main(["cost", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_header_rates_fit_the_deployment(capsys):
    code, out, _ = _cost(capsys, "specc-tiny", "--deployment", "cpu")
    assert code == 0
    header = out.splitlines()[0]
    assert header.startswith("cpu: cpu, 50.0 GB/s x ") and ", 200 GFLOP/s x " in header
    assert "TB/s" not in header and "TFLOP/s" not in header
    code, out, _ = _cost(capsys, "specc-tiny", "--deployment", "h200-bs1")
    assert code == 0
    assert out.splitlines()[0].startswith("h200-bs1: NVIDIA H200, 4.80 TB/s x 0.72, 989 TFLOP/s x 0.78, ")


def test_default_context_is_capped_at_the_models_positions(capsys):
    code, out, _ = _cost(capsys, "specc-tiny", "--deployment", "h200-bs1")  # 512 positions, default 1024
    assert code == 0
    assert "B=1, C=512 (default 1024, capped at the model's positions)" in out
    assert "gap report: ar on h200-bs1 (B=1, C=512)" in out
    code, out, _ = _cost(capsys, "specc-tiny", "--deployment", "h200-bs1", "--json")
    payload = json.loads(out)
    assert payload["context"] == 512 and "capped at the model's positions" in payload["context_note"]
    # a context the user gives is priced as given, and no note appears
    code, out, _ = _cost(capsys, "specc-tiny", "--deployment", "h200-bs1", "--context", "512")
    assert code == 0 and "B=1, C=512\n" in out and "capped" not in out
    code, out, _ = _cost(capsys, "specc-tiny", "--deployment", "h200-bs1", "--context", "100", "--json")
    assert json.loads(out)["context"] == 100 and "context_note" not in json.loads(out)


def test_context_beyond_the_positions_is_a_one_line_error(capsys):
    code, out, err = _cost(capsys, "specc-tiny", "--deployment", "cpu", "--context", "513")
    assert code == 2 and out == ""
    assert err.strip() == "specc: error: --context 513 exceeds the model's 512 positions (max_position_embeddings)"
    code, _, err = _cost(capsys, "specc-tiny", "--context", "-1")
    assert code == 2 and "--context must be >= 0" in err


def test_out_of_range_sizes_and_acceptance_without_a_drafter_are_refused(capsys):
    """A batch or tree budget below 1 is an error, not the deployment's default or no tree; an
    acceptance stated for a pair that drafts nothing is an error, not silently dropped."""
    for argv, fragment in ((["--batch", "0"], "--batch must be >= 1 (got 0)"),
                           (["--batch", "-2"], "--batch must be >= 1 (got -2)"),
                           (["--tau", "5"], "--tau states a drafter's acceptance, but method ar drafts nothing"),
                           (["--alpha", "0.5"], "--alpha states a drafter's acceptance"),
                           (["--drafter-shapes", "dflash-b16", "--tree", "0"], "--tree N needs N >= 1 (got 0)")):
        code, out, err = _cost(capsys, "--shapes", "tiny-qwen3", "--deployment", "h200-bs1", *argv)
        assert code == 2 and out == "" and fragment in err, (argv, err)
    code, out, _ = _cost(capsys, "--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-b16", "--deployment",
                         "h200-bs1", "--tau", "5", "--batch", "2")
    assert code == 0 and "B=2" in out and "acceptance (stated)" in out


def test_a_drafter_with_fewer_positions_caps_the_context(tmp_path, capsys):
    from specc.ir.trace import read_config

    raw, _ = read_config("specc-tiny-dflash")
    drafter = tmp_path / "config.json"
    drafter.write_text(json.dumps({**raw, "max_position_embeddings": 256}))
    argv = ["specc-tiny", "--drafter", str(drafter), "--deployment", "h200-bs1", "--tau", "3"]
    code, out, _ = _cost(capsys, *argv)
    assert code == 0 and "C=256 (default 1024, capped at the drafter's positions)" in out
    code, _, err = _cost(capsys, *argv, "--context", "300")
    assert code == 2 and "--context 300 exceeds the drafter's 256 positions" in err
    # a model with more positions than the default keeps the default
    target = tmp_path / "target" / "config.json"
    target.parent.mkdir()
    target.write_text(json.dumps({**read_config("specc-tiny")[0], "max_position_embeddings": 4096}))
    code, out, _ = _cost(capsys, str(target), "--deployment", "h200-bs1")
    assert code == 0 and "B=1, C=1024\n" in out


def test_named_shapes_price_without_a_checkpoint(capsys, tmp_path):
    """--shapes / --drafter-shapes (as `specc bench`): the same prediction as the config files."""
    from specc.bench.shapes import drafter_config, target_config

    code, out, _ = _cost(capsys, "--shapes", "qwen3-8b", "--drafter-shapes", "dflash-b16", "--deployment", "h200-bs1",
                         "--tau", "6.55", "--json")
    assert code == 0
    named = json.loads(out)
    assert named["method"] == "dflash" and named["num_draft"] == 15
    cfg_dir = tmp_path
    (cfg_dir / "t.json").write_text(json.dumps(target_config("qwen3-8b")))
    (cfg_dir / "d.json").write_text(json.dumps(drafter_config("qwen3-8b", "dflash-b16")[1]))
    code, out, _ = _cost(capsys, str(cfg_dir / "t.json"), "--drafter", str(cfg_dir / "d.json"),
                         "--deployment", "h200-bs1", "--tau", "6.55", "--json")
    files = json.loads(out)
    for key in ("step_s", "draft_s", "ar_step_s", "speedup"):
        assert named[key] == files[key], key
    code, out, _ = _cost(capsys, "--shapes", "qwen3-8b", "--deployment", "h200-bs1", "--json")  # AR only
    assert code == 0 and json.loads(out)["method"] == "ar"
    for argv, message in ((["--deployment", "cpu"], "give MODEL"),
                          (["specc-tiny", "--shapes", "qwen3-8b"], "not both"),
                          (["specc-tiny", "--drafter-shapes", "pard"], "goes with --shapes"),
                          (["--shapes", "nope"], "unknown --shapes")):
        code, _, err = _cost(capsys, *argv)
        assert code == 2 and message in err, argv


def test_cost_prices_packed_weights_traced_without_values(capsys):
    """`specc cost` traces on the meta device, so pack_weights_12bit packs weights that have no
    values: the planes get their exact sizes and the escapes an estimate (said in the stats), and
    the packed step is priced on ~0.75 of the weight bytes instead of failing."""
    default = "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,fuse_residual_add,dce"
    packed = default.replace("dce", "pack_weights_12bit,dce")
    steps = {}
    for passes in (default, packed):
        code, out, err = _cost(capsys, "specc-tiny", "--deployment", "h100-bs1", "--passes", passes, "--json")
        assert code == 0, err
        steps[passes] = json.loads(out)
    assert steps[packed]["pipeline"] == packed
    assert steps[packed]["ar_step_s"] != steps[default]["ar_step_s"]
