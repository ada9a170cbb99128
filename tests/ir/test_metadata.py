"""Node metadata: symbolic shapes, bytes and FLOPs, on the meta device at real sizes and tiny ones."""

from __future__ import annotations

import json

import pytest
import sympy
import torch

from real_configs import QWEN3_8B, QWEN3_8B_DFLASH

from specc.ir import KINDS, B, C, N, NodeMeta, Q, bind_dflash, evaluate, meta_model, trace

LLAMA_1B = {  # Llama-3.2-1B: tied embeddings, llama3 rope scaling
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def expected_weight_bytes_per_step(raw: dict, tokens: int = 1) -> int:
    """Parameter bytes read by one decoder step, computed from config.json alone: every
    non-embedding parameter once (the LM head too, which is the embedding when tied), plus one
    embedding row per new token. bf16 = 2 bytes."""
    h, i, v, L = raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"], raw["num_hidden_layers"]
    d = raw.get("head_dim") or h // raw["num_attention_heads"]
    q, kv = raw["num_attention_heads"] * d, raw["num_key_value_heads"] * d
    qk_norm = 2 * d if raw["model_type"] == "qwen3" else 0
    per_layer = h * q + 2 * h * kv + q * h + qk_norm + 3 * h * i + 2 * h
    lm_head = v * h
    return 2 * (L * per_layer + h + lm_head + tokens * h)


def test_qwen3_8b_weight_bytes_per_ar_step_from_meta_ir(capsys):
    loaded = meta_model(QWEN3_8B)
    assert all(p.device.type == "meta" for p in loaded.model.parameters())
    ir = trace(loaded.model, "ar")
    ir.lint()
    weight_bytes = ir.totals().weight_bytes
    assert weight_bytes.free_symbols == {B}  # only the embedding rows depend on the batch
    got = evaluate(weight_bytes, {"B": 1})
    expected = expected_weight_bytes_per_step(QWEN3_8B)
    with capsys.disabled():
        print(f"\nQwen3-8B bf16 weight bytes per AR step: IR {got / 1e9:.4f} GB, from config {expected / 1e9:.4f} GB")
    assert got == expected
    assert 15.0e9 < got < 15.3e9
    # independent cross-check: all parameters minus the embedding table, plus one row
    params = sum(p.numel() for p in loaded.model.parameters())
    assert got == 2 * (params - QWEN3_8B["vocab_size"] * 4096 + 4096)
    # the node count is what a 36-layer decoder needs, and weights are named by parameter
    assert ir.count("linear") == 36 * 7 + 1 and ir.count("attention") == 36
    lm_head = ir.meta("lm_head")
    assert lm_head.weights == ("lm_head.weight",)
    assert lm_head.weight_bytes == 151936 * 4096 * 2
    assert lm_head.shape == (B, 1, 151936)


def test_tied_llama_reads_embedding_as_lm_head():
    ir = trace(meta_model(LLAMA_1B).model, "verify")
    assert ir.meta("lm_head").weights == ("embed_tokens.weight",)
    assert evaluate(ir.totals().weight_bytes, {"B": 1, "Q": 1}) == expected_weight_bytes_per_step(LLAMA_1B)
    emb = ir.meta("embedding")
    assert sympy.expand(emb.weight_bytes - B * Q * 2048 * 2) == 0  # rows gathered, not the table


def test_symbolic_shapes_and_costs_of_a_layer():
    ir = trace(meta_model(QWEN3_8B).model, "verify")
    assert ir.symbols == [B, Q, C]
    q = ir.meta("layers_0_self_attn_q_proj")
    assert q.kind == "linear" and q.shape == (B, Q, 4096) and q.dtype == torch.bfloat16
    assert sympy.expand(q.flops - 2 * B * Q * 4096 * 4096) == 0
    assert q.weight_bytes == 4096 * 4096 * 2
    assert sympy.expand(q.bytes_read - (q.weight_bytes + B * Q * 4096 * 2)) == 0
    assert q.attrs == {"in_features": 4096, "out_features": 4096, "bias": False}
    att = ir.meta("layers_0_self_attn_attention")
    assert att.kind == "attention" and att.attrs["mask_kind"] == "causal" and att.attrs["num_kv_heads"] == 8
    assert att.shape == (B, Q, 4096)
    per_pos = B * 8 * 128 * 2  # one cached position of K (or V) for every row, bf16
    assert sympy.expand(att.cache_read - 2 * per_pos * (C + Q)) == 0
    assert sympy.expand(att.cache_written - 2 * per_pos * Q) == 0
    assert sympy.expand(att.flops - 4 * B * 32 * Q * (C + Q) * 128) == 0
    cache = ir.meta("layers_0_self_attn_cache_k")
    assert cache.kind == "kv_cache" and cache.bytes_read == 0
    totals = ir.totals()
    assert sympy.expand(totals.cache_read - 36 * 2 * per_pos * (C + Q)) == 0
    for node in ir.nodes:
        m = node.meta["specc"]
        assert isinstance(m, NodeMeta) and m.kind in KINDS, node.name


def test_ar_step_has_one_new_token():
    ir = trace(meta_model(QWEN3_8B).model, "ar")
    assert ir.symbols == [B, C]
    assert ir.meta("lm_head").shape == (B, 1, 151936)
    assert ir.inputs[0].meta.shape == (B, 1)


def test_dflash_draft_step_on_meta_marks_context_injection():
    target = meta_model(QWEN3_8B).model
    draft = meta_model(QWEN3_8B_DFLASH)
    assert draft.kind == "dflash"
    ir = trace(bind_dflash(target, draft.model), "draft")
    ir.lint()
    assert ir.symbols == [B, Q, C, N]
    assert ir.defaults[Q] == 16
    fc = ir.meta("draft_fc")
    assert fc.kind == "linear" and fc.group == "dflash_context"
    assert fc.shape == (B, N, 4096) and fc.weight_bytes == 4096 * 5 * 4096 * 2
    assert ir.meta("draft_hidden_norm").group == "dflash_context"
    grouped = {n.name for n in ir.nodes if ir.meta(n).group == "dflash_context"}
    assert grouped == {"draft_fc", "draft_hidden_norm"}
    att = ir.meta("draft_layers_0_self_attn_attention")
    assert att.attrs["mask_kind"] == "full"
    per_pos = B * 8 * 128 * 2
    assert sympy.expand(att.cache_read - 2 * per_pos * (C + N + Q)) == 0  # context and block keys
    assert ir.meta("lm_head").shape == (B, Q - 1, 151936)
    # the drafter's own weights plus the target's LM head and B*Q embedding rows
    own = sum(p.numel() for p in draft.model.parameters()) * 2
    assert evaluate(ir.totals().weight_bytes, {"B": 1, "Q": 16}) == own + 151936 * 4096 * 2 + 16 * 4096 * 2


def test_values_defaults_and_json_roundtrip():
    ir = trace(meta_model(QWEN3_8B).model, "verify")
    d = json.loads(json.dumps(ir.to_dict({"Q": 4, "C": 100})))
    assert d["values"] == {"B": 1, "Q": 4, "C": 100}
    assert len(d["nodes"]) == len(ir.nodes)
    totals = ir.totals().evaluate({"B": 1, "Q": 4, "C": 100})
    assert d["totals"]["weight_bytes"]["value"] == totals["weight_bytes"]
    assert d["totals"]["flops"]["value"] == totals["flops"]
    node = next(n for n in d["nodes"] if n["name"] == "layers_0_self_attn_q_proj")
    assert node["out"] == {"shape": ["B", "Q", "4096"], "dtype": "bf16"}
    assert node["flops"]["formula"] == "33554432*B*Q" and node["flops"]["value"] == 33554432 * 4
    text = ir.text()
    assert "%layers_0_self_attn_attention = attention(" in text and "# totals:" in text


@pytest.mark.parametrize("dtype,size", [("bfloat16", 2), ("float32", 4)])
def test_weight_bytes_follow_dtype(dtype, size):
    from specc.ir.testing import tiny_config

    ir = trace(meta_model(tiny_config("qwen3"), dtype=dtype).model, "ar")
    assert ir.meta("lm_head").weight_bytes == 128 * 64 * size
