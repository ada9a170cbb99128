"""`specc cost --batching`: the options per batch size (one level, two-level k1 = 1..k-1,
per-request k) with step time and tokens/s, and the choice `specc compile` would record."""

import json

import pytest
from real_configs import QWEN3_8B, QWEN3_8B_DFLASH

from specc.cli import main
from specc.search.batching_choice import MECHANISM_MARGIN


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("q8")
    (root / "t.json").write_text(json.dumps(QWEN3_8B))
    (root / "d.json").write_text(json.dumps(QWEN3_8B_DFLASH))
    return str(root / "t.json"), str(root / "d.json")


def test_cost_prints_the_batching_table(configs, capsys):
    target, drafter = configs
    argv = ["cost", target, "--drafter", drafter, "--deployment", "h200-bs16", "--passes", "", "--num-draft", "7",
            "--tau", "4.5", "--batching", "1,16"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    table = text[text.index("batching options, k=7"):]
    for option in ["one level", "per-request k", "goodput k, dense"] + [f"two-level k1={k1}" for k1 in range(1, 7)]:
        assert table.count(option) >= 2, option  # one row per batch size
    assert "B=1: batch size 1" in table and "B=16: " in table and table.count(" <-") == 2
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)["batching"]
    assert [entry["batch_size"] for entry in out] == [1, 16]
    sixteen = out[1]
    assert len(sixteen["options"]) == 1 + 6 + 1 + 1 and sixteen["options"][-1]["option"] == "goodput k, dense"
    best = max(sixteen["options"][:-1], key=lambda row: row["tokens_per_s"])
    one = sixteen["options"][0]
    assert one["option"] == "one level"
    # the best option wins where it beats one level by the margin, else one level
    wins = best["tokens_per_s"] > one["tokens_per_s"] * MECHANISM_MARGIN
    assert sixteen["choice"]["chosen"] == (best["option"] if wins else "one level")
    assert all(row["step_s"] > 0 and row["tokens_per_s"] > 0 for row in sixteen["options"])


def test_cost_batching_errors(configs, capsys):
    target, drafter = configs
    for extra, message in ((["--drafter", drafter, "--batching", "0,4"], "1..4096"),
                           (["--drafter", drafter, "--batching", "a"], "separated by commas"),
                           (["--batching", "4"], "give a --drafter")):
        assert main(["cost", target, "--passes", "", "--deployment", "h200-bs16", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
