"""The cost model against measured H200 steps (Qwen3-8B shapes, random bf16 weights).

- docs/benchmarks/linears-h200-run6.json (examples/bench_linears.py): compiled verify steps at
  B = 8, 16, 32 x Q = 1, 4, 8, 16, context 1024, Triton linears only ("off") and with the per-shape
  Triton / cuBLAS choice ("on"), each beside the calibrated cost model's prediction of that run;
- docs/benchmarks/linears-h200.calibration.json: the full calibration record of the same benchmark
  on the same GPU earlier that day (run 6 kept only its linear choice), whose raw measurements
  (the attention sweep, the linears) are refitted here with this code's fit;
- docs/benchmarks/tree-loop-h200-run6.json (examples/profile_tree.py --loop): a Qwen3-8B step's
  Triton linears at 64 rows and at 65 rows (two 64-row tiles).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specc.codegen.linear_choice import LinearChoice
from specc.search.calibrate import Calibration, fit
from specc.search.cost_model import CostModel
from specc.search.deployments import get_deployment

# measured before run 28 (residual-norm pairs, drafting ahead at batch): priced as they ran (tests/search/conftest.py)
pytestmark = pytest.mark.usefixtures("as_measured_before_run28")

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
RUN6 = json.loads((BENCH / "linears-h200-run6.json").read_text())
RECORD = Calibration.from_json(json.loads((BENCH / "linears-h200.calibration.json").read_text()))
TREE_LOOP = json.loads((BENCH / "tree-loop-h200-run6.json").read_text())
GOAL = 0.10  # issue 21: the calibrated model within 10% of every measured step


@pytest.fixture(autouse=True)
def _run6_attention_plan():
    """Run 6 (and the calibration record) ran the attention kernel's bs1 plan rule at every batch:
    the batched rule (``attention.batched_plan``, from the batched sweep of run 8) came later, so
    these measurements are priced with the plan they ran."""
    from specc.codegen.kernels.attention import bs1_plan_rule

    with bs1_plan_rule():
        yield


@pytest.fixture(scope="module")
def target_ir():
    """The Qwen3-8B target step with the compile pipeline, traced on the meta device."""
    from real_configs import QWEN3_8B

    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.search.meta_pair import MetaPair

    return MetaPair(QWEN3_8B, None, "ar", "bfloat16").irs(DEFAULT_PIPELINE)[0]


def refitted(base: str = "h200-bs16") -> tuple:
    """(deployment, record): the record's measurements fitted by this code, with run 6's choice."""
    dep = get_deployment(base)
    fields, kinds, by_m, bw_by_m = fit(dep, RECORD.measurements, "cuda")
    record = dataclasses.replace(RECORD, kind_efficiency=kinds, linear_flops_by_m=by_m, linear_bandwidth_by_m=bw_by_m,
                                 linear_choice=RUN6["linear_choice"], linear_tiles=True)
    return dataclasses.replace(dep, calibrated=True, **fields), record


def models(dep, record) -> dict[str, CostModel]:
    """"on": the measured choice; "off": Triton at every measured shape (as bench_linears prices them)."""
    triton = LinearChoice.from_json(RUN6["linear_choice"]).with_impl("triton").to_json()
    return {"on": CostModel(dep, graphs=True, calibration=record),
            "off": CostModel(dep, graphs=True, calibration=dataclasses.replace(record, linear_choice=triton))}


def step_errors(target_ir, priced: dict[str, CostModel]) -> list[tuple[str, int, int, float]]:
    out = []
    for s in RUN6["steps"]:
        pred = priced[s["linear_choice"]].step(target_ir, {"B": s["B"], "Q": s["Q"], "C": s["C"]}, sync=False)
        out.append((s["linear_choice"], s["B"], s["Q"], pred.time * 1e3 / s["measured_ms"] - 1))
    return out


def test_the_fit_has_the_split_kv_terms():
    _, record = refitted()
    attention = record.kind_efficiency["attention"]
    assert set(attention) == {"bandwidth", "latency_s", "flops", "merge_slot_s"}
    # a merge program loads its slots in well under a microsecond; the line's intercept stays a
    # few microseconds and the K/V stream most of HBM
    assert 1e-11 < attention["merge_slot_s"] < 1e-8
    assert 1e-6 < attention["latency_s"] < 2e-5 and 0.5 < attention["bandwidth"] <= 1.0
    # a record saved with it loads back
    assert Calibration.from_json(json.loads(json.dumps(record.to_json()))).kind_efficiency == record.kind_efficiency


def test_every_measured_verify_step_is_within_ten_percent(target_ir):
    """B = 8 / 16 / 32 x Q = 1 / 4 / 8 / 16, linear choice on and off: 24 measured steps."""
    errors = step_errors(target_ir, models(*refitted()))
    assert len(errors) == 24
    worst = max(errors, key=lambda e: abs(e[3]))
    assert abs(worst[3]) < GOAL, f"{worst[0]} B={worst[1]} Q={worst[2]}: {worst[3]:+.1%}"


def test_the_record_as_fitted_before_misses_the_large_steps(target_ir):
    """The check above can fail: the same record with its attention priced by the IR's K/V bytes
    only (as fitted before the split-KV terms) under-predicts the choice-on steps at B x Q >= 256
    by more than 10% (run 6 recorded -10.9%, -15.5%, -12.0% for B=16 Q=16, B=32 Q=8, B=32 Q=16)."""
    dep = dataclasses.replace(get_deployment("h200-bs16"), calibrated=True, **RECORD.fitted)
    old = dataclasses.replace(RECORD, linear_choice=RUN6["linear_choice"])
    assert "merge_slot_s" not in old.kind_efficiency["attention"]
    errors = {(b, q): e for choice, b, q, e in step_errors(target_ir, models(dep, old)) if choice == "on"}
    assert errors[(32, 8)] < -GOAL and errors[(32, 16)] < -GOAL
    new = {(b, q): e for choice, b, q, e in step_errors(target_ir, models(*refitted())) if choice == "on"}
    assert all(abs(new[k]) < abs(errors[k]) for k in ((16, 16), (32, 8), (32, 16)))


def test_attention_and_the_norm_kernels_are_priced_closer_to_the_profile(target_ir):
    """Run 6 profiled B=16 Q=16 and B=32 Q=8 by kernel: the split + merge kernels took 1962 and
    2815 us per step (+ ~190 us of the rope / cache-write kernel the rope_attention node also
    runs), where the model said 1096 / 1349 us of work (+ 390 us of fitted latency). Now the
    attention nodes (work, latency and merge) come within 25%."""
    dep, record = refitted()
    model = models(dep, record)["on"]
    for prof in RUN6["profiles"]:
        rope = sum(k["us_per_step"] for k in prof["top_kernels"] if "rope" in k["kernel"])
        measured = prof["measured_us"]["attention"] + rope
        pred = model.step(target_ir, {"B": prof["B"], "Q": prof["Q"], "C": 1024}, sync=False)
        attention = sum(n.time - n.launches * model.overhead for n in pred.nodes if "attention" in n.kind) * 1e6
        assert abs(attention / measured - 1) < 0.25, (prof["B"], prof["Q"], attention, measured)
        # the rms_norm kernels of multi-row norm_linears move 2 x M x K x 2 bytes each
        norms = [n for n in pred.nodes if n.kind == "norm_linear"]
        assert all(n.t_launch > n.launches * model.overhead for n in norms)


@pytest.mark.parametrize("priced", ["built-in", "calibrated (Triton times)"])
def test_65_rows_cost_two_64_row_tiles(target_ir, priced):
    """A tree of 64 nodes verifies 65 rows: two 64-row tiles, the weights read twice. Measured on
    the H200 (Qwen3-8B step, Triton linears): 11.65 ms of linears at 65 rows against 5.82 at 64
    (2.0x); the model's linears must scale the same way (within 10%)."""
    budgets = {b["rows"]: b["linears"] for b in TREE_LOOP["budgets"]}
    measured = budgets[65]["65"]["two_tile_us_per_step"] / budgets[65]["64"]["us_per_step"]
    assert 1.9 < measured < 2.1
    if priced == "built-in":
        model = CostModel("h200-bs1")
        model.linear_choice = None  # measured with Triton linears (the stated rule sends 65+ rows to cuBLAS)
    else:
        dep, record = refitted("h200-bs1")
        model = models(dep, record)["off"]

    def linears(rows):
        pred = model.step(target_ir, {"B": 1, "Q": rows, "C": 1024}, sync=False)
        return sum(n.time for n in pred.nodes if "linear" in n.kind)

    ratio = linears(65) / linears(64)
    assert abs(ratio / measured - 1) < GOAL, ratio
    # within one tile the rows cost about the same
    assert linears(64) / linears(33) < 1.1
