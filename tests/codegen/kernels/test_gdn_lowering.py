"""Generated hybrid steps drive the GDN Triton kernels: a tiny hybrid target's emitted verify and
tree verify steps, with the kernel ABI dispatching to Triton (the interpreter on CPU), give the
model definition's logits and GDN states over a prefill, a chain block and a tree block."""

from __future__ import annotations

import torch
from hybrid_factory import random_hybrid_lm

from specc.codegen.build import build_step
from specc.codegen.kernels.dispatch import use_triton
from specc.runtime.compiled import instantiate


def test_emitted_hybrid_steps_run_the_gdn_kernels(monkeypatch, dev):
    model = random_hybrid_lm()
    cfg = model.config
    model.setup_caches(1, 32, max_block=4)
    steps = {role: build_step(model, role, "") for role in ("target", "target_tree")}
    assert all({"conv_step", "delta_rule_step"} <= set(s.lowering["lowered"]) for s in steps.values())
    model.to(dev)
    compiled = {role: instantiate(s.emitted).to(dev) for role, s in steps.items()}
    state = compiled["target"].setup_caches(1, 32, device=dev)
    state.bind(compiled["target_tree"])
    model.setup_caches(1, 32, device=dev, max_block=4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=g).to(dev)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool, device=dev)
    depth = torch.tensor([0, 1, 1, 2], device=dev)
    calls = [("target", (ids[:, :6], torch.arange(6, device=dev)[None], torch.tensor([0], device=dev))),
             ("target", (ids[:, 6:8], torch.arange(6, 8, device=dev)[None], torch.tensor([6], device=dev))),
             ("target_tree", (ids[:, 8:12], (8 + depth)[None], torch.tensor([8], device=dev), mask[None]))]
    monkeypatch.setenv("SPECC_KERNELS", "triton")
    assert use_triton(ids.float(), opt_in=True)  # the ABI takes the Triton path here
    with torch.no_grad():
        for role, inputs in calls:
            want = model(*inputs)
            got = compiled[role](*inputs)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i in cfg.linear_layers:
        for name in ("recurrent_state", "conv_state"):
            ref = getattr(model.layers[i].linear_attn, name)
            flat = f"layers_{i}_linear_attn_{name}"
            torch.testing.assert_close(state.buffers[flat], ref, rtol=1e-4, atol=1e-5)
