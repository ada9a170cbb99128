"""fuse_rope_attention: fires once per target layer, leaves DFlash drafter layers alone, keeps
outputs bit-identical. (Its kernel lowering: tests/codegen/kernels/test_rope_attention_lowering.py.)"""

import pytest
import torch
from helpers import run_ir

from specc.ir import bind_dflash, trace
from specc.models import load_model
from specc.passes import PassManager


@pytest.mark.parametrize("pipeline", ["fuse_rope_attention", "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,dce"])
def test_fires_per_layer_and_is_exact(checkpoints, pipeline):
    model = load_model(checkpoints["target"]).model
    model.setup_caches(1, 32)
    ir = trace(model, "verify")
    inputs = ir.example_inputs({"B": 1, "Q": 5, "C": 0})
    want = run_ir(ir, inputs)
    report = PassManager(pipeline).run(ir)
    assert report.stats("fuse_rope_attention")["fused"] == model.config.num_layers == ir.count("rope_attention")
    assert ir.count("rope") == 0 and ir.count("attention") == 0
    assert torch.equal(run_ir(ir, inputs), want)


def test_dflash_drafter_layers_are_left_alone(checkpoints):
    target = load_model(checkpoints["target"]).model
    draft = load_model(checkpoints["dflash"]).model
    drafter = bind_dflash(target, draft)
    drafter.setup_caches(1, 32)
    ir = trace(drafter, "draft")
    report = PassManager("fuse_rope_attention").run(ir)
    assert report.stats("fuse_rope_attention")["fused"] == 0 and ir.count("attention") == draft.config.num_layers
