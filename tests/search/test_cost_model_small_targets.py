"""The cost model against measured steps of small targets (specc-tiny), from recorded runs.

- docs/benchmarks/h200-run15/cm-tiny-model.deployment.calibration.json: the calibration record of
  ``examples/bench_cost_model.py --config specc-tiny --calibrate --model-shapes`` on the H200 (run
  15); its measured steps are in docs/benchmarks/h200-run15.md (the row JSON did not come back);
- docs/benchmarks/h100-run16/cm-tiny-resident.{json,calibration.json}: the same command on an H100
  (run 16), rows and record.

Both records predate ``Calibration.attention_by_heads``; their raw attention samples (specc-tiny's
own 8 / 4 heads of 64 beside the reference 32 / 8 / 128) are fitted here per layout with this
code, as ``specc calibrate`` now does. #15's goal: small-model steps predicted within 15% on the
H200.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specc.search.attention_traffic import heads_key
from specc.search.calibrate import Calibration, fit_attention_by_heads, fit_split_kv_attention
from specc.search.cost_model import CostModel
from specc.search.deployments import BUILTIN, get_deployment

# measured before run 28 (residual-norm pairs, drafting ahead at batch): priced as they ran (tests/search/conftest.py)
pytestmark = pytest.mark.usefixtures("as_measured_before_run28")

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
H200_RECORD = BENCH / "h200-run15" / "cm-tiny-model.deployment.calibration.json"
H200_STEPS_MS = {(1, 1): 0.133, (1, 16): 0.191, (8, 1): 0.204, (8, 16): 0.329}  # h200-run15.md, C = 512
H100_ROWS = BENCH / "h100-run16" / "cm-tiny-resident.json"
H100_RECORD = BENCH / "h100-run16" / "cm-tiny-resident.calibration.json"
GOAL = 0.15


@pytest.fixture(scope="module")
def tiny_ir():
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.search.meta_pair import MetaPair

    from specc.models.loading import load_config, resolve_checkpoint

    return MetaPair(dict(load_config(resolve_checkpoint("specc-tiny"))), None, "ar", "bfloat16").irs(
        DEFAULT_PIPELINE)[0]


def _models(path: Path, base: str) -> tuple[CostModel, CostModel]:
    """(the record as it was fitted, the record with its per-layout attention fits)."""
    record = Calibration.from_json(json.loads(path.read_text()))
    dep = dataclasses.replace(get_deployment(base), calibrated=True, **record.fitted)
    by_heads = fit_attention_by_heads(dep, record.measurements, "cuda", dep.graph_node_overhead_s)
    assert heads_key(8, 4, 64) in by_heads and heads_key(32, 8, 128) in by_heads
    return (CostModel(dep, graphs=True, calibration=record),
            CostModel(dep, graphs=True, calibration=dataclasses.replace(record, attention_by_heads=by_heads)))


def _errors(model: CostModel, ir, steps_ms: dict) -> dict:
    return {bq: model.step(ir, {"B": bq[0], "Q": bq[1], "C": 512}, sync=False).time * 1e3 / ms - 1
            for bq, ms in steps_ms.items()}


def test_specc_tiny_on_the_h200_within_15_percent(tiny_ir):
    """Priced with its own layout's attention fit every step is within 15% (+4.4, +10.3, +7.0,
    -0.4%); the check can fail: the fit across layouts, as the record priced them, misses two
    rows (+18.3, +20.6%)."""
    across, own = _models(H200_RECORD, "h200-bs1")
    before, after = _errors(across, tiny_ir, H200_STEPS_MS), _errors(own, tiny_ir, H200_STEPS_MS)
    assert max(abs(e) for e in after.values()) < GOAL, after
    assert sum(abs(e) > GOAL for e in before.values()) >= 2, before
    assert all(abs(after[k]) <= abs(before[k]) + 0.01 for k in before)


def test_specc_tiny_on_the_h100_gets_closer(tiny_ir):
    """The H100 record (run 16) improves in every row: +26 / +29 / +23 / +11% -> +9 / +18 / +14 /
    +8% (not yet within 15% at B = 1, Q = 16; #15's goal is stated for the H200)."""
    rows = json.loads(H100_ROWS.read_text())["rows"]
    steps = {(r["B"], r["Q"]): r["measured_s"] * 1e3 for r in rows}
    across, own = _models(H100_RECORD, "h100-bs1")
    before, after = _errors(across, tiny_ir, steps), _errors(own, tiny_ir, steps)
    assert all(abs(after[k]) < abs(before[k]) - 0.02 for k in steps), (before, after)
    assert max(abs(e) for e in after.values()) < 0.20


def test_qwen3_8b_steps_keep_their_accuracy():
    """Qwen3-8B's attention has the reference layout: its own-layout fit changes the 8B steps by
    under 1.5% of the step, and they stay within 5% of run 15's measured H200 steps (priced with
    the tiny run's record of the same GPU type)."""
    from real_configs import QWEN3_8B

    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.search.meta_pair import MetaPair

    ir = MetaPair(QWEN3_8B, None, "ar", "bfloat16").irs(DEFAULT_PIPELINE)[0]
    measured = {(1, 1): 4.092, (1, 16): 4.740, (16, 1): 5.220, (16, 16): 8.461}  # h200-run15.md, C = 1024
    across, own = _models(H200_RECORD, "h200-bs1")
    for (b, q), ms in measured.items():
        t0 = across.step(ir, {"B": b, "Q": q, "C": 1024}, sync=False).time * 1e3
        t1 = own.step(ir, {"B": b, "Q": q, "C": 1024}, sync=False).time * 1e3
        assert abs(t1 / t0 - 1) < 0.015 and abs(t1 / ms - 1) < 0.05, (b, q, t0, t1, ms)


def test_the_fit_per_layout_recovers_each_layouts_terms():
    """Samples of two head layouts timed by the split-KV form with different latencies and
    bandwidths: each layout's own fit recovers its parameters; the fit across layouts cannot."""
    from split_kv_samples import split_kv_samples

    dep = BUILTIN["h200-bs1"]
    truth = {(32, 8, 128): (6e-6, 0.8), (8, 4, 64): (2e-6, 0.5)}
    node = 1e-6
    m = {"attention": split_kv_samples(dep, truth, 2.5e-8, node), "sizes": {"attn_heads": (32, 8, 128)}}
    got = fit_attention_by_heads(dep, m, "cuda", node)
    assert set(got) == {"32/8/128", "8/4/64"}
    for heads, (latency, bw) in truth.items():
        fitted = got[heads_key(*heads)]
        assert fitted["latency_s"] == pytest.approx(latency, rel=1e-6)
        assert fitted["bandwidth"] == pytest.approx(bw, rel=1e-6)
    across = fit_split_kv_attention(dep, m, "cuda", node)
    assert across["latency_s"] != pytest.approx(2e-6, rel=0.1) and across["latency_s"] != pytest.approx(6e-6, rel=0.1)
    assert fit_attention_by_heads(dep, m, "cpu", node) == {}  # the split-KV form is the CUDA kernel's


def test_records_keep_the_per_layout_fits():
    record = Calibration(deployment="h200-bs1", device="cuda",
                         attention_by_heads={"8/4/64": {"bandwidth": 0.5, "latency_s": 2e-6, "flops": 0.1,
                                                        "merge_slot_s": 1e-10}})
    again = Calibration.from_json(json.loads(json.dumps(record.to_json())))
    assert again.attention_by_heads == record.attention_by_heads
    assert Calibration.from_json({"deployment": "x", "device": "cuda"}).attention_by_heads == {}  # older records
    for bad in ({"8/4/64": {"latency_s": -1.0}}, {"8/4/64": 3.0}):
        with pytest.raises(ValueError, match="attention_by_heads"):
            Calibration.from_json({"deployment": "x", "device": "cuda", "attention_by_heads": bad})
