"""fuse_qkv fires once per layer and leaves every step's outputs unchanged."""

from __future__ import annotations

import pytest
import torch

from specc.ir import meta_model, trace
from specc.passes import PassManager


@pytest.mark.parametrize("name", ["verify", "verify_capture", "pard_draft", "dflash_draft"])
def test_fuse_qkv_fires_and_keeps_outputs(steps, apply_checked, name):
    step = steps[name]
    before = step.trace()
    ir, report = apply_checked(step, ["fuse_qkv"])
    stats = report.stats("fuse_qkv")
    per_layer = 2 if name == "dflash_draft" else 3  # DFlash: q reads the noise, k/v read [context; noise]
    assert stats == {"groups": step.num_layers, "linears": per_layer * step.num_layers}
    assert ir.count("linear") == before.count("linear") - (per_layer - 1) * step.num_layers
    assert ir.count("split") == step.num_layers
    # same weights are read, in fewer launches
    assert ir.totals().weight_bytes == before.totals().weight_bytes
    fused = ir.meta(ir.calls("split")[0].args[0])
    assert fused.kind == "linear" and fused.weights[0].endswith(("qkv_proj.weight", "kv_proj.weight"))
    # a second run finds nothing more
    again = PassManager(["fuse_qkv"]).run(ir)
    assert not again.changed and again.stats("fuse_qkv") == {"groups": 0, "linears": 0}


def test_fused_weight_is_the_concatenation(steps):
    step = steps["verify"]
    ir = step.trace()
    PassManager(["fuse_qkv"]).run(ir)
    attn = step.model.layers[0].self_attn
    fused = ir.get_tensor("layers.0.self_attn.qkv_proj.weight")
    assert torch.equal(fused, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert not fused.requires_grad
    # the model itself is untouched
    assert not hasattr(attn, "qkv_proj")


def test_fuse_qkv_on_meta_stays_meta():
    from specc.ir.testing import tiny_config

    ir = trace(meta_model(tiny_config("qwen3", num_hidden_layers=3)).model, "ar")
    PassManager(["fuse_qkv"], check=True).run(ir)
    t = ir.get_tensor("layers.2.self_attn.qkv_proj.weight")
    assert t.device.type == "meta" and tuple(t.shape) == (64 + 32 + 32, 64)
