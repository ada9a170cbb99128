"""The per-shape Triton / cuBLAS table: choices from measurements, row ranges, interpolated times,
JSON round trip and the errors of a malformed table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specc.codegen.linear_choice import FORMAT, LinearChoice, in_rows

H200_RECORD = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200-bs1-calibration.json"


def _rows(n, k, times):
    """Calibration-style measurements from {M: (triton_s, cublas_s)}."""
    return [{"impl": impl, "N": n, "K": k, "M": m, "seconds": t}
            for m, (ts, cs) in times.items() for impl, t in (("specc", ts), ("torch", cs))]


def test_choice_from_measurements_with_margin():
    times = {1: (10.0, 12.0), 2: (10.0, 9.9), 4: (10.0, 9.0), 8: (10.0, 9.5), 16: (10.0, 11.0), 32: (20.0, 10.0)}
    table = LinearChoice.from_measurements(_rows(64, 32, times), margin=0.02)
    shape = table.shape(64, 32)
    # 9.9 is within 2% of 10: Triton stays; 9.0 and 9.5 are faster by more
    assert [p.impl for p in shape.points] == ["triton", "triton", "cublas", "cublas", "triton", "cublas"]
    assert [(r["rows"], r["impl"]) for r in shape.ranges()] == [([1, 2], "triton"), ([3, 8], "cublas"),
                                                                ([9, 16], "triton"), ([17, None], "cublas")]
    assert shape.cublas_rows() == ((3, 8), (17, None))
    for rows, impl in [(1, "triton"), (2, "triton"), (3, "cublas"), (8, "cublas"), (9, "triton"), (16, "triton"),
                       (17, "cublas"), (5000, "cublas")]:
        assert table.impl_at(rows, 64, 32) == impl, rows
        assert in_rows(rows, shape.cublas_rows()) == (impl == "cublas"), rows
    assert table.impl_at(64, 99, 32) == "triton" and table.cublas_rows(99, 32) == ()  # unmeasured shape
    assert table.summary() == ["N=64 K=32: cuBLAS at M 3..8, M 17+"]
    # a shape timed by one implementation only is left out
    assert LinearChoice.from_measurements([r for r in _rows(8, 8, times) if r["impl"] == "torch"]).shapes == {}


def test_seconds_interpolate_the_chosen_implementation():
    table = LinearChoice.from_measurements(_rows(64, 32, {1: (1.0, 4.0), 4: (2.0, 4.0), 16: (8.0, 4.0),
                                                          32: (16.0, 8.0)}))
    shape = table.shape(64, 32)
    assert shape.seconds_at(1) == 1.0 and shape.seconds_at(4) == 2.0 and shape.seconds_at(16) == 4.0
    assert shape.seconds_at(2) == pytest.approx(math.sqrt(2.0))  # log-log between M = 1 and 4 (Triton)
    assert shape.seconds_at(8) == pytest.approx(4.0)  # cuBLAS at M = 5..16: 4.0 at both ends
    assert shape.seconds_at(64) == pytest.approx(16.0)  # beyond: the line through M = 16 and 32
    flat = LinearChoice.from_measurements(_rows(64, 32, {16: (8.0, 4.0), 32: (8.0, 4.0)})).shape(64, 32)
    assert flat.seconds_at(1024) == pytest.approx(4.0)  # weight-bound at the last two: stays flat
    single = LinearChoice.from_measurements(_rows(64, 32, {8: (1.0, 2.0)})).shape(64, 32)
    assert single.seconds_at(16) == pytest.approx(2.0)  # one point: proportional
    forced = LinearChoice.forced([(64, 32)], rows=(2, None))
    assert forced.shape(64, 32).seconds_at(8) is None  # a forced choice has no times


def test_forced_rows():
    table = LinearChoice.forced([(64, 32), (32, 64)], rows=(5, 12))
    assert table.cublas_rows(64, 32) == ((5, 12),) and table.cublas_rows(32, 64) == ((5, 12),)
    assert LinearChoice.forced([(8, 8)], rows=(1, None)).cublas_rows(8, 8) == ((1, None),)
    assert LinearChoice.forced([(8, 8)], rows=(1, 3)).cublas_rows(8, 8) == ((1, 3),)
    assert table.uses_cublas and not LinearChoice({}).uses_cublas
    for bad in ((0, 4), (5, 4)):
        with pytest.raises(ValueError, match="rows must be"):
            LinearChoice.forced([(8, 8)], rows=bad)
    # with_impl: the same times, one implementation everywhere
    measured = LinearChoice.from_measurements(_rows(64, 32, {1: (1.0, 2.0), 8: (3.0, 1.0)}))
    assert measured.with_impl("triton").cublas_rows(64, 32) == ()
    assert measured.with_impl("cublas").shape(64, 32).seconds_at(1) == 2.0


def test_json_round_trip():
    table = LinearChoice.from_measurements(_rows(64, 32, {1: (1.0, 2.0), 8: (3.0, 1.0)}), overhead_s=1e-6,
                                           source="test")
    data = json.loads(json.dumps(table.to_json()))
    assert data["format"] == FORMAT
    back = LinearChoice.from_json(data)
    assert back == table
    # a hand-written table may force a choice without times
    hand = LinearChoice.from_json({"shapes": [{"N": 4, "K": 4, "points": [{"M": 1, "impl": "cublas"}]}]})
    assert hand.cublas_rows(4, 4) == ((1, None),)


GOOD = {"N": 4, "K": 4, "points": [{"M": 1, "impl": "triton"}, {"M": 4, "impl": "cublas"}]}


@pytest.mark.parametrize("data,message", [
    ([], "one JSON object"),
    ({"format": "other/1", "shapes": []}, "unknown linear choice format"),
    ({"shapes": {}}, "shapes must be a list"),
    ({"margin": 1.5, "shapes": []}, "margin"),
    ({"overhead_s": -1, "shapes": []}, "overhead_s"),
    ({"dtype": "int8", "shapes": []}, "dtype"),
    ({"shapes": [GOOD, GOOD]}, "listed twice"),
    ({"shapes": [{"N": 0, "K": 4, "points": GOOD["points"]}]}, "shapes[0].N"),
    ({"shapes": [{"N": 4, "K": 4, "points": []}]}, "non-empty"),
    ({"shapes": [{"N": 4, "K": 4, "points": [{"M": 4, "impl": "triton"}, {"M": 4, "impl": "cublas"}]}]},
     "M must increase"),
    ({"shapes": [{"N": 4, "K": 4, "points": [{"M": 1, "impl": "cutlass"}]}]}, "impl must be one of"),
    ({"shapes": [{"N": 4, "K": 4, "points": [{"M": 1, "impl": "triton", "cublas_s": -1.0}]}]}, "cublas_s"),
    ({"shapes": [{"N": 4, "K": 4, "points": [{"M": 1.5, "impl": "triton"}]}]}, "points[0].M"),
])
def test_malformed_tables_are_refused(data, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        LinearChoice.from_json(data)


def test_h200_measurements_choose_cublas_at_large_m():
    """The H200 calibration record (both linears timed at Qwen3-8B shapes, M = 1 ... 2048): cuBLAS
    is chosen at every shape from M = 128 up (where it measured 1.5-2.9x faster) and the M = 1
    GEMV stays Triton."""
    record = json.loads(H200_RECORD.read_text())
    table = LinearChoice.from_measurements(record["measurements"]["linear"], margin=0.02)
    assert set(table.shapes) == {(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)}
    for (n, k), shape in table.shapes.items():
        assert [p.m for p in shape.points] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
        assert all(table.impl_at(m, n, k) == "cublas" for m in (128, 256, 512, 1024, 2048, 4096)), (n, k)
        assert shape.points[-1].cublas_s < 0.6 * shape.points[-1].triton_s
        assert table.impl_at(1, n, k) == "triton", (n, k)


RUN8_RECORD = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "linears-h200-run8.deployment.calibration.json"
H100_RECORD = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "run22/h100-cal.deployment.calibration.json"


@pytest.mark.parametrize("gpu,record", [("NVIDIA H200", H200_RECORD), ("NVIDIA H200", RUN8_RECORD),
                                        ("NVIDIA H100 SXM", H100_RECORD)], ids=["h200-bs1", "h200-run8", "h100-run22"])
def test_each_gpu_rule_is_what_its_calibrations_measured(gpu, record):
    """A GPU's built-in rule (cuBLAS from 65 rows at every shape: from 65 rows the Triton linear's
    64-row tiles read the weight twice) agrees with the measured choice of each calibration record
    of that GPU at every shape from M = 128 up, and keeps the M = 1 GEMV on Triton, as each
    measured (M = 65..127 were measured by none; at 64 the H100 measured the two within 1%)."""
    from specc.codegen.linear_choice import builtin_choice

    rule = builtin_choice(gpu)
    assert rule.cublas_from_rows == 65
    measured = LinearChoice.from_measurements(json.loads(record.read_text())["measurements"]["linear"], margin=0.02)
    assert len(measured.shapes) == 5
    for (n, k), shape in measured.shapes.items():
        for p in shape.points:
            if p.m >= 128 or p.m == 1:
                assert rule.impl_at(p.m, n, k) == p.impl, (n, k, p.m)


def test_row_rule_json_and_variants():
    from specc.codegen.linear_choice import RowRule, builtin_choice

    rule = builtin_choice("NVIDIA H200")
    assert builtin_choice("NVIDIA A100 SXM 80GB") is None
    back = LinearChoice.from_json(json.loads(json.dumps(rule.to_json())))
    assert isinstance(back, RowRule) and back.cublas_from_rows == 65 and back.source == rule.source
    assert rule.cublas_rows(7, 9) == ((65, None),) and rule.uses_cublas
    assert not rule.with_impl("triton").uses_cublas
    assert rule.with_impl("cublas").impl_at(1, 7, 9) == "cublas"
    assert rule.summary() == [f"every shape: cuBLAS at M 65+ ({rule.source})"]


@pytest.mark.parametrize("gpu,top,shapes", [("NVIDIA H100 SXM", 2048, 7), ("NVIDIA H200", 2048, 7)])
def test_builtin_rules_carry_their_gpus_cublas_times(gpu, top, shapes):
    """A built-in rule keeps the cuBLAS times its GPU measured at Qwen3-8B's five shapes and the
    DFlash-b16 drafter's two own shapes (the packaged record; the H200's since run 32), at and above
    the switch only; shapes it never timed get the bare rule; the times survive the artifact's
    JSON."""
    from specc.codegen.linear_choice import RowRule, builtin_choice

    rule = builtin_choice(gpu)
    assert len(rule.shapes) == shapes and "cuBLAS times: cublas-times-" in rule.source and rule.overhead_s > 0
    if shapes == 7:
        assert {(2048, 4096), (4096, 20480)} <= set(rule.shapes)
    o = rule.shape(4096, 4096)
    assert [p.impl for p in o.points][:2] == ["triton", "cublas"] and o.points[0].m == 64
    assert o.points[1].m == 128 and o.points[-1].m == top
    assert all(p.cublas_s and p.cublas_s > 0 for p in o.points[1:])
    t128, t256 = o.seconds_at(128), o.seconds_at(256)
    assert 0 < t128 < t256 and o.seconds_at(100) == t128  # 65..128 rows: the 128-row time
    assert o.seconds_at(2 * top) > o.seconds_at(top)  # past the last point: along the last two
    assert rule.shape(7, 9).points[1].cublas_s is None and rule.shape(7, 9).seconds_at(128) is None
    back = LinearChoice.from_json(json.loads(json.dumps(rule.to_json())))
    assert isinstance(back, RowRule) and back.shape(4096, 4096) == o


def test_cost_model_prices_a_builtin_cublas_row_from_its_measured_time():
    """At 256 rows the H100's cuBLAS o_proj takes what the record says (less the graph node the
    timing included), not the roofline's time at the deployment's efficiencies (~40% less)."""
    from types import SimpleNamespace

    from specc.search.cost_model import CostModel

    model = CostModel("h100-bs16")
    meta = SimpleNamespace(kind="linear", attrs={"out_features": 4096, "in_features": 4096})
    shape = model.linear_choice.shape(4096, 4096)
    nbytes, flops = 4096 * 4096 * 2 + 2 * 256 * 4096 * 2, 2.0 * 256 * 4096 * 4096
    bw_eff, fl_eff, launches, extra = model.measured_linear(meta, 256, nbytes, flops)
    dep = model.deployment
    seconds = flops / (dep.bf16_flops * fl_eff)
    assert seconds == pytest.approx(shape.seconds_at(256) - model.linear_choice.overhead_s, rel=1e-9)
    roofline = max(nbytes / (dep.hbm_bandwidth * dep.bandwidth_efficiency), flops / (dep.bf16_flops * dep.flops_efficiency))
    assert seconds > 1.3 * roofline


def test_a_calibration_record_without_a_table_prices_with_its_own_efficiencies():
    """A deployment with a calibration record but no measured table gets the GPU's bare rule: the
    record's efficiencies (this machine's) price its linears, not the packaged times."""
    from specc.search.calibrate import Calibration, choice_of
    from specc.search.deployments import get_deployment

    dep = get_deployment("h100-bs16")
    bare = choice_of(Calibration("h100-bs16", "cuda"), dep)
    assert bare.cublas_from_rows == 65 and not bare.shapes and "cuBLAS times" not in bare.source
    assert len(choice_of(None, dep).shapes) == 7  # the packaged times: five target shapes, two of the drafter
