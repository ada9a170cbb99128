"""The shapes `specc calibrate --model` times: read from the same post-pass IRs the cost model prices."""

from __future__ import annotations

import json

import pytest

from specc.errors import UserError
from specc.models.loading import resolve_checkpoint
from specc.search.calibrate import _model_attention, _model_linears, _sizes
from specc.search.model_shapes import ModelShapes, model_shapes


def test_qwen3_8b_shapes_are_the_cuda_reference_sizes():
    """The built-in CUDA calibration measures Qwen3-8B's linears and heads: the shapes read from
    its traced steps (fused q/k/v and gate/up, the LM head) are exactly those."""
    from specc.bench.shapes import target_config

    ms = model_shapes(target_config("qwen3-8b"), label="qwen3-8b")
    ref = _sizes("cuda", quick=False)
    assert set(ms.linears) == set(ref["linear_shapes"])
    assert ms.attention_heads == (tuple(ref["attn_heads"]),)
    assert ms.norm_widths == (ref["short_width"],)
    assert ms.positions == 40960
    assert _model_linears([ms], ref["linear_shapes"]) == []  # nothing left to measure
    assert _model_attention([ms], ref) == []


def test_zoo_pair_shapes_include_the_drafter():
    ms = model_shapes("specc-tiny", "specc-tiny-dflash")
    cfg = json.loads((resolve_checkpoint("specc-tiny") / "config.json").read_text())
    h, heads, kv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    i, v = cfg["intermediate_size"], cfg["vocab_size"]
    expected_target = {(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * i), (i, h), (h, v)}
    assert expected_target <= set(ms.linears)
    target_only = model_shapes("specc-tiny")
    assert set(target_only.linears) == expected_target
    assert set(ms.linears) - expected_target == {(3 * h, h)}  # DFlash's context projection over 3 target layers
    assert ms.attention_heads == ((heads, kv, d),)
    assert ms.positions == 512 and ms.label == "specc-tiny + specc-tiny-dflash"
    assert ms.norm_widths == (h,)  # the norms before q/k/v, the MLP and the LM head (and DFlash's)
    assert "6 linear shapes" in ms.describe() and "8/4 heads of 64" in ms.describe()


def test_shapes_are_measured_once_each_beyond_the_reference():
    ref = _sizes("cpu", quick=True)
    a = ModelShapes("a", ((256, 1024), (64, 128), (128, 64)), ((4, 2, 16), (2, 1, 32)), positions=40)
    b = ModelShapes("b", ((64, 128), (512, 512)), ((2, 1, 32), (8, 8, 8)), positions=None)
    assert _model_linears([a, b], ref["linear_shapes"]) == [("a", [(64, 128), (128, 64)], 0), ("b", [(512, 512)], 0)]
    # reference heads skipped, each layout once; a's contexts must fit 40 positions with Q = 8
    assert _model_attention([a, b], ref) == [((2, 1, 32), [32]), ((8, 8, 8), ref["attn_c"])]


def test_unreadable_model_is_a_user_error(tmp_path):
    with pytest.raises(UserError):
        model_shapes(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="needs a drafter"):
        model_shapes("specc-tiny", method="dflash")


def test_small_unmeasured_linears_are_named_for_cuda_deployments_only():
    from specc.bench.shapes import dflash_config, target_config
    from specc.codegen.linear_choice import ChoicePoint, LinearChoice, ShapeChoice
    from specc.search.calibrate import Calibration
    from specc.search.cost_model import CostModel
    from specc.search.meta_pair import MetaPair
    from specc.search.model_shapes import unmeasured_small_linears

    from specc.search.defaults import default_pipeline

    tiny = MetaPair(json.loads((resolve_checkpoint("specc-tiny") / "config.json").read_text())).irs(default_pipeline())
    small = unmeasured_small_linears(CostModel("h200-bs1"), tiny)
    assert (512, 1024) in small and (512, 8192) not in small  # the LM head is as large as the threshold
    assert unmeasured_small_linears(CostModel("cpu"), tiny) == []
    big = target_config("qwen3-8b")
    pair = MetaPair(big, dflash_config(big, [1, 9, 17, 25, 33]), "dflash")
    assert unmeasured_small_linears(CostModel("h200-bs1"), pair.irs(default_pipeline())) == []  # the fc streams like the rest
    # measured at every small shape (calibrate --model): nothing left to name
    table = LinearChoice({(n, k): ShapeChoice(n, k, (ChoicePoint(1, "triton", 5e-6, 6e-6),)) for k, n in small})
    cal = Calibration(deployment="h200-bs1", device="cuda", linear_choice=table.to_json(),
                      kind_efficiency={"linear": {"bandwidth": 0.7, "flops": 0.5}})
    assert unmeasured_small_linears(CostModel("h200-bs1", calibration=cal), tiny) == []


def test_specc_cost_suggests_calibrating_for_a_small_model(capsys):
    from specc.cli import main

    assert main(["cost", "specc-tiny", "--deployment", "h200-bs1"]) == 0
    out = capsys.readouterr().out
    assert "small linear shapes" in out and "specc calibrate --deployment h200-bs1 --model specc-tiny -o FILE" in out
    assert main(["cost", "specc-tiny", "--deployment", "cpu"]) == 0
    assert "small linear shape" not in capsys.readouterr().out


def test_weight_elements_sum_every_linear_node():
    """The working set a model's steps stream: each linear node's weight once per round of steps
    (a target's and its drafter's), which sizes the rotation of its own samples."""
    from specc.search.calibrate import resident_cache_bytes

    cfg = json.loads((resolve_checkpoint("specc-tiny") / "config.json").read_text())
    h, heads, kv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    i, v, layers = cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + h * 2 * i + i * h
    target = model_shapes("specc-tiny")
    assert target.weight_elements == layers * per_layer + h * v
    assert model_shapes("specc-tiny", "specc-tiny-dflash").weight_elements > target.weight_elements
    assert target.to_json()["weight_elements"] == target.weight_elements
    l2 = 50 << 20
    assert resident_cache_bytes(l2, 2 * target.weight_elements) == target.weight_elements  # 52 MB < 2 x L2
    assert resident_cache_bytes(l2, 16 << 30) == l2  # an 8B model streams past the cache
    assert resident_cache_bytes(l2, 0) == l2  # unknown: the cache


def test_model_samples_rotate_over_the_models_own_weights(monkeypatch):
    """`calibrate --model`: a model whose weights fit twice in the cache is timed over copies
    spanning its own weight bytes (not twice the cache); the reference shapes still stream."""
    from specc.search import calibrate as cal

    seen = {}
    real = cal.measure_linear

    def spy(device, shapes, ms, dtype, timer, l2_bytes, impl="torch", model=None):
        seen[model] = l2_bytes
        return real(device, shapes, ms, dtype, timer, l2_bytes, impl, model)

    monkeypatch.setattr(cal, "measure_linear", spy)
    small = ModelShapes("small", ((48, 80),), (), weight_elements=48 * 80 * 6)
    dep, record = cal.calibrate("cpu", device="cpu", quick=True, models=[small])
    cache = record.measurements["cache_bytes"]
    assert seen[None] == cache and seen["small"] == 48 * 80 * 6 * 4 // 2
    rows = [r for r in record.measurements["linear"] if r.get("model") == "small"]
    assert rows and all(r["copies"] == 7 for r in rows)  # ceil(6 weights' bytes / one) + 1
