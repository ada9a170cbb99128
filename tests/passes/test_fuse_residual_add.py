"""fuse_residual_add: two fusions per decoder layer (o_proj, down_proj), bit-identical outputs,
drafters included; packed linears take the add as their residual keyword (bit-identical too);
broadcasting adds are left alone."""

import pytest
import torch
from helpers import run_ir

from specc.ir import bind_dflash, trace
from specc.models import load_model
from specc.passes import PassManager
from specc.passes.pack_weights_12bit import DEFAULT_PACK_VERSION


@pytest.mark.parametrize("pipeline", ["fuse_residual_add",
                                      "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,fuse_residual_add,dce"])
def test_fires_twice_per_layer_and_is_exact(checkpoints, pipeline):
    model = load_model(checkpoints["target"]).model
    model.setup_caches(1, 32)
    ir = trace(model, "verify")
    inputs = ir.example_inputs({"B": 1, "Q": 5, "C": 0})
    want = run_ir(ir, inputs)
    adds = ir.count("add")
    report = PassManager(pipeline).run(ir)
    layers = model.config.num_layers
    assert report.stats("fuse_residual_add")["adds"] == 2 * layers == ir.count("linear_add")
    assert ir.count("add") == adds - 2 * layers
    assert torch.equal(run_ir(ir, inputs), want)


def test_dflash_drafter_is_exact(checkpoints):
    target = load_model(checkpoints["target"]).model
    draft = load_model(checkpoints["dflash"]).model
    drafter = bind_dflash(target, draft)
    drafter.setup_caches(1, 32)
    ir = trace(drafter, "draft")
    inputs = ir.example_inputs({"B": 1, "Q": 4, "C": 0, "N": 3})
    want = run_ir(ir, inputs)
    report = PassManager("fuse_residual_add").run(ir)
    assert report.stats("fuse_residual_add")["adds"] == 2 * draft.config.num_layers
    assert torch.equal(run_ir(ir, inputs), want)


def test_packed_linears_take_the_add_and_stay_exact(checkpoints):
    model = load_model(checkpoints["target"], torch.bfloat16).model
    model.setup_caches(1, 32)
    ir = trace(model, "verify")
    inputs = ir.example_inputs({"B": 1, "Q": 5, "C": 0})
    want = run_ir(ir, inputs)
    adds = ir.count("add")
    report = PassManager("fuse_residual_add,pack_weights_12bit").run(ir)  # ordered: pack first
    layers = model.config.num_layers
    assert report.stats("pack_weights_12bit")["packed"] > 0 and ir.count("linear_add") == 0
    assert report.stats("fuse_residual_add")["adds"] == 2 * layers and ir.count("add") == adds - 2 * layers
    fused = [n for n in ir.calls("packed_linear") if n.kwargs.get("residual") is not None]
    assert len(fused) == 2 * layers
    assert all(ir.meta(n).attrs["residual_epilogue"] and ir.meta(n).attrs["format_version"] == DEFAULT_PACK_VERSION
               for n in fused)
    assert torch.equal(run_ir(ir, inputs), want)
    again = PassManager("fuse_residual_add").run(ir)  # a packed linear takes one residual only
    assert again.stats("fuse_residual_add")["adds"] == 0


def test_broadcasting_add_is_not_fused(checkpoints):
    """An add whose other operand broadcasts (here the final norm's [hidden] weight) is no
    residual: fusing it would change the output shape the kernel writes."""
    from specc.passes.fuse_residual_add import candidates

    model = load_model(checkpoints["target"]).model
    model.setup_caches(1, 32)
    ir = trace(model, "verify")
    before = candidates(ir)
    add, lin, res = before[0]
    weight = next(n for n in ir.graph.nodes if n.op == "get_attr" and n.target.endswith("norm.weight")
                  and ir.meta(n).out.ndim == 1)
    add.replace_input_with(res, weight)
    ir.refresh()
    after = candidates(ir)
    assert len(after) == len(before) - 1 and all(a is not add for a, _, _ in after)
