"""Tiny random hybrid (Qwen3.5 / Qwen3-Next) HF checkpoints for tests, saved with save_pretrained."""

from __future__ import annotations

import torch

VOCAB = 96


def hybrid_config(kind: str = "qwen3_5", **overrides):
    """A 4-layer config (3 GDN layers, then gated attention), 2 q/k heads serving 4 v heads."""
    from transformers import Qwen3_5TextConfig, Qwen3NextConfig

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_conv_kernel_dim=4, max_position_embeddings=512, eos_token_id=VOCAB - 1, bos_token_id=1)
    common.update(overrides)
    if kind == "qwen3_next":
        common.setdefault("num_experts", 0)
        return Qwen3NextConfig(**common)
    return Qwen3_5TextConfig(**common)


def make_hybrid(kind: str = "qwen3_5", seed: int = 0, scale: float = 0.08, **overrides):
    """An HF hybrid model with weights large enough for decisive, varied greedy outputs; norm
    weights randomised too (so a missing zero-centred offset would show)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cls = Qwen3NextForCausalLM if kind == "qwen3_next" else Qwen3_5ForCausalLM
    model = cls(hybrid_config(kind, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" in name:
                p.normal_(0, 1.0)
            elif p.dim() >= 2:
                p.normal_(0, scale if "conv1d" not in name else 0.3)
            elif "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model
