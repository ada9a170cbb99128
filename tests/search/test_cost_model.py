"""The analytic cost model: formulas per node, step times, trends at real sizes, the gap report."""

from __future__ import annotations

import math

import pytest
import sympy

from specc.ir import evaluate
from specc.search.acceptance import AcceptanceModel
from specc.search.cost_model import CostModel, component_of
from specc.search.deployments import get_deployment


@pytest.fixture(scope="module")
def qwen8b(meta8b):
    """(target verify IR, DFlash draft IR) with the default pipeline applied."""
    from specc.search.defaults import default_pipeline

    return meta8b.irs(default_pipeline())


def test_ar_step_is_weights_over_bandwidth_plus_launches(qwen8b):
    t_ir, _ = qwen8b
    dep = get_deployment("h200-bs1")
    model = CostModel(dep)
    ar = model.step(t_ir, {"B": 1, "Q": 1, "C": 1024}, step="ar", sync=False)
    assert 15.0e9 < ar.weight_bytes < 15.3e9  # 15.1 GB of weights per token
    # at bs1 every node is memory-bound: time = bytes / effective bandwidth + launches x graph-node cost
    assert all(n.bound in ("memory", "launch") for n in ar.nodes)
    expected = ar.bytes / (dep.hbm_bandwidth * dep.bandwidth_efficiency) + ar.launches * dep.graph_node_overhead_s
    assert ar.time == pytest.approx(expected, rel=1e-9)
    weights_only = ar.weight_bytes / dep.effective_bandwidth
    assert weights_only < ar.time < weights_only * 1.05 + ar.launches * dep.graph_node_overhead_s
    # the floor: datasheet bandwidth, no launches
    assert ar.floor == pytest.approx(ar.bytes / dep.hbm_bandwidth, rel=1e-9)
    # eager (no CUDA graph) launches cost more
    eager = CostModel(dep, graphs=False).step(t_ir, {"B": 1, "Q": 1, "C": 1024}, sync=False)
    assert eager.time - ar.time == pytest.approx(ar.launches * (dep.launch_overhead_s - dep.graph_node_overhead_s))


def test_verify_trend_memory_bound_at_bs1_compute_heavier_at_bs32(qwen8b):
    t_ir, _ = qwen8b
    bs1, bs32 = CostModel("h200-bs1"), CostModel("h200-bs32")
    ar1 = bs1.step(t_ir, {"B": 1, "Q": 1, "C": 1024})
    v1 = bs1.step(t_ir, {"B": 1, "Q": 16, "C": 1024})
    assert 1.0 < v1.time / ar1.time < 1.1  # verifying 16 tokens costs about one AR step at bs1
    ar32 = bs32.step(t_ir, {"B": 32, "Q": 1, "C": 1024})
    v32 = bs32.step(t_ir, {"B": 32, "Q": 16, "C": 1024})
    assert v32.time / ar32.time > 1.5 * (v1.time / ar1.time)

    def compute_share(p):
        return sum(n.work_time for n in p.nodes if n.bound == "compute") / p.time

    assert compute_share(v1) == 0.0
    # uncalibrated, the H200's stated rule lowers 512 rows to cuBLAS, which streams each weight once
    head = max((n for n in v32.nodes if "linear" in n.kind), key=lambda n: n.weight_bytes)  # the LM head
    assert head.t_memory == pytest.approx(head.bytes / head.bandwidth, rel=1e-9)
    # with Triton linears everywhere (no rule), whose 64-row tiles read the weight once each: 512
    # rows = 8 passes, which bind before the FLOPs (measured on the H200 with Triton linears only:
    # 29.3 ms for this step, docs/benchmarks/linears-h200-run6.json)
    triton_only = CostModel("h200-bs32")
    triton_only.linear_choice = None
    v32t = triton_only.step(t_ir, {"B": 32, "Q": 16, "C": 1024})
    head = max((n for n in v32t.nodes if "linear" in n.kind), key=lambda n: n.weight_bytes)
    assert head.t_memory == pytest.approx((head.bytes + 7 * head.weight_bytes) / head.bandwidth, rel=1e-9)
    assert head.bound == "memory" and v32t.time > 25e-3 and v32.time < 0.55 * v32t.time
    # monotone in Q
    times = [bs32.step(t_ir, {"B": 32, "Q": q, "C": 1024}).time for q in (1, 4, 16, 64)]
    assert times == sorted(times)


def test_every_number_traces_to_a_formula(qwen8b):
    t_ir, _ = qwen8b
    model = CostModel("h200-bs8")
    values = {"B": 8, "Q": 8, "C": 2048}
    step = model.step(t_ir, values, sync=False, formula=True)
    for n in step.nodes:
        node = t_ir.node(n.node)
        meta = t_ir.meta(node)
        assert n.bytes == evaluate(meta.bytes_read + meta.bytes_written, values)
        assert n.flops == evaluate(meta.flops, values)
        assert n.time == pytest.approx(max(n.bytes / n.bandwidth, n.flops / n.peak) + n.t_launch)
        assert "max(" in n.formula()
    # the whole step as one sympy expression in B, Q, C reproduces the sum
    formula = step.formula()
    assert formula.free_symbols <= {sympy.Symbol(s, integer=True, positive=True) for s in "BQ"} | {
        sympy.Symbol("C", integer=True, nonnegative=True)}
    assert float(formula.subs({s: values[str(s)] for s in formula.free_symbols})) == pytest.approx(step.time, rel=1e-4)
    js = step.to_json(nodes=True)
    assert js["formula"] and js["nodes"][0]["bytes_formula"]


def test_gap_report_components(qwen8b):
    t_ir, d_ir = qwen8b
    model = CostModel("h200-bs1")
    pred = model.predict(t_ir, d_ir, method="dflash", num_draft=15, acceptance=AcceptanceModel.from_tau(6.55, 15))
    report = pred.gap_report()
    names = [r.name for r in report.rows]
    assert {"target linear weights", "target attention KV read", "target launch overhead", "target LM head"} <= set(names)
    assert any(n.startswith("drafter step") for n in names)
    gaps = [r.gap for r in report.rows]
    assert gaps == sorted(gaps, reverse=True)
    assert sum(r.time for r in report.rows) == pytest.approx(pred.step_time, rel=1e-9)
    assert all(r.floor <= r.time + 1e-15 for r in report.rows)
    drafter = next(r for r in report.rows if r.name.startswith("drafter step"))
    assert drafter.detail and drafter.time == pytest.approx(pred.draft_time)
    text = report.text()
    assert "target linear weights" in text and "floor" in text
    # a high published tau makes DFlash several times faster than AR; none makes it slower
    assert 3.0 < pred.speedup < 8.0
    assert pred.tokens_per_s == pytest.approx(6.55 / pred.step_time)
    none = model.predict(t_ir, d_ir, method="dflash", num_draft=15, acceptance=AcceptanceModel.none())
    assert none.speedup < 1.0
    js = pred.to_json()
    assert js["gap_report"]["rows"][0]["gap_s"] >= js["gap_report"]["rows"][-1]["gap_s"]


def test_fusion_lowers_launches_and_bytes(meta8b, qwen8b):
    plain, fused = meta8b.irs(""), qwen8b
    model = CostModel("h200-bs1")
    a = model.step(plain[0], {"B": 1, "Q": 1, "C": 1024})
    b = model.step(fused[0], {"B": 1, "Q": 1, "C": 1024})
    assert b.launches < a.launches and b.bytes < a.bytes and b.time < a.time
    assert b.weight_bytes == a.weight_bytes


def test_norm_linear_launches_depend_on_rows(qwen8b):
    """At M = 1 the GEMV computes its row statistics itself (one kernel); above, an rms_norm
    kernel runs first (two), in node costs and in the symbolic step formula alike."""
    t_ir, _ = qwen8b
    model = CostModel("h200-bs1")
    for q, per_node in ((1, 1), (16, 2)):
        values = {"B": 1, "Q": q, "C": 1024}
        norm = [n for n in model.step(t_ir, values, sync=False).nodes if n.kind == "norm_linear"]
        assert len(norm) >= 2 * 36  # qkv and gate_up of every layer
        assert {n.launches for n in norm} == {per_node}
    one, sixteen = ({"B": 1, "Q": q, "C": 1024} for q in (1, 16))
    for values in (one, sixteen):
        formula = float(evaluate(model.step_formula(t_ir, values), values))
        assert formula == pytest.approx(model.step(t_ir, values, sync=False).time, rel=1e-5)  # 6-digit floats


def test_methods_on_tiny_steps():
    from specc.ir import trace
    from specc.ir.testing import random_model

    target = random_model("qwen3")
    draft = random_model("qwen3", seed=1)
    t_ir, d_ir = trace(target, "verify"), trace(draft, "draft")
    model = CostModel("h100-bs1")
    acc = AcceptanceModel([0.9, 0.7, 0.5, 0.3])
    pard = model.predict(t_ir, d_ir, method="pard", num_draft=4, acceptance=acc)
    assert [n for _, n in pard.drafts] == [1]
    assert pard.drafts[0][0].values["Q"] == round(acc.expected_tokens(4)) + 3
    chain = model.predict(t_ir, d_ir, method="ar-draft", num_draft=4, acceptance=acc)
    assert [n for _, n in chain.drafts] == [4] and chain.drafts[0][0].values["Q"] == 1
    assert chain.draft_time == pytest.approx(4 * chain.drafts[0][0].time)
    ar = model.predict(t_ir, None, method="ar")
    assert ar.speedup == pytest.approx(1.0) and ar.verify is None and ar.expected_tokens == 1
    assert "speedup" in pard.summary()
    assert math.isfinite(pard.to_json()["tokens_per_s"])


def test_components_by_kind_and_role():
    from specc.ir import trace
    from specc.ir.testing import random_model

    ir = trace(random_model("qwen3"), "verify")
    seen = {component_of(ir.meta(n), n.name) for n in ir.calls()}
    assert {"linear weights", "LM head", "attention KV read", "norms", "rope", "elementwise", "embedding"} <= seen


def test_calibration_record_changes_the_prediction(qwen8b):
    from specc.search.calibrate import Calibration

    t_ir, _ = qwen8b
    dep = get_deployment("h200-bs32")
    base = CostModel(dep).step(t_ir, {"B": 32, "Q": 16, "C": 1024})
    cal = Calibration("h200-bs32", "cuda", kind_efficiency={"linear": {"bandwidth": 0.5, "flops": 0.3},
                                                              "attention": {"bandwidth": 0.4}},
                      linear_flops_by_m={1: 0.7, 64: 0.5, 512: 0.25}, linear_tiles=True)
    model = CostModel(dep, calibration=cal)
    assert cal.linear_flops_at(1) == 0.7 and cal.linear_flops_at(4096) == 0.25
    assert 0.25 < cal.linear_flops_at(256) < 0.5
    slow = model.step(t_ir, {"B": 32, "Q": 16, "C": 1024})
    assert slow.time > base.time
    lin = next(n for n in slow.nodes if n.kind in ("linear", "norm_linear") and n.component == "linear weights")
    assert lin.peak == pytest.approx(dep.bf16_flops * cal.linear_flops_at(512))
    att = next(n for n in slow.nodes if n.kind in ("attention", "rope_attention"))
    assert att.bandwidth == pytest.approx(dep.hbm_bandwidth * 0.4)


def test_all_reduce_costs_the_gpu_link():
    """Tensor-parallel steps: each all_reduce node costs a ring all-reduce over the deployment's
    link (specc.ir.collectives.all_reduce_time), and the gap report shows it as its own component."""
    from real_configs import QWEN3_8B

    from specc.ir import meta_model, trace
    from specc.ir.collectives import all_reduce_time
    from specc.passes.shard_tensor_parallel import shard

    dep = get_deployment("h200-bs1")
    ir = trace(meta_model(QWEN3_8B, dtype="bfloat16"), "ar")
    shard(ir, 2, 0)
    pred = CostModel(dep).step(ir, {"B": 1, "Q": 1, "C": 1024})
    reduces = [n for n in pred.nodes if n.kind == "all_reduce"]
    assert len(reduces) == 2 * QWEN3_8B["num_hidden_layers"]
    message = 4096 * 2  # one token's hidden state in bf16
    assert reduces[0].t_memory == pytest.approx(all_reduce_time(message, 2, dep.link_bandwidth, dep.link_latency_s))
    assert reduces[0].component == "all-reduce (GPU link)"
    assert reduces[0].t_memory > reduces[0].floor > 0


def _h200_calibrations():
    """The recorded H200 calibration (Triton and cuBLAS timed at Qwen3-8B shapes) without and with
    its linear choice table."""
    import dataclasses
    import json
    from pathlib import Path

    from specc.search.calibrate import Calibration, linear_choice_of

    path = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200-bs1-calibration.json"
    cal = Calibration.from_json(json.loads(path.read_text()))
    table = linear_choice_of(cal.measurements, cal.fitted["graph_node_overhead_s"])
    return cal, dataclasses.replace(cal, linear_choice=table.to_json()), table


def test_linears_priced_by_the_chosen_implementations_measured_time(qwen8b):
    """At a measured M every linear of a measured shape costs what its chosen implementation
    measured (less the timed launch), cuBLAS nodes launch their separate norm (which adds the
    residual of the linear_add before it: residual-norm pairs), and batched verification gets
    cheaper than with the Triton-only tables."""
    import dataclasses

    from specc.codegen.launches import CUBLAS_LAUNCHES
    from specc.codegen.linear_choice import KINDS

    t_ir, _ = qwen8b
    without, with_choice, table = _h200_calibrations()
    dep = dataclasses.replace(get_deployment("h200-bs16"), **without.fitted)
    plain, chosen = CostModel(dep, calibration=without), CostModel(dep, calibration=with_choice)
    # a record without a choice table lowers (and so is priced) by the GPU's stated rule, as
    # specc compile does (calibrate.linear_choice_for); Triton-only is what this test compares with
    assert plain.linear_choice.source.startswith("built-in rule") and chosen.linear_choice == table
    plain.linear_choice = None
    values = {"B": 16, "Q": 16, "C": 1024}  # 256 rows: a measured M
    step = chosen.step(t_ir, values, sync=False)
    seen = set()
    for node in step.nodes:
        meta = t_ir.meta(next(n for n in t_ir.graph.nodes if n.name == node.node))
        if node.kind not in KINDS:
            continue
        n, k = int(meta.attrs["out_features"]), int(meta.attrs["in_features"])
        point = table.shape(n, k).point_at(256)
        assert point.m == 256 and point.impl == "cublas"
        assert node.work_time == pytest.approx(point.cublas_s - table.overhead_s, rel=1e-9), node.node
        if node.kind == "linear_add":  # the residual add runs in the next norm's kernel (a residual-norm pair)
            assert chosen.residual_norm_pair(t_ir, t_ir.node(node.node), 256) == "add"
            assert node.launches == CUBLAS_LAUNCHES["cuda"][node.kind] - 1
        else:
            assert node.launches == CUBLAS_LAUNCHES["cuda"][node.kind]
        seen.add((n, k))
    assert seen == set(table.shapes)
    for b, q in ((16, 16), (32, 16), (8, 16)):
        v = {"B": b, "Q": q, "C": 1024}
        assert chosen.step(t_ir, v, sync=False).time < 0.85 * plain.step(t_ir, v, sync=False).time
    # AR at bs1 keeps the Triton GEMVs (chosen there): the same time up to the per-shape tables
    ar = {"B": 1, "Q": 1, "C": 1024}
    assert chosen.step(t_ir, ar).time == pytest.approx(plain.step(t_ir, ar).time, rel=0.05)
    # the symbolic formula uses the same per-node prices
    assert float(evaluate(chosen.step_formula(t_ir, values), values)) == pytest.approx(step.time, rel=1e-4)


def test_default_context_is_capped_at_the_models_positions():
    """1024 tokens priced by default, never more than a config's max_position_embeddings (a
    multimodal Qwen3.5's from its text_config); configs without one do not cap it."""
    import dataclasses

    from specc.search.cost_model import default_context, positions_of

    dep = get_deployment("h200-bs1")
    assert default_context(dep) == 1024
    assert default_context(dep, {"max_position_embeddings": 40960}, None) == 1024
    assert default_context(dep, {"max_position_embeddings": 4096}, {"max_position_embeddings": 512}) == 512
    assert default_context(dep, {}, {"max_position_embeddings": "512"}) == 1024  # no usable figure
    assert default_context(dataclasses.replace(dep, context_max=256), {"max_position_embeddings": 512}) == 256
    multimodal = {"model_type": "qwen3_5", "text_config": {"max_position_embeddings": 300}}
    assert positions_of(multimodal) == 300 and default_context(dep, multimodal) == 300
    assert positions_of({"model_type": "qwen3_5"}) is None  # malformed: the tracer reports it


def test_packed_weights_are_read_once_per_row_tile_of_their_kernel(meta8b, qwen8b):
    """A packed linear reads its planes once in the tensor-core kernel's one launch (up to 32
    rows), then once per row tile of the Triton kernel (64 rows), as bf16 weights are priced.
    So packing wins the
    bs1 verify on the H100 (measured 0.94x, docs/benchmarks/run20.md) and loses at 512 rows,
    where the Triton kernel runs (measured 0.29x cuBLAS's speed at 64 rows)."""
    from specc.search.defaults import default_pipeline

    packed_ir, _ = meta8b.irs(default_pipeline().replace("dce", "pack_weights_12bit,dce"))
    node = next(n for n in packed_ir.graph.nodes if packed_ir.meta(n) is not None
                and packed_ir.meta(n).kind == "packed_linear")
    meta = packed_ir.meta(node)
    h100 = CostModel("h100-bs1")
    assert [h100.weight_passes(meta, m) for m in (1, 16, 17, 24, 32, 33, 64, 65, 512)] == [1, 1, 1, 1, 1, 1, 1, 2, 8]
    unpacked_ir, _ = qwen8b
    for deployment, batch, packing_wins in (("h100-bs1", 1, True), ("h100-bs32", 32, False)):
        model = CostModel(deployment)
        model.calibration = None  # the built-in tables, not a record found on this machine
        vals = {"B": batch, "Q": 16, "C": 1024}
        packed, unpacked = model.step(packed_ir, vals).time, model.step(unpacked_ir, vals).time
        assert (packed < unpacked) == packing_wins, (deployment, packed, unpacked)
