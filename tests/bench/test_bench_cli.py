"""`specc bench` on CPU: real acceptance on specc-tiny, replayed acceptance at tiny shapes, plots."""

import json

import pytest

from specc.bench.acceptance import parse_acceptance
from specc.cli import main
from specc.errors import UserError


def _bench(capsys, *argv):
    assert main(["bench", *argv]) == 0
    return capsys.readouterr()


def test_specc_tiny_real_acceptance(capsys):
    out = _bench(capsys, "specc-tiny", "--drafter", "specc-tiny-dflash", "--device", "cpu", "--tokens", "16",
                 "--prompts", "2", "--json", "-")
    report = json.loads(out.out)
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"hf-eager", "hf-compiled", "stock-dflash", "specc-ar", "specc-dflash"}
    assert "CUDA" in rows["hf-compiled"]["skipped"]
    assert report["acceptance"]["mode"] == "real"
    assert report["launch"] == "plain"  # programmatic dependent launch is a CUDA (sm_90+) thing
    assert report["residual_norm_pairs"] is True and report["batch_draft_ahead"] is False  # the defaults
    for name in ("hf-eager", "stock-dflash", "specc-ar", "specc-dflash"):
        assert rows[name]["tokens_per_s"] > 0 and rows[name]["tokens"] == 32
    for name in ("stock-dflash", "specc-ar", "specc-dflash"):  # lossless: the same tokens as HF generate
        assert rows[name]["same_tokens_as_hf_eager"] is True
    spec = rows["specc-dflash"]
    assert spec["tau"] > 1 and spec["accepted_lengths"] == rows["stock-dflash"]["accepted_lengths"]
    assert spec["prediction"]["tokens_per_s"] > 0 and spec["prediction"]["acceptance"] == "measured in this run"
    assert spec["time_to_first_token_s"] > 0 and spec["decode_tokens_per_s"] > 0
    assert rows["specc-ar"]["prediction"]["expected_tokens_per_step"] == 1.0


def test_shapes_with_replayed_acceptance_table_and_plots(capsys, tmp_path):
    out = _bench(capsys, "--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-b16", "--acceptance", "tau:6.5",
                 "--device", "cpu", "--tokens", "24", "--prompts", "1", "--prompt-len", "8",
                 "--systems", "hf-eager,specc-ar,specc", "-o", str(tmp_path / "b"))
    assert "REPLAYED" in out.out and "NOT the model's real output" in out.out and "specc-dflash (replay)" in out.out
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    spec = next(r for r in report["rows"] if r["system"] == "specc-dflash")
    assert spec["replay"] and spec["same_tokens_as_hf_eager"] is None
    assert abs(spec["expected_tokens_per_step"] - 6.5) < 1e-6 and report["acceptance"]["mode"] == "replay"
    assert spec["prediction"]["expected_tokens_per_step"] == pytest.approx(6.5)
    at = spec["at_stated_acceptance"]  # the measured step at E tokens instead of this run's draws
    assert at["tokens_per_step"] == pytest.approx(6.5) and at["drawn_tokens_per_step"] == spec["tau"]
    assert at["decode_tokens_per_s"] == pytest.approx(spec["decode_tokens_per_s"] * 6.5 / spec["tau"])
    # pred/meas compares the prediction (decode steps at the stated E) with that rate, the AR rows
    # with their decode rate; the first token's time is in neither
    from specc.bench.report import priced_rate

    assert priced_rate(spec) == at["decode_tokens_per_s"]
    ar = next(r for r in report["rows"] if r["system"] == "specc-ar")
    assert priced_rate(ar) == ar["decode_tokens_per_s"] != ar["tokens_per_s"]
    assert priced_rate({"batch": 4, "steady_tokens_per_s": 7.0, "decode_tokens_per_s": 5.0}) == 7.0
    best = max(r["decode_tokens_per_s"] for r in report["rows"] if r["system"] == report["best_ar"])
    assert at["decode_speedup_vs_best_ar"] == pytest.approx(at["decode_tokens_per_s"] / best)
    assert "at the stated E = 6.50 tokens/step" in out.out
    assert all("at_stated_acceptance" not in r for r in report["rows"] if not r.get("replay"))
    for png in ("tokens_per_s.png", "accepted_length.png"):
        assert (tmp_path / "b" / png).read_bytes()[:4] == b"\x89PNG"


def test_batch_plot_hook(tmp_path):
    from specc.bench.report import plot_batch_sweep

    rows = [{"system": "specc-ar", "batch": 1, "tokens_per_s": 9.0, "decode_tokens_per_s": 10.0},
            {"system": "specc-ar", "batch": 4, "tokens_per_s": 30.0, "steady_tokens_per_s": 40.0}]
    path = plot_batch_sweep({"rows": rows}, tmp_path)
    assert path.endswith("tokens_per_s_vs_batch.png") and open(path, "rb").read(4) == b"\x89PNG"
    assert plot_batch_sweep({"rows": rows[:1]}, tmp_path) is None  # one batch size: no sweep
    no_rates = [{k: v for k, v in r.items() if "tokens_per_s" not in k or k == "tokens_per_s"} for r in rows]
    assert plot_batch_sweep({"rows": no_rates}, tmp_path / "none") is None  # nothing to draw


def test_acceptance_specs():
    assert parse_acceptance("measured", 15) is None
    assert parse_acceptance("tau:6.5", 15).expected_tokens(15) == pytest.approx(6.5)
    assert parse_acceptance("tau:6.5@15", 7).measured_k == 15
    assert parse_acceptance("alpha:0.5", 3).expected_tokens(3) == pytest.approx(1.875)
    assert parse_acceptance("alphas:0.9,0.5", 2).expected_tokens(2) == pytest.approx(1 + 0.9 + 0.45)
    math = parse_acceptance("dflash-qwen3-8b:math500", 15)
    assert math.expected_tokens(15) == pytest.approx(7.87) and "DFlash" in math.source
    for bad in ("tau:x", "dflash-qwen3-8b:nope", "nonsense", "alpha:2"):
        with pytest.raises(UserError):
            parse_acceptance(bad, 15)


def test_shapes_need_a_stated_acceptance(capsys):
    assert main(["bench", "--shapes", "tiny-qwen3", "--tokens", "4", "--prompts", "1", "--systems", "specc"]) == 2
    assert "--acceptance" in capsys.readouterr().err


def test_bad_names_and_counts_stop_before_anything_is_built(capsys):
    for argv, fragment in ((["--shapes", "qwen3-9b"], "unknown --shapes 'qwen3-9b'"),
                           (["--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-x"], "unknown --drafter-shapes"),
                           (["--shapes", "tiny-qwen3", "--warmup", "-1"], "--warmup must be >= 0 (got -1)")):
        assert main(["bench", *argv, "--acceptance", "tau:3", "--tokens", "4", "--prompts", "1"]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "building" not in err, (argv, err)


def test_bench_an_artifact(checkpoints, tmp_path, capsys):
    from specc.compiler import compile_artifact

    out = tmp_path / "p.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=4)
    capsys.readouterr()
    report = json.loads(_bench(capsys, str(out), "--tokens", "8", "--prompts", "1", "--systems", "hf-eager,specc",
                               "--json", "-").out)
    rows = {r["system"]: r for r in report["rows"]}
    assert "artifact" in report["what"] and rows["specc-pard"]["same_tokens_as_hf_eager"] is True
    assert rows["specc-pard"]["prediction"]["tokens_per_s"] > 0


def test_at_stated_acceptance_scales_the_measured_step():
    """A replayed row drew 6.0 tokens a step at 600 decode tok/s (a 10 ms step): at the stated
    E = 6.5 the same step gives 650 tok/s; rows that are not replayed get nothing."""
    from specc.bench.run import at_stated_acceptance

    row = {"replay": True, "tau": 6.0, "expected_tokens_per_step": 6.5, "decode_tokens_per_s": 600.0}
    at = at_stated_acceptance(row, {"decode_tokens_per_s": 130.0})
    assert at["decode_step_s"] == pytest.approx(0.01) and at["decode_tokens_per_s"] == pytest.approx(650.0)
    assert at["decode_speedup_vs_best_ar"] == pytest.approx(5.0)
    assert "decode_speedup_vs_best_ar" not in at_stated_acceptance(row, None)
    assert at_stated_acceptance({**row, "replay": False}, None) is None
    assert at_stated_acceptance({"tau": 1.0, "decode_tokens_per_s": 100.0}, None) is None


def test_ar_passes_time_the_ar_under_another_pipeline_in_the_same_run(capsys):
    """--ar-passes adds a specc-ar row per pipeline (named by the passes it adds and drops), each
    equal to HF eager's tokens, counted among the AR rows the speculative row is compared with."""
    default = "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,fuse_residual_add,dce"
    out = _bench(capsys, "--shapes", "tiny-qwen3", "--drafter-shapes", "none", "--device", "cpu", "--tokens", "8",
                 "--prompts", "1", "--prompt-len", "8", "--systems", "hf-eager,specc-ar", "--passes", default,
                 "--ar-passes", "fuse_qkv,dce", "--ar-passes", "", "--json", "-")
    report = json.loads(out.out)
    rows = {r["system"]: r for r in report["rows"]}
    fewer = "specc-ar[-fuse_gate_up,-fuse_norm_linear,-fuse_rope_attention,-fuse_residual_add]"
    none = "specc-ar[-fuse_qkv,-fuse_gate_up,-fuse_norm_linear,-fuse_rope_attention,-fuse_residual_add,-dce]"
    assert set(rows) == {"hf-eager", "specc-ar", fewer, none}
    assert rows[fewer]["pipeline"] == "fuse_qkv,dce" and rows[none]["pipeline"] == ""
    for name in ("specc-ar", fewer, none):
        assert rows[name]["same_tokens_as_hf_eager"] is True and rows[name]["tokens"] == 8
        assert rows[name]["prediction"]["expected_tokens_per_step"] == 1.0
    # each row compiled its own pipeline (the cost model prices the IRs they left): fewer fusions, more launches
    steps = [rows[name]["prediction"]["step_s"] for name in ("specc-ar", fewer, none)]
    assert steps[0] < steps[1] < steps[2], steps
    assert set(rows["hf-eager"]["speedup_vs"]) == {"hf-eager", "specc-ar", fewer, none}
    fastest = max(rows.values(), key=lambda r: r["tokens_per_s"])["system"]
    assert report["best_ar"] == fastest


def test_ar_passes_at_the_stated_acceptance_and_in_the_table(capsys, tmp_path):
    """A packed run beside its bf16 AR: the speculative row's rate at the stated E is set beside
    every AR row's decode, and the table and the E line print the bracketed name as it is."""
    packed = "fuse_qkv,fuse_gate_up,pack_weights_12bit,dce"
    out = _bench(capsys, "--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-b16", "--acceptance", "tau:6.5",
                 "--device", "cpu", "--tokens", "16", "--prompts", "1", "--prompt-len", "8", "--systems",
                 "specc-ar,specc", "--passes", packed, "--ar-passes", "fuse_qkv,fuse_gate_up,dce",
                 "--json", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {r["system"]: r for r in report["rows"]}
    at = rows["specc-dflash"]["at_stated_acceptance"]
    assert set(at["decode_speedup_vs"]) == {"specc-ar", "specc-ar[-pack_weights_12bit]"}
    for name, x in at["decode_speedup_vs"].items():
        assert x == pytest.approx(at["decode_tokens_per_s"] / rows[name]["decode_tokens_per_s"])
    assert "specc-ar[-pack_weights_12bit]" in out.out  # in the table: not eaten as markup
    at_line = " ".join(out.out.split("at the stated E", 1)[1].split())
    other = next(n for n in at["decode_speedup_vs"] if n != report["best_ar"])  # the E line names the other one
    assert f"{at['decode_speedup_vs'][other]:.2f}x {other}'s" in at_line


def test_ar_row_names():
    from specc.bench.run import ar_row_name, is_ar_system

    assert ar_row_name("a,b,c", "a,c") == "specc-ar[-b]"
    assert ar_row_name("a,c", "a,b,c") == "specc-ar[+b]"
    assert ar_row_name("a,b", "b,a") == "specc-ar[order]"
    assert ar_row_name("a,b", "") == "specc-ar[-a,-b]"
    with pytest.raises(UserError, match="the run's own pipeline"):
        ar_row_name("a, b", "a,b")
    assert is_ar_system("specc-ar[-b]") and is_ar_system("hf-eager") and not is_ar_system("specc-dflash")


def test_bad_ar_passes_stop_before_anything_is_built(capsys):
    base = ["bench", "--shapes", "tiny-qwen3", "--drafter-shapes", "none", "--tokens", "4", "--prompts", "1"]
    for extra, fragment in ((["--ar-passes", "fuse_qkv,no_such_pass"], "--ar-passes 'fuse_qkv,no_such_pass'"),
                            (["--ar-passes", "dce", "--ar-passes", "dce"], "given twice"),
                            (["--ar-passes", "dce", "--batch", "4"], "include 1 in --batch")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "building" not in err, (extra, err)


def test_drafter_passes_give_the_drafter_its_own_pipeline(capsys):
    report = json.loads(_bench(capsys, "--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-b16", "--acceptance",
                               "tau:3", "--device", "cpu", "--tokens", "8", "--prompts", "1", "--prompt-len", "8",
                               "--systems", "specc", "--drafter-passes", "fuse_qkv,dce", "--json", "-").out)
    assert report["drafter_pipeline"] == "fuse_qkv,dce" and report["pipeline"] != report["drafter_pipeline"]
    assert next(r for r in report["rows"] if r["system"] == "specc-dflash")["tokens_per_s"] > 0
    base = ["bench", "--shapes", "tiny-qwen3", "--acceptance", "tau:3", "--tokens", "4", "--prompts", "1"]
    for extra, fragment in ((["--drafter-shapes", "none", "--drafter-passes", "dce"], "needs a drafter"),
                            (["--systems", "specc-ar", "--drafter-passes", "dce"], "needs a drafter"),
                            (["--drafter-passes", "no_such_pass"], "--drafter-passes 'no_such_pass'")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "building" not in err, (extra, err)
