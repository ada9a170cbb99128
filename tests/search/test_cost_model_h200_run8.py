"""The cost model against the H200's run 8 (docs/benchmarks/h200-run8.md): compiled Qwen3-8B
verify steps at B = 8 / 16 / 32 x Q = 1 / 4 / 8 / 16, context 1024, after the attention kernel's
batched plan rule, with the linears Triton everywhere ("off"), with the per-shape Triton / cuBLAS
choice ("on"), and the choice with the attention's bs1 plan rule at every batch
("on-bs1-attention", the rule before: what the pricing would miss). Each is priced here by this
code from the calibration record measured in the same run (examples/bench_linears.py wrote both
files).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specc.codegen.linear_choice import LinearChoice
from specc.search.calibrate import Calibration
from specc.search.cost_model import CostModel
from specc.search.deployments import get_deployment

# measured before run 28 (residual-norm pairs, drafting ahead at batch): priced as they ran (tests/search/conftest.py)
pytestmark = pytest.mark.usefixtures("as_measured_before_run28")

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
RUN8 = json.loads((BENCH / "linears-h200-run8.json").read_text())
RECORD = Calibration.from_json(json.loads((BENCH / "linears-h200-run8.deployment.calibration.json").read_text()))
GOAL = 0.10  # issue 21: the calibrated model within 10% of every measured step


@pytest.fixture(scope="module")
def target_ir():
    from real_configs import QWEN3_8B

    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.search.meta_pair import MetaPair

    return MetaPair(QWEN3_8B, None, "ar", "bfloat16").irs(DEFAULT_PIPELINE)[0]


def priced_errors(target_ir) -> dict[tuple[str, int, int], float]:
    dep = get_deployment(str(BENCH / "linears-h200-run8.deployment.json"))
    choice = RUN8["linear_choice"]
    triton = LinearChoice.from_json(choice).with_impl("triton").to_json()
    out = {}
    for s in RUN8["steps"]:
        label = s["linear_choice"]
        record = dataclasses.replace(RECORD, linear_choice=triton if label == "off" else choice)
        pred = CostModel(dep, graphs=True, calibration=record).step(
            target_ir, {"B": s["B"], "Q": s["Q"], "C": s["C"]}, sync=False)
        out[(label, s["B"], s["Q"])] = pred.time * 1e3 / s["measured_ms"] - 1
    return out


def test_the_record_prices_attention_by_its_bytes():
    """The run's attention calibration ran the batched plan, which no longer splits at the
    calibrated batched shapes: no merge work to fit, so the record prices attention by the IR's
    K/V bytes at a fitted bandwidth (``merge_slot_s`` absent), as the kernel now runs it."""
    attention = RECORD.kind_efficiency["attention"]
    assert "merge_slot_s" not in attention and 0.5 < attention["bandwidth"] <= 1.0


def test_every_run8_step_is_within_ten_percent(target_ir):
    """24 steps: linear choice on and off, the attention plan the kernel picks today."""
    errors = {k: e for k, e in priced_errors(target_ir).items() if k[0] in ("on", "off")}
    assert len(errors) == 24
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) < GOAL, f"{worst}: {errors[worst]:+.1%}"


def test_the_old_plan_is_what_the_check_would_miss(target_ir):
    """The check above can fail: the same steps run with the bs1 plan rule (4 / 3 KV splits and a
    separate merge at B = 16 / 32, Q = 16) cost more than this record prices (it has no split-KV
    terms): under-predicted by more than 10% there, as run 6's large steps were before the
    split-KV terms."""
    errors = priced_errors(target_ir)
    assert errors[("on-bs1-attention", 32, 16)] < -GOAL and errors[("on-bs1-attention", 16, 16)] < -GOAL
    assert abs(errors[("on", 32, 16)]) < GOAL and abs(errors[("on", 16, 16)]) < GOAL
