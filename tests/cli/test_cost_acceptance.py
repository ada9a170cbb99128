"""`specc cost` predicts with the same acceptance as `specc compile` for the same pair, and says which."""

import json

from specc.cli import main
from specc.compiler import compile_artifact


def _cost(capsys, *argv):
    assert main(["cost", *argv]) == 0
    return capsys.readouterr().out


def test_cost_uses_the_acceptance_compile_measured(checkpoints, tmp_path, capsys):
    target, drafter = str(checkpoints["target"]), str(checkpoints["pard_same"])
    memory = str(tmp_path / "memory")
    before = json.loads(_cost(capsys, target, "--drafter", drafter, "--memory", memory, "--json"))
    assert before["acceptance_kind"] == "unknown" and before["expected_tokens_per_step"] == 1.0
    assert "unknown" in _cost(capsys, target, "--drafter", drafter, "--memory", memory)
    result = compile_artifact(target, drafter, out=tmp_path / "a.specc", max_new_tokens=8, memory=memory)
    compiled = result.manifest["prediction"]
    after = json.loads(_cost(capsys, target, "--drafter", drafter, "--memory", memory, "--num-draft",
                             str(result.manifest["num_draft"]), "--json"))
    assert after["acceptance_kind"] == "measured" and "measured by stock" in after["acceptance_source"]
    assert after["expected_tokens_per_step"] == compiled["expected_tokens_per_step"]
    assert after["tokens_per_s"] == compiled["tokens_per_s"] and after["speedup"] == compiled["speedup"]
    text = _cost(capsys, target, "--drafter", drafter, "--memory", memory, "--tau", "2.0")
    assert "acceptance (stated)" in text and "holds a measured one" in text
    text = _cost(capsys, target, "--memory", memory)  # AR: no acceptance line
    assert "acceptance" not in text.split("passes:")[1].split("\n")[1]
