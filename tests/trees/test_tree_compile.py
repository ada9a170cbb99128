"""`specc compile --tree`: the artifact carries a tree verify step, the manifest records the tree,
token forcing goes through the tree step, and `specc.load` runs tree decoding == HF greedy."""

from __future__ import annotations

import json

import pytest
from helpers import PROMPT, hf_greedy, hf_model

from specc.cli import main
from specc.compiler import compile_artifact
from specc.runtime.engine import load


@pytest.mark.parametrize("drafter_key", ["pard_same", "dflash"])
def test_compile_tree_n_runs_and_forces_through_tree(checkpoints, tmp_path, drafter_key):
    out = tmp_path / "tree.specc"
    result = compile_artifact(checkpoints["target"], checkpoints[drafter_key], out=out, max_new_tokens=10,
                              tree=6)
    m = json.loads((out / "manifest.json").read_text())
    assert m["tree"]["budget"] == 6 and m["tree"]["depth"] == m["num_draft"]
    assert "target_tree" in m["steps"] and m["steps"]["target_tree"]["inputs"][-1] == "tree_mask"
    assert m["verification"]["passed"]
    assert any("tree: 6 nodes" in line for line in result.summary_lines)
    engine = load(out)
    assert engine.loop.tree_budget == 6
    got = engine.generate(PROMPT, 16, eos_token_id=())
    assert got.tokens == hf_greedy(hf_model(checkpoints["target"]), PROMPT, 16)
    assert got.stats.tree_nodes and set(got.stats.tree_nodes) == {7}
    # forcing through the tree step equals forcing through the chain step
    tokens = got.tokens
    chain = load(out)
    chain.loop.tree_budget = 0
    assert engine.forced_argmax(PROMPT, tokens) == chain.forced_argmax(PROMPT, tokens)


def test_compile_tree_auto_and_off(checkpoints, tmp_path, capsys):
    if "qwen3" not in checkpoints["target"]:
        return  # one family is enough for the option plumbing
    out = tmp_path / "auto.specc"
    assert main(["compile", checkpoints["target"], "--drafter", checkpoints["pard_same"], "-o", str(out),
                 "--verify-tokens", "8", "--tree", "auto"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["tree"]["acceptance_source"].startswith("measured")
    assert m["tree"]["candidates"][0]["budget"] == 0 and len(m["tree"]["candidates"]) > 1
    assert ("target_tree" in m["steps"]) == (m["tree"]["budget"] > 0)
    off = tmp_path / "off.specc"
    assert main(["compile", checkpoints["target"], "--drafter", checkpoints["pard_same"], "-o", str(off),
                 "--verify-tokens", "8", "--tree", "off"]) == 0
    m = json.loads((off / "manifest.json").read_text())
    assert m["tree"]["budget"] == 0 and "target_tree" not in m["steps"]
    capsys.readouterr()
    assert main(["compile", checkpoints["target"], "-o", str(tmp_path / "ar.specc"), "--verify-tokens", "4",
                 "--tree", "8"]) != 0
