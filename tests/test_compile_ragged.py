"""`specc compile` of a drafting method over a CausalLM target adds the ragged verify step (role
``target_ragged``): token-forced against stock on its own, stored with the target's weights
(not a second copy), and kept through save and load with ``ragged_rows``."""

from __future__ import annotations

import inspect
import json

from specc.compiler import compile_artifact
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.engine import load
from specc.verify import StockRun, force_ragged


def test_compile_adds_a_forced_ragged_step_that_round_trips(checkpoints, tmp_path):
    out = tmp_path / "r.specc"
    result = compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=8,
                              tree="off", memory=False)
    m = json.loads((out / "manifest.json").read_text())
    step = m["steps"]["target_ragged"]
    assert step["class"] == "RaggedTargetStep" and step["inputs"][-2:] == ["row_slots", "row_starts"]
    assert step["caches"] == m["steps"]["target"]["caches"]  # the target's decoding state
    ragged = m["verification"]["ragged"]
    assert ragged["passed"] and ragged["positions"] == m["verification"]["positions"]
    assert any(line.startswith("ragged verify step: token forcing PASS") for line in result.summary_lines)
    # fused weights equal to the target step's are stored once
    assert not [key for key in step["weights"].values() if key.startswith("target_ragged.")]
    assert m["step_costs"]["target_ragged"]["bytes_read"] > 0

    engine = load(out)
    ragged_step = engine.steps["target_ragged"]
    assert ragged_step.ragged_rows is True and not getattr(engine.steps["target"], "ragged_rows", False)
    if "ragged_target" in inspect.signature(DeviceSpeculativeDecoder).parameters:  # a loop that packs verifies
        assert engine.loop.ragged_target is ragged_step
    # after the round trip the loaded ragged step still forces stock's tokens (rows of 0..k+1)
    runs = []
    for prompt, n in (([5, 17, 33, 2], 8), ([9, 1], 5)):
        tokens = engine.generate(prompt, n, eos_token_id=()).tokens
        runs.append(StockRun(prompt, tokens, [float("inf")] * len(tokens)))  # no position is a tie
    report = force_ragged(engine.steps["target"], ragged_step, runs, 1e-3, engine.num_draft + 1)
    assert report.passed, report.summary()


def test_no_ragged_step_without_drafts(checkpoints, tmp_path):
    if "qwen3" not in checkpoints["target"]:
        return  # one family is enough for the role choice
    out = tmp_path / "ar.specc"
    compile_artifact(checkpoints["target"], out=out, max_new_tokens=4, memory=False)
    m = json.loads((out / "manifest.json").read_text())
    assert set(m["steps"]) == {"target"} and "ragged" not in m["verification"]
