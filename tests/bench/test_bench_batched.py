"""`specc bench --batch`: specc's systems at B > 1 through continuous batching, on CPU."""

import json

import pytest

from specc.bench.batched import stated_rates
from specc.cli import main
from specc.cli.bench_cmd import parse_batches
from specc.errors import UserError

QWEN3 = pytest.mark.parametrize("family", ["qwen3"], indirect=True)


def _bench(capsys, *argv) -> dict:
    assert main(["bench", *argv, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_replayed_batch_sweep_rows_predictions_and_plot(capsys, tmp_path):
    assert main(["bench", "--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-b16", "--acceptance", "tau:3",
                 "--device", "cpu", "--tokens", "10", "--prompts", "1", "--prompt-len", "8", "--batch", "1,3",
                 "--systems", "hf-eager,specc-ar,specc", "-o", str(tmp_path / "b")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert report["batches"] == [1, 3]
    rows = {(r["system"], r["batch"]): r for r in report["rows"] if not r.get("reference")}
    assert set(rows) == {("hf-eager", 1), ("specc-ar", 1), ("specc-dflash", 1), ("hf-eager", 3), ("specc-ar", 3),
                         ("specc-dflash", 3)}
    ar, spec = rows["specc-ar", 3], rows["specc-dflash", 3]
    hf = rows["hf-eager", 3]  # one left-padded HF generate of the three prompts
    assert hf["tokens"] == 30 and hf["steady_tokens_per_s"] > 0 and hf["padding"] == "left, masked"
    assert "same_tokens_as_hf_eager" not in hf
    # a mechanism chosen: the same loop in one level beside it, in the same run; else no second row
    reference = [r for r in report["rows"] if r.get("reference")]
    if spec["mechanism"] == "one level":
        assert not reference
    else:
        assert [(r["system"], r["batch"], r["mechanism"]) for r in reference] == [("specc-dflash", 3, "one level")]
        assert reference[0]["steady_tokens_per_s"] > 0 and reference[0]["prediction"]["option"] == "one level"
        assert f"specc-dflash (replay) [{spec['mechanism']}]" in printed
    for row in (ar, spec):
        assert row["tokens"] == 30 and len(row["prompt_lengths"]) == 3 and row["decode_steps"] > 0
        assert row["steady_tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0 and row["step_ms"] > 0
        assert row["prediction"]["tokens_per_s"] > 0 and row["prediction"]["what"] == "steady decode"
    assert len(set(ar["prompt_lengths"])) > 1  # rows at different positions
    assert ar["tokens_per_step"] == 1.0 and ar["prediction"]["expected_tokens_per_step"] == 1.0
    # the speculative row at B: the cost model's batching choice for B, named and explained
    assert spec["replay"] and spec["mechanism"] and "B=3" in spec["mechanism_source"]
    assert spec["prediction"]["option"] == spec["mechanism"] and spec["prediction"]["batch_size"] == 3
    assert spec["tau"] > 1 and len(spec["accepted_lengths"]) == sum(1 for _ in spec["accepted_lengths"])
    # speedups against specc-ar at the same batch size, never against batch 1's AR
    assert spec["speedup_vs_best_ar"] == pytest.approx(spec["tokens_per_s"] / max(ar["tokens_per_s"],
                                                                                  hf["tokens_per_s"]))
    assert spec["steady_speedup_vs_ar"] == pytest.approx(spec["steady_tokens_per_s"] / ar["steady_tokens_per_s"])
    assert rows["specc-dflash", 1]["speedup_vs_best_ar"] == pytest.approx(
        rows["specc-dflash", 1]["tokens_per_s"] / max(rows["hf-eager", 1]["tokens_per_s"],
                                                      rows["specc-ar", 1]["tokens_per_s"]))
    assert "specc-dflash at B = 3:" in printed and "steady tok/s" in printed
    assert (tmp_path / "b" / "tokens_per_s_vs_batch.png").read_bytes()[:4] == b"\x89PNG"


@QWEN3
def test_real_acceptance_batched_rows_equal_batched_ar(checkpoints, capsys):
    """The target decides: every request's tokens in the speculative batch are batched AR's."""
    report = _bench(capsys, checkpoints["target"], "--drafter", checkpoints["pard_same"], "--device", "cpu",
                    "--tokens", "8", "--batch", "2", "--systems", "hf-eager,specc-ar,specc")
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"hf-eager", "specc-ar", "specc-pard"}  # hf-compiled and stock: batch 1 only
    spec = rows["specc-pard"]
    assert spec["batch"] == 2 and not spec["replay"] and spec["same_tokens_as_specc_ar"] is True
    assert spec["tau"] > 1 and spec["prediction"]["acceptance"] == "measured at B=2 in this run"


@QWEN3
def test_an_artifacts_two_level_choice_runs_as_compiled(checkpoints, tmp_path, capsys):
    from specc.compiler import compile_artifact

    deployment = tmp_path / "cpu-bs4.json"
    deployment.write_text(json.dumps({"base": "cpu", "name": "cpu-bs4", "batch_size": 4}))
    out = tmp_path / "two.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, deployment=str(deployment),
                     max_new_tokens=6, num_draft=3, two_level=2)
    capsys.readouterr()
    report = _bench(capsys, str(out), "--tokens", "8", "--batch", "3", "--systems", "specc-ar,specc")
    spec = next(r for r in report["rows"] if r["system"] == "specc-pard")
    assert spec["two_level_k1"] == 2 and spec["mechanism"] == "two-level k1=2"
    assert spec["mechanism_source"].startswith("the artifact's batching choice")
    assert spec["same_tokens_as_specc_ar"] is True and spec["prediction"]["two_level_k1"] == 2


def test_batch_sizes_parse_and_bad_ones_are_one_line_errors(capsys):
    assert parse_batches("16,1,4,16") == (1, 4, 16)
    for bad in ("0", "1,x", "", "-2"):
        with pytest.raises(UserError, match="--batch"):
            parse_batches(bad)
    assert main(["bench", "--shapes", "tiny-qwen3", "--acceptance", "tau:3", "--batch", "1,0"]) == 2
    assert "--batch" in capsys.readouterr().err
    assert main(["bench", "--shapes", "tiny-qwen3", "--acceptance", "tau:3", "--batch", "2", "--tree", "8"]) == 2
    assert "tree verification runs at batch 1" in capsys.readouterr().err


def test_stated_rates_scale_the_measured_step_and_skip_goodput_rules():
    """A batched replayed row of 4 rows at 10 ms a step: at E = 5 tokens per request-step,
    4 x 5 / 0.01 = 2000 steady tok/s; AR's steady 400 makes that 5x. A goodput rule drafts fewer
    than k, so E(k) is not its expectation: no figure."""
    row = {"batch": 4, "step_ms": 10.0, "tokens_per_step": 4.5}
    at = stated_rates(row, 5.0, {"steady_tokens_per_s": 400.0})
    assert at["steady_tokens_per_s"] == pytest.approx(2000.0) and at["steady_speedup_vs_ar"] == pytest.approx(5.0)
    assert at["drawn_tokens_per_step"] == 4.5
    assert stated_rates({**row, "draft_rule": True}, 5.0, None) is None


def test_hybrid_shapes_at_batch_1_and_2(capsys):
    """The hybrid target's shapes (gated DeltaNet + attention): HF's Qwen3.5 twin at batch 1, and
    the batched rows, verifying dense (a hybrid target has no ragged verify step)."""
    from specc.bench.shapes import target_config, target_names

    assert "qwen3.5-9b" in target_names() and target_config("qwen3.5-9b")["num_hidden_layers"] == 32
    report = _bench(capsys, "--shapes", "tiny-hybrid", "--drafter-shapes", "pard", "--acceptance", "tau:2",
                    "--device", "cpu", "--tokens", "6", "--prompts", "1", "--prompt-len", "8", "--batch", "1,2",
                    "--systems", "hf-eager,specc-ar,specc")
    rows = {(r["system"], r["batch"]): r for r in report["rows"] if not r.get("reference")}
    assert set(rows) == {("hf-eager", 1), ("specc-ar", 1), ("specc-pard", 1), ("hf-eager", 2), ("specc-ar", 2),
                         ("specc-pard", 2)}
    assert rows["specc-ar", 1]["same_tokens_as_hf_eager"] in (True, "tie")
    spec = rows["specc-pard", 2]
    assert spec["mechanism"] in ("one level", "goodput k, dense") and "no ragged verify step" in spec["mechanism_source"]
    assert spec["steady_tokens_per_s"] > 0 and spec["tokens"] == 12
