"""`specc generate` on a hybrid (Qwen3.5-style) target: eager and stock engines, with a PARD
drafter and a tree, give HF's greedy output; `specc compile` refuses it in one line."""

import json

import pytest
from helpers import hf_greedy, hf_model
from hybrid_factory import bigram_drafter, make_hybrid
from model_factory import save

from specc.cli import main

PROMPT = [5, 17, 33, 2, 61, 40]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    target = make_hybrid("qwen3_5", 0)
    return {"target": save(target, tmp_path_factory, "cli-hy"),
            "pard": save(bigram_drafter(target), tmp_path_factory, "cli-hy-pard", {"pard_token": 3})}


@pytest.mark.parametrize("extra", [["--engine", "eager"], ["--engine", "stock"], ["--drafter", "pard", "--engine", "eager"],
                                   ["--drafter", "pard", "--engine", "stock"], ["--drafter", "pard", "--tree", "6"]])
def test_generate_equals_hf_greedy(paths, capsys, extra):
    argv = ["generate", paths["target"], "--input-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "10", "--json"]
    argv += [paths[a] if a in paths else a for a in extra]
    assert main(argv) == 0
    tokens = json.loads(capsys.readouterr().out)["tokens"]
    model = hf_model(paths["target"])
    assert tokens == hf_greedy(model, PROMPT, 10, model.config.eos_token_id)


def test_compile_is_refused_in_one_line(paths, tmp_path, capsys):
    assert main(["compile", paths["target"], "-o", str(tmp_path / "hy.specc")]) == 2
    err = capsys.readouterr().err.strip()
    assert "hybrid recurrent target" in err and "docs/hybrid.md" in err and "\n" not in err


@pytest.mark.parametrize("argv", [["ir", "{target}"], ["ir", "{target}", "--config-only"]])
def test_ir_is_refused_in_one_line(paths, capsys, argv):
    assert main([a.format(**paths) for a in argv]) != 0
    err = capsys.readouterr().err.strip()
    assert "hybrid recurrent targets have no IR yet" in err and "\n" not in err


@pytest.mark.parametrize("method", [None, "ar-draft"])
def test_a_hybrid_drafter_is_refused_in_one_line(paths, capsys, method):
    argv = ["generate", "specc-tiny", "--drafter", paths["target"], "--input-ids", "1,2,3"]
    assert main(argv + (["--method", method] if method else [])) == 2
    err = capsys.readouterr().err.strip()
    assert "hybrid" in err and "\n" not in err and not err.endswith("use )")
