"""fuse_rope_attention: fires once per target layer and once per DFlash drafter layer, keeps
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


@pytest.mark.parametrize("pipeline", ["fuse_rope_attention", "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,dce"])
def test_dflash_drafter_layers_fuse_and_stay_exact(checkpoints, pipeline):
    """DFlash layers rotate the queries with the last Q rows of the keys' cos/sin (keys cover
    [context; block]): fused too, with the same outputs and the same cache contents."""
    target = load_model(checkpoints["target"]).model
    draft = load_model(checkpoints["dflash"]).model
    drafter = bind_dflash(target, draft)
    drafter.setup_caches(1, 48)
    ir = trace(drafter, "draft")
    inputs = ir.example_inputs({"B": 1, "Q": draft.spec.block_size, "C": 5, "N": 3})
    want = run_ir(ir, inputs)
    want_cache = [c.clone() for c in ir.cache_tensors()]
    report = PassManager(pipeline).run(ir)
    assert report.stats("fuse_rope_attention")["fused"] == draft.config.num_layers == ir.count("rope_attention")
    assert ir.count("rope") == 0 and ir.count("attention") == 0 and ir.count("rope_tables") == 0
    assert torch.equal(run_ir(ir, inputs), want)
    assert all(torch.equal(a, b) for a, b in zip(ir.cache_tensors(), want_cache))


def test_a_query_slice_that_is_not_the_trailing_rows_is_not_fused(checkpoints):
    """Queries rotated with other rows of the tables than the last Q (here the first Q) are not
    the kernel's layout: the pass must leave such a layer alone."""
    import operator

    target = load_model(checkpoints["target"]).model
    draft = load_model(checkpoints["dflash"]).model
    drafter = bind_dflash(target, draft)
    drafter.setup_caches(1, 48)
    ir = trace(drafter, "draft")
    changed = 0
    for node in list(ir.graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and ir.meta(node).kind == "slice":
            whole, tail = node.args[1]
            if tail.stop is None and isinstance(tail.start, torch.fx.Node):
                with ir.graph.inserting_before(node):
                    rows = ir.graph.call_function(operator.neg, (tail.start,))
                node.args = (node.args[0], (whole, slice(None, rows, None)))
                changed += 1
    assert changed == 2 * draft.config.num_layers  # cos and sin of every layer's queries
    ir.refresh()
    report = PassManager("fuse_rope_attention").run(ir)
    assert report.stats("fuse_rope_attention")["fused"] == 0


@pytest.mark.gpu
def test_dflash_fused_draft_step_lowers_to_the_unfused_steps_output_on_gpu(checkpoints, monkeypatch):
    """bf16 on a GPU, Triton kernels: the fused draft step's lowering (rope_and_cache + attention)
    gives the unfused step's logits up to bf16 rounding, the same argmax wherever the top two
    are apart, and the same context K/V in the drafter's cache."""
    from specc.codegen.lower import lower

    monkeypatch.setenv("SPECC_KERNELS", "triton")
    target = load_model(checkpoints["target"]).model.to("cuda", torch.bfloat16)
    draft = load_model(checkpoints["dflash"]).model.to("cuda", torch.bfloat16)
    drafter = bind_dflash(target, draft)
    drafter.setup_caches(1, 64)
    outs, caches = [], []
    for pipeline in ("dce", "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,dce"):
        ir = trace(drafter, "draft")
        PassManager(pipeline).run(ir)
        inputs = ir.example_inputs({"B": 1, "Q": draft.spec.block_size, "C": 9, "N": 4}, seed=3)
        lowered, _ = lower(ir.gm)
        ir.reset_caches()
        with torch.no_grad():
            outs.append(lowered(*inputs).float())
        caches.append([c[:, :, 9:13].float().clone() for c in ir.cache_tensors()])  # the context K/V
    fused, plain = outs[1], outs[0]
    torch.testing.assert_close(fused, plain, rtol=3e-2, atol=3e-2)
    top2 = plain.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 0.1
    assert torch.equal(fused.argmax(-1)[clear], plain.argmax(-1)[clear])
    for a, b in zip(caches[1], caches[0]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
