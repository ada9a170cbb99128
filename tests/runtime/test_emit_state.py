"""Emission knows state buffers from the StateSpec the model declares (node.meta["state"]),
not from attribute names: a model whose caches are called something else still compiles, runs
and allocates through DecodingState; a tensor merely named cache_k is not a cache."""

import torch
from helpers import PROMPT

from specc.codegen.build import build_steps
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.models import ops
from specc.models.decoder import Attention
from specc.models.registry import load_model
from specc.runtime.compiled import instantiate
from specc.runtime.state import StateSpec


class RenamedAttention(Attention):
    def state_specs(self, prefix="", extra_len=0):
        shape = (self.num_kv_heads, self.head_dim)
        return [StateSpec(prefix + name, "kv", shape, None, extra_len) for name in ("k_mem", "v_mem")]

    def forward(self, x, cos, sin, cache_len, mask_kind):
        q = self.project_q(x, cos, sin)
        k, v = self.project_kv(x, cos, sin)
        return self.o_proj(ops.attention(q, k, v, self.k_mem, self.v_mem, cache_len, mask_kind, self.scale))


def _renamed_model(path):
    model = load_model(path, torch.float32, "cpu", with_tokenizer=False).model
    for layer in model.layers:
        attn = layer.self_attn
        attn.__class__ = RenamedAttention
        attn.register_buffer("k_mem", None, persistent=False)
        attn.register_buffer("v_mem", None, persistent=False)
    return model


def test_renamed_caches_emit_and_run(checkpoints):
    model = _renamed_model(checkpoints["target"])
    model.setup_caches(1, 32)
    assert model.layers[0].self_attn.k_mem is not None and model.layers[0].self_attn.cache_k is None
    emitted = build_steps(model, None, DEFAULT_PIPELINE).emitted["target"]
    assert sorted(emitted.caches) == sorted(f"layers_{i}_self_attn_{n}_mem" for i in range(len(model.layers))
                                            for n in "kv")
    entry = emitted.caches["layers_0_self_attn_k_mem"]
    assert entry["kind"] == "kv" and entry["shape"] == [model.config.num_kv_heads, model.config.head_dim]
    step = instantiate(emitted)
    state = step.setup_caches(1, 32)
    assert state.buffers["layers_0_self_attn_k_mem"].shape[2] == 32
    ids = torch.tensor([PROMPT])
    pos = torch.arange(len(PROMPT))[None]
    with torch.no_grad():
        want = model(ids, pos, torch.zeros(1, dtype=torch.long))
        got = step(ids, pos, torch.zeros(1, dtype=torch.long))
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_a_tensor_named_like_a_cache_is_not_one(checkpoints):
    from specc.codegen.emit import emit_step
    from specc.codegen.lower import lower
    from specc.ir import trace

    model = load_model(checkpoints["target"], torch.float32, "cpu", with_tokenizer=False).model
    model.setup_caches(1, 16)
    ir = trace(model, "verify")
    for node in ir.gm.graph.nodes:
        if node.op == "get_attr" and "state" in node.meta:
            del node.meta["state"]  # undeclared: emission must not guess from the name
    gm, _ = lower(ir.gm)
    emitted = emit_step(gm, "TargetStep")
    assert emitted.caches == {} and "layers_0_self_attn_cache_k" in emitted.weights


def test_old_manifest_cache_entries_still_allocate(checkpoints):
    model = load_model(checkpoints["target"], torch.float32, "cpu", with_tokenizer=False).model
    model.setup_caches(1, 16)
    emitted = build_steps(model, None, "").emitted["target"]
    old = {name: {"heads": e["heads"], "head_dim": e["head_dim"], "dtype": e["dtype"], "extra_len": 2}
           for name, e in emitted.caches.items()}  # what artifacts before StateSpec recorded
    emitted.caches = old
    step = instantiate(emitted)
    step.setup_caches(1, 10)
    cache = step.layers_0_self_attn_cache_k
    assert cache.shape == (1, model.config.num_kv_heads, 12, model.config.head_dim)
