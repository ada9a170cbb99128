"""IR.lint(): clean on traced steps, and each broken invariant is reported naming the node."""

from __future__ import annotations

import pytest
import torch

from specc.ir import LintError, trace
from specc.ir.testing import random_model
from specc.models import ops


@pytest.fixture(params=["qwen3", "llama"])
def ir(request):
    return trace(random_model(request.param), "verify")


def _lint_message(ir) -> str:
    with pytest.raises(LintError) as info:
        ir.lint()
    return str(info.value)


def test_traced_steps_lint_clean(ir):
    ir.lint()
    assert ir.meta("lm_head").kind == "linear"


def test_missing_metadata_is_reported(ir):
    node = ir.node("layers_0_add")
    del node.meta["specc"]
    msg = _lint_message(ir)
    assert "%layers_0_add (add): no specc metadata" in msg and "ir.refresh()" in msg


def test_stale_metadata_is_reported(ir):
    # rewire o_proj to read the MLP's down weight [64, 128]: stored metadata no longer matches
    graph = ir.graph
    o_proj = ir.node("layers_0_self_attn_o_proj")
    with graph.inserting_before(o_proj):
        w = graph.get_attr("layers.0.mlp.up_proj.weight")  # [128, 64]: 128 outputs instead of 64
    old_w = o_proj.args[1]
    o_proj.replace_input_with(old_w, w)
    graph.erase_node(old_w)
    ir.recompile()
    msg = _lint_message(ir)
    assert "%layers_0_self_attn_o_proj (linear): stale metadata" in msg
    # after refresh the new shape propagates and breaks the residual add downstream
    with pytest.raises(Exception) as info:
        ir.refresh()
    assert "%layers_0_add" in str(info.value) and "broadcast" in str(info.value)


def test_shape_mismatch_along_an_edge_names_the_node(ir):
    graph = ir.graph
    down = ir.node("layers_1_mlp_down_proj")
    with graph.inserting_before(down):
        w = graph.get_attr("layers.1.self_attn.o_proj.weight")  # [64, 64] but input has 128 features
    old = down.args[1]
    down.replace_input_with(old, w)
    graph.erase_node(old)
    msg = _lint_message(ir)
    assert "%layers_1_mlp_down_proj (linear): input features 128 != weight in-features 64" in msg


def test_dead_node_is_reported(ir):
    graph = ir.graph
    x = ir.node("norm")
    with graph.inserting_after(x):
        dead = graph.call_function(ops.silu_mul, (x, x))
    ir.refresh()
    msg = _lint_message(ir)
    assert f"%{dead.name} (silu_mul): unused" in msg
    assert ir.remove_dead() == 1
    ir.lint()


def test_missing_weight_is_reported(ir):
    name = ir.meta("lm_head").weights[0]  # lm_head.weight, or embed_tokens.weight when tied
    owner, leaf = name.rsplit(".", 1)
    del ir.gm.get_submodule(owner)._parameters[leaf]
    msg = _lint_message(ir)
    assert f"has no attribute {name!r}" in msg


def test_wrong_inputs_are_reported(ir):
    ir.inputs = ir.inputs[:2]
    msg = _lint_message(ir)
    assert "cache_len" in msg


def test_attention_without_cache_len_value(ir):
    # a cache_len computed from something without a symbolic value cannot be costed
    graph = ir.graph
    att = ir.node("layers_0_self_attn_attention")
    ids = ir.node("input_ids")
    with graph.inserting_before(att):
        fake = graph.call_function(torch.cat, ([ids],), {"dim": 0})
    att.replace_input_with(ir.node("cache_len"), fake)
    msg = _lint_message(ir)
    assert "%layers_0_self_attn_attention (attention)" in msg
