"""`specc compile` records the batching choice (manifest ``batching``) for a batch > 1 deployment,
the engine reads it back, and --two-level is checked with one-line errors."""

import json
from types import SimpleNamespace

import pytest

from specc.cli import main
from specc.codegen.artifact import ArtifactError
from specc import compiler
from specc.compiler import compile_artifact
from specc.models.decoder import CausalLM
from specc.runtime.engine import Engine, _batching, load
from specc.runtime.step_curve import StepCurve
from specc.search.batching_choice import MECHANISM_MARGIN

QWEN3 = pytest.mark.parametrize("family", ["qwen3"], indirect=True)  # one family is enough here


@pytest.fixture
def bs4(tmp_path):
    path = tmp_path / "cpu-bs4.json"
    path.write_text(json.dumps({"base": "cpu", "name": "cpu-bs4", "batch_size": 4}))
    return str(path)


@QWEN3
def test_the_manifest_records_the_choice_and_the_engine_reads_it(checkpoints, tmp_path, bs4, monkeypatch):
    assert compiler._verifies_ragged(CausalLM.__new__(CausalLM), 3)  # dense targets get a target_ragged step
    out = tmp_path / "b.specc"
    result = compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, deployment=bs4,
                              max_new_tokens=8, num_draft=3)
    section = json.loads((out / "manifest.json").read_text())["batching"]
    assert section["batch_size"] == 4 and section["num_draft"] == 3 and "curve" in section
    assert section["acceptance_source"].startswith("measured by stock")
    options = [row["option"] for row in section["candidates"]]
    assert options == ["one level", "two-level k1=1", "two-level k1=2", "per-request k", "goodput k, dense"]
    best = max(row["tokens_per_s"] for row in section["candidates"])
    one = section["candidates"][0]["tokens_per_s"]
    chosen = next(row for row in section["candidates"] if row["option"] == section["chosen"])
    # the best option, or one level where no mechanism beats it by the margin
    if section["chosen"] == "one level":
        assert best <= one * MECHANISM_MARGIN * (1 + 1e-9)
    else:
        assert chosen["tokens_per_s"] >= best * (1 - 1e-9) and chosen["tokens_per_s"] > one * MECHANISM_MARGIN
    assert StepCurve.from_section(section["curve"]).step_seconds(4, 3) > 0
    assert any(line.startswith("batching: ") for line in result.summary_lines)
    engine = load(out)
    assert engine.batching == section and "target_ragged" in engine.manifest["steps"]
    assert engine.loop.two_level_k1 == section["two_level_k1"]
    rule = engine.default_draft_length()
    assert (rule is not None) == (section["per_request_k"] or section["goodput_k"])
    if section["per_request_k"]:
        assert rule.ragged_seconds is not None
    # whatever was chosen, the scheduler's default rule changes speed, never tokens
    prompts = [[5, 17, 33, 2, 8, 9, 41], [7, 3, 9, 11], [11, 4, 60, 2, 8, 31, 17, 5]]
    alone = [engine.generate(p, 10, eos_token_id=()).tokens for p in prompts]
    scheduler = engine.scheduler(capacity=3)
    rids = [scheduler.submit(p, 10, ()) for p in prompts]
    while not scheduler.idle:
        scheduler.step()
    assert [scheduler.take(r).tokens for r in rids] == alone

    given = compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=tmp_path / "g.specc",
                             deployment=bs4, max_new_tokens=6, num_draft=3, two_level=2)
    assert given.manifest["batching"]["two_level_k1"] == 2 and given.manifest["batching"]["source"].startswith("given")


@QWEN3
def test_without_a_ragged_step_one_level_is_recorded_with_the_predictions(checkpoints, tmp_path, bs4, monkeypatch):
    monkeypatch.setattr(compiler, "_verifies_ragged", lambda target, k: False)
    result = compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=tmp_path / "u.specc",
                              deployment=bs4, max_new_tokens=6, num_draft=3)
    section = result.manifest["batching"]
    assert section["two_level_k1"] is None and not section["per_request_k"] and "no ragged verify" in section["source"]
    assert len(section["candidates"]) == 5 and section["chosen"] in ("one level", "goodput k, dense")
    assert section["goodput_k"] == (section["chosen"] == "goodput k, dense")


@QWEN3
def test_batch_one_records_one_level_and_why(checkpoints, tmp_path):
    result = compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=tmp_path / "one.specc",
                              max_new_tokens=6, num_draft=3)
    section = result.manifest["batching"]
    assert section["two_level_k1"] is None and section["per_request_k"] is False
    assert "batch size 1" in section["source"]
    assert load(tmp_path / "one.specc").default_draft_length() is None


@QWEN3
def test_two_level_flag_errors(checkpoints, tmp_path, bs4, capsys, monkeypatch):
    monkeypatch.setattr(compiler, "_verifies_ragged", lambda target, k: False)
    base = ["compile", checkpoints["target"], "--drafter", checkpoints["pard_same"], "-o", str(tmp_path / "x"),
            "--num-draft", "3"]
    cases = [(["--two-level", "0"], "K1 >= 1"), (["--two-level", "many"], "auto, off or"),
             (["--two-level", "3"], "1 <= K1 < k = 3"), (["--two-level", "9"], "1 <= K1 < k = 3"),
             (["--two-level", "1"], "batch size 1"),
             (["--two-level", "1", "--deployment", bs4], "no ragged verify")]
    for extra, message in cases:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_engine_batching_section_checks_and_default_rule():
    curve = {"rows": [1, 4], "tokens_per_row": [1, 2, 3, 4], "seconds": [[1e-3, 2e-3, 3e-3, 4e-3]] * 2}
    assert _batching("a", {}, 3) == {}
    for bad in ({"two_level_k1": 3}, {"two_level_k1": 0}, {"per_request_k": "yes"}, {"curve": {"rows": []}}, [1]):
        with pytest.raises(ArtifactError, match="batching"):
            _batching("a", {"batching": bad}, 3)
    section = _batching("a", {"batching": {"two_level_k1": None, "per_request_k": True, "curve": curve}}, 3)
    rule = Engine.default_draft_length(SimpleNamespace(batching=section, num_draft=3))
    assert rule.k_max == 3 and rule.step_seconds(4, 3) == pytest.approx(4e-3)
    assert Engine.default_draft_length(SimpleNamespace(batching={**section, "per_request_k": False}, num_draft=3)) is None
    one_k = Engine.default_draft_length(SimpleNamespace(batching={**section, "per_request_k": False, "goodput_k": True},
                                                        num_draft=3))
    assert one_k.k_max == 3 and getattr(one_k, "ragged_seconds", None) is None
    with pytest.raises(ArtifactError, match="batching"):
        _batching("a", {"batching": {"goodput_k": 1}}, 3)
