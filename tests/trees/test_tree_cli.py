"""`specc generate --tree N --json` (eager tree loop == HF greedy, tree stats) and `specc cost --tree N`."""

from __future__ import annotations

import json

import pytest
from helpers import PROMPT, hf_greedy, hf_model

from specc.cli import main

IDS = ",".join(map(str, PROMPT))


@pytest.mark.parametrize("drafter_key", ["pard_same", "dflash"])
def test_generate_tree_json(checkpoints, capsys, drafter_key):
    code = main(["generate", checkpoints["target"], "--drafter", checkpoints[drafter_key], "--input-ids", IDS,
                 "--max-new-tokens", "12", "--tree", "8", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    payload = json.loads(out)
    eos = hf_model(checkpoints["target"]).config.eos_token_id
    assert payload["tokens"] == hf_greedy(hf_model(checkpoints["target"]), PROMPT, 12, eos)
    assert set(payload["stats"]) >= {"accepted_lengths", "steps", "tau"}
    assert payload["tree"]["budget"] == 8 and payload["tree"]["nodes_per_step"]
    assert set(payload["tree"]["nodes_per_step"]) <= {9} | set(range(1, 9))


def test_generate_tree_refused_for_ar_drafter(checkpoints, capsys):
    code = main(["generate", checkpoints["target"], "--drafter", checkpoints["ar_same"], "--input-ids", IDS,
                 "--tree", "8"])
    assert code != 0 and "per-position" in capsys.readouterr().err


def test_cost_tree(checkpoints, capsys):
    code = main(["cost", checkpoints["target"], "--drafter", checkpoints["dflash"], "--tree", "16", "--tau", "3",
                 "--json"])
    assert code == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    assert [r["budget"] for r in tree["rows"]] == [0, 16] and tree["rows"][1]["verify_rows"] == 17
