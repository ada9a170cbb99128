"""shard_tensor_parallel alone (no processes): meta-device Qwen3-8B at world 2, fused and unfused
pipelines, the all_reduce rule and cost terms, refusals, and that the collectives matter."""

from __future__ import annotations

import pytest
import sympy
import torch

from specc.ir import evaluate, meta_model, trace
from specc.ir.collectives import all_reduce, all_reduce_time, all_reduce_traffic, collective_time
from specc.ir.testing import random_model, run_step
from specc.passes import PassError, PassManager, available_passes, get_pass
from specc.passes.shard_tensor_parallel import tp_spec
from specc.parallel import weight_summary

QWEN3_8B = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                max_position_embeddings=40960, tie_word_embeddings=False, torch_dtype="bfloat16")
FUSED = ["fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce"]
AT = {"B": 1, "Q": 8, "C": 1024}



def _layer_weight_bytes(ir) -> int:
    """Weight bytes the decoder layers read per step, by the metadata (norms included)."""
    exprs = [ir.meta(n).weight_bytes for n in ir.graph.nodes if ir.meta(n).scope.startswith("layers.")]
    return int(evaluate(sympy.Add(*exprs), AT))


@pytest.fixture(scope="module")
def qwen3_8b():
    return meta_model(QWEN3_8B).model


PIPELINES = {"plain": [], "fused": FUSED, "norm_linear": ["fuse_norm_linear"]}


@pytest.mark.parametrize("key,rank", [("plain", 0), ("fused", 1), ("norm_linear", 0)])
def test_qwen3_8b_meta_world2(qwen3_8b, key, rank):
    pipeline = PIPELINES[key]
    ir = trace(qwen3_8b, "verify")
    PassManager(pipeline, check=False).run(ir)
    report = PassManager(["shard_tensor_parallel"], check=True,  # lints before and after, checks ensures
                         options={"tp_world_size": 2, "tp_rank": rank}).run(ir)
    ir.lint()
    stats = report.stats("shard_tensor_parallel")
    layers = 36
    assert stats["world_size"] == 2 and stats["rank"] == rank
    assert stats["all_reduce"] == 2 * layers and ir.count("all_reduce") == 2 * layers
    assert stats["row_linears"] == 2 * layers and stats["caches"] == 2 * layers
    assert stats["column_linears"] == layers * (2 if "fuse_qkv" in pipeline else 5)

    # Qwen3-8B per layer: q/k/v/o 4096 x (32 + 8 + 8 + 32) x 128, gate/up/down 3 x 4096 x 12288, bf16
    linear_full = 2 * (4096 * (32 + 8 + 8 + 32) * 128 + 3 * 4096 * 12288)
    norms = 2 * (2 * 4096 + 2 * 128)  # input/post-attention norms, q/k norms: replicated
    replicated = 2 * (2 * 151936 * 4096 + 4096)  # embedding, lm_head, final norm
    w = weight_summary(ir)
    assert w["all_reduce"] == 2 * layers and w["embedding_fingerprint"] is None  # meta: no values
    assert w["layer_linear_weight_bytes"] * 2 == layers * linear_full  # exactly half of every layer linear
    assert w["parameter_bytes"] == replicated + layers * (linear_full // 2 + norms)  # what the rank holds
    per_step = _layer_weight_bytes(ir)  # what the metadata says one step reads (norm prologues included)
    assert w["layer_linear_weight_bytes"] <= per_step < 1.001 * w["layer_linear_weight_bytes"]
    assert ir.get_tensor("lm_head.weight").shape == (151936, 4096)
    assert ir.get_tensor("embed_tokens.weight").shape == (151936, 4096)
    # per-rank KV cache read: 4 of 8 kv heads, K and V, C + Q positions, bf16
    assert evaluate(ir.totals().cache_read, AT) == layers * 2 * (1024 + 8) * 4 * 128 * 2

    for att in ir.calls("attention"):
        a = ir.meta(att).attrs
        assert (a["num_heads"], a["num_kv_heads"], a["head_dim"]) == (16, 4, 128)
        assert ir.get_tensor(att.args[3]).shape == (1, 4, 64, 128)
        assert ir.meta(att).shape[-1] == 16 * 128

    red = ir.calls("all_reduce")[0]
    m = ir.meta(red)
    assert m.shape == ir.meta(red.args[0]).shape
    message = 8 * 4096 * 2  # [1, 8, 4096] bf16
    assert evaluate(m.attrs["message_bytes"], AT) == message
    assert evaluate(m.attrs["collective_bytes"], AT) == message  # 2 (w-1)/w = 1 at w = 2
    assert evaluate(m.bytes_read, AT) == message and evaluate(m.bytes_written, AT) == message
    assert m.attrs["world_size"] == 2 and m.attrs["ring_steps"] == 2
    assert "tensor parallel rank" in ir.title


def test_fused_slices_each_part():
    """Fused [q; k; v] / [gate; up] weights keep each part's slice, and the splits shrink."""
    model = random_model("qwen3")
    ir = trace(model, "verify")
    PassManager(FUSED).run(ir)
    full_qkv = ir.get_tensor("layers.0.self_attn.qkv_proj.weight").clone()
    full_gu = ir.get_tensor("layers.0.mlp.gate_up_proj.weight").clone()
    full_o = ir.get_tensor("layers.0.self_attn.o_proj.weight").clone()
    PassManager(["shard_tensor_parallel"], options={"tp_world_size": 2, "tp_rank": 1}).run(ir)
    q, kv = 4 * 16, 2 * 16  # tiny qwen3: 4 q heads, 2 kv heads, head_dim 16
    want = torch.cat([full_qkv[q // 2:q], full_qkv[q + kv // 2:q + kv], full_qkv[q + kv + kv // 2:]])
    assert torch.equal(ir.get_tensor("layers.0.self_attn.qkv_proj.weight"), want)
    inter = 128
    want = torch.cat([full_gu[inter // 2:inter], full_gu[inter + inter // 2:]])
    assert torch.equal(ir.get_tensor("layers.0.mlp.gate_up_proj.weight"), want)
    assert torch.equal(ir.get_tensor("layers.0.self_attn.o_proj.weight"), full_o[:, q // 2:])
    spec = tp_spec(ir)  # what a loader needs to read only this rank's slices
    assert (spec["world_size"], spec["rank"]) == (2, 1)
    assert spec["params"]["layers.0.self_attn.qkv_proj.weight"] == {
        "dim": 0, "ranges": [[32, 64], [80, 96], [112, 128]], "full_shape": [128, 64]}
    assert spec["params"]["layers.0.mlp.down_proj.weight"] == {"dim": 1, "ranges": [[64, 128]], "full_shape": [64, 128]}
    assert spec["caches"]["layers.1.self_attn.cache_v"] == {"dim": 1, "ranges": [[1, 2]], "full_shape": [1, 2, 64, 16]}
    splits = [n for n in ir.calls("split")]
    assert sorted(list(n.args[1]) for n in splits)[:2] == [[32, 16, 16], [32, 16, 16]]
    # the traced model keeps its full tensors
    assert model.layers[0].self_attn.o_proj.weight.shape == (64, 64)
    assert model.layers[0].self_attn.cache_k.shape[1] == 2


def test_collectives_are_what_makes_it_right():
    """Without a process group all_reduce is the identity: a rank's graph alone gives partial
    sums (different logits); at world 1 the pass changes nothing."""
    model = random_model("llama")
    ir = trace(model, "verify")
    inputs = ir.example_inputs({"B": 1, "Q": 5, "C": 0})
    expected = run_step(model, inputs)
    report = PassManager(["shard_tensor_parallel"], options={"tp_world_size": 1, "tp_rank": 0}).run(ir)
    assert not report.changed and ir.count("all_reduce") == 0
    assert torch.equal(run_step(ir, inputs), expected)
    PassManager(["shard_tensor_parallel"], options={"tp_world_size": 2, "tp_rank": 0}).run(ir)
    partial = run_step(ir, inputs)
    assert partial.shape == expected.shape
    assert (partial - expected).abs().max() > 1e-3


def test_dflash_target_capturing_hidden_states():
    """A DFlash target's verify step also returns captured hidden states: they are after the
    all_reduces, so replicated; the step shards the same way."""
    model = random_model("qwen3")
    model.capture_layers = (0, 1)
    ir = trace(model, "verify")
    report = PassManager(FUSED + ["shard_tensor_parallel"], options={"tp_world_size": 2, "tp_rank": 1}).run(ir)
    assert report.stats("shard_tensor_parallel")["all_reduce"] == 4
    out = ir.meta(next(n for n in ir.graph.nodes if n.op == "output")).out
    assert [str(d) for d in out[1].shape] == ["B", "Q", "128"]


def test_refusals():
    model = random_model("qwen3")  # 4 q heads, 2 kv heads
    ir = trace(model, "verify")
    text = ir.text()
    with pytest.raises(PassError, match="not divisible by world size 4"):
        PassManager(["shard_tensor_parallel"], options={"tp_world_size": 4, "tp_rank": 0}).run(ir)
    assert ir.text() == text  # nothing changed
    with pytest.raises(PassError, match="tp_world_size"):
        PassManager(["shard_tensor_parallel"]).run(ir)
    with pytest.raises(PassError, match="tp_rank"):
        PassManager(["shard_tensor_parallel"], options={"tp_world_size": 2, "tp_rank": 2}).run(ir)
    report = PassManager(["shard_tensor_parallel", "shard_tensor_parallel"],
                         options={"tp_world_size": 2, "tp_rank": 0}).run(ir)
    assert report.records[1].skipped and "already sharded" in report.records[1].skipped
    assert ir.count("all_reduce") == 4


def test_options_from_environment(monkeypatch):
    """`specc ir` has no pass options: SPECC_TP_WORLD_SIZE / SPECC_TP_RANK stand in for them."""
    monkeypatch.setenv("SPECC_TP_WORLD_SIZE", "2")
    monkeypatch.setenv("SPECC_TP_RANK", "1")
    ir = trace(random_model("qwen3"), "ar")
    report = PassManager(["shard_tensor_parallel"]).run(ir)
    assert report.stats("shard_tensor_parallel")["rank"] == 1 and ir.count("all_reduce") == 4


def test_registry_and_order():
    assert "shard_tensor_parallel" in available_passes()
    p = get_pass("shard_tensor_parallel")
    assert "fuse_qkv" in p.after and "pack_weights_12bit" in p.before
    pm = PassManager(["shard_tensor_parallel", "fuse_qkv"], options={"tp_world_size": 2, "tp_rank": 0})
    assert [q.name for q in pm.passes] == ["fuse_qkv", "shard_tensor_parallel"]


def test_all_reduce_eager_and_costs():
    x = torch.randn(2, 3)
    assert all_reduce(x, 2) is x  # no process group: identity
    assert all_reduce_traffic(1000, 1) == 0
    assert all_reduce_traffic(1000, 2) == 1000
    assert all_reduce_traffic(1000, 4) == 1500
    assert all_reduce_time(1000, 1, 1e9, 1e-6) == 0
    assert all_reduce_time(8192, 2, 100e9, 5e-6) == pytest.approx(8192 / 100e9 + 2 * 5e-6)
    assert all_reduce_time(8192, 8, 100e9, 5e-6) == pytest.approx(2 * 7 / 8 * 8192 / 100e9 + 14 * 5e-6)
    b = sympy.Symbol("B", positive=True)
    assert sympy.simplify(all_reduce_traffic(4 * b, 2) - 4 * b) == 0
    model = random_model("qwen3")
    ir = trace(model, "verify")
    PassManager(["shard_tensor_parallel"], options={"tp_world_size": 2, "tp_rank": 0}).run(ir)
    m = ir.meta(ir.calls("all_reduce")[0])
    t = evaluate(collective_time(m, 100e9, 5e-6), {"B": 1, "Q": 4})
    assert t == pytest.approx(all_reduce_time(4 * 64 * 4, 2, 100e9, 5e-6))
    assert collective_time(ir.meta(ir.calls("attention")[0]), 100e9) == 0


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_sharded_loading_matches_full_then_shard(family):
    """load_tp_target (meta model -> shard -> materialise slices -> fuse) gives the same
    parameters, caches and IR as building the whole model, fusing, then sharding."""
    from specc.ir.testing import tiny_config
    from specc.parallel import build_model, load_tp_target, trace_target

    source = {"config": tiny_config(family), "seed": 5}
    model = build_model(source)
    model.setup_caches(1, 32)
    full, _ = trace_target(model, FUSED, world_size=2, rank=1)
    sharded, stats = load_tp_target(source, 2, 1, max_len=32, passes=FUSED)
    assert stats["all_reduce"] == 4
    a, b = dict(full.gm.named_parameters()), dict(sharded.gm.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [t.shape for t in full.cache_tensors()] == [t.shape for t in sharded.cache_tensors()]
    assert full.text() == sharded.text()
