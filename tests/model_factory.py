"""Tiny random HF checkpoints for tests, saved to temp dirs (real loading is exercised).

``tiny_pair`` families give a target and drafters that agree with it to different degrees:
- the target itself as AR drafter (full acceptance),
- a perturbed copy (partial), a fresh random model (zero),
- a "constant" target whose embeddings share one large component, so its argmax barely depends
  on the input; any drafter built on its embeddings/LM head then agrees (full acceptance for
  PARD and DFlash, which random weights could never reach).
"""

from __future__ import annotations

import copy
import os

import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VOCAB = 96
# weight scales that give varied (non-repeating) greedy outputs for the tiny configs
LAYER_SCALE = {"qwen3": 0.05, "llama": 0.15}


def _target_config(family: str, **overrides):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=VOCAB - 1, bos_token_id=1)
    common.update(overrides)
    if family == "qwen3":
        return Qwen3Config(head_dim=16, **common)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    common.setdefault("tie_word_embeddings", True)
    return LlamaConfig(rope_scaling=rope, rope_theta=500000.0, **common)


def make_hf_model(family: str, seed: int, **overrides):
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cls = Qwen3ForCausalLM if family == "qwen3" else LlamaForCausalLM
    model = cls(_target_config(family, **overrides)).eval()
    with torch.no_grad():  # larger weights than HF's init give decisive, varied argmaxes
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, LAYER_SCALE[family] if "embed" not in name else 1.0)
    return model


def make_constant(model, strength: float = 8.0):
    """Give every token embedding a shared large component: argmax ~ constant, margins large."""
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb += strength * torch.randn(1, emb.shape[1])
    return model


def perturbed(model, scale: float, seed: int):
    torch.manual_seed(seed)
    copy_ = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in copy_.named_parameters():
            if "layers" in name and p.dim() == 2:
                p.add_(scale * torch.randn_like(p) * p.std())
    return copy_


def save(model, tmp_path_factory, name: str, extra_config: dict | None = None) -> str:
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    if extra_config:
        import json

        cfg = json.loads((path / "config.json").read_text())
        cfg.update(extra_config)
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(path)


def make_dflash_checkpoint(target, tmp_path_factory, name: str, seed: int, layer_ids=(0, 2),
                           block_size: int = 4, num_layers: int = 2, scale: float = 0.05) -> str:
    """A random DFlash drafter for ``target`` saved exactly as the public checkpoints are."""
    import json

    from safetensors.torch import save_file

    from specc.stock.dflash_reference import DFlashReference

    cfg = target.config
    raw = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "vocab_size": cfg.vocab_size, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
        "max_position_embeddings": 512, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "block_size": block_size, "num_target_layers": cfg.num_hidden_layers,
        "dflash_config": {"mask_token_id": 2, "target_layer_ids": list(layer_ids)},
        "layer_types": ["full_attention"] * num_layers, "dtype": "float32",
    }
    torch.manual_seed(seed)
    ref = DFlashReference(raw)
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2:
                p.normal_(0, scale)
    path = tmp_path_factory.mktemp(name)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if "rotary" not in k}, str(path / "model.safetensors"))
    return str(path)


