"""Named real model shapes with random weights, built on the device (``specc bench --shapes``).

Real checkpoints cannot be downloaded here; step times need real sizes, so benchmarks build
the real architectures (config.json contents below) with N(0, 0.02) weights drawn on the
device (an 8B model takes seconds on a GPU). Their acceptance is meaningless and is replayed
from a stated acceptance model (``specc.runtime.replay``).

Targets: ``qwen3-8b``, ``llama-3.1-8b``, the hybrid ``qwen3.5-9b`` (gated DeltaNet + gated
attention: transformers' ``Qwen3_5TextConfig`` defaults, hidden 4096, 32 layers of which 24 GDN;
its weights drawn as ``build_hybrid`` says) and ``tiny-qwen3`` / ``tiny-llama`` / ``tiny-hybrid``
(the same architectures at toy sizes, for CPU tests). Drafters (``--drafter-shapes``):
``dflash-b16`` (the z-lab DFlash drafter: 5 Qwen3-style layers reading 5 target layers, block
16), ``pard`` (PARD on Qwen3-0.6B / Llama-3.2-1B shapes; the hybrid targets' on Qwen3-0.6B shapes
with the target's vocabulary), ``none`` (AR only).
"""

from __future__ import annotations

import math

import torch

from specc.errors import UserError

QWEN3_8B = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                max_position_embeddings=40960, tie_word_embeddings=False, eos_token_id=151645)
QWEN3_06B = dict(QWEN3_8B, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 tie_word_embeddings=True, pard_token=151669)
LLAMA_8B = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=5e5,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192},
                max_position_embeddings=131072, tie_word_embeddings=False, eos_token_id=128009)
LLAMA_1B = dict(LLAMA_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                tie_word_embeddings=True, pard_token=128250)


def tiny(cfg: dict, layers: int | None = None) -> dict:
    out = dict(cfg, vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, num_hidden_layers=layers or 4, eos_token_id=511, max_position_embeddings=4096)
    out.pop("pard_token", None)
    if "pard_token" in cfg:
        out["pard_token"] = 3
    if "rope_scaling" in cfg:
        out["rope_scaling"] = dict(cfg["rope_scaling"], original_max_position_embeddings=64)
    return out


# name -> (target config, PARD drafter config)
TARGETS: dict[str, tuple[dict, dict]] = {
    "qwen3-8b": (QWEN3_8B, QWEN3_06B),
    "llama-3.1-8b": (LLAMA_8B, LLAMA_1B),
    "tiny-qwen3": (tiny(QWEN3_8B), tiny(QWEN3_06B, 2)),
    "tiny-llama": (tiny(LLAMA_8B), tiny(LLAMA_1B, 2)),
}
# hybrid targets (name -> toy size?): config.json from transformers' Qwen3_5TextConfig, built on demand
HYBRID_TARGETS: dict[str, bool] = {"qwen3.5-9b": False, "tiny-hybrid": True}
TINY_HYBRID = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=4096, eos_token_id=511)
DRAFTER_SHAPES = ("dflash-b16", "pard", "none")


def target_names() -> list[str]:
    return list(TARGETS) + list(HYBRID_TARGETS)


def hybrid_raw(small: bool, layers: int | None = None) -> dict:
    """config.json of a hybrid target: transformers' Qwen3.5 defaults (real shapes) or a tiny one;
    ``layers``: keep only the first N layers (the same per-layer shapes)."""
    from transformers import Qwen3_5TextConfig

    raw = Qwen3_5TextConfig(**(TINY_HYBRID if small else {})).to_dict()
    raw["model_type"] = "qwen3_5_text"
    if layers:
        raw["num_hidden_layers"] = layers
        raw["layer_types"] = raw["layer_types"][:layers]
    return raw


def is_hybrid(cfg: dict) -> bool:
    return cfg.get("model_type") == "qwen3_5_text"
# DFlash's released Qwen3-8B drafter reads these target layers (z-lab/Qwen3-8B-DFlash-b16 config.json)
_DFLASH_LAYERS = {"qwen3-8b": [1, 9, 17, 25, 33]}


def dflash_config(target: dict, layer_ids, block_size: int = 16) -> dict:
    big = target["hidden_size"] >= 1024
    cfg = dict(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=target["hidden_size"],
               intermediate_size=12288 if target["hidden_size"] == 4096 else 2 * target["hidden_size"],
               num_hidden_layers=5 if big else 2, num_attention_heads=32 if big else 4,
               num_key_value_heads=8 if big else 2, head_dim=128 if big else 16,
               vocab_size=target["vocab_size"], rms_norm_eps=1e-6, rope_theta=1e6,
               max_position_embeddings=target.get("max_position_embeddings", 40960),
               block_size=block_size, num_target_layers=target["num_hidden_layers"],
               dflash_config={"mask_token_id": 5, "target_layer_ids": list(layer_ids)})
    return cfg


def target_config(name: str) -> dict:
    if name in HYBRID_TARGETS:
        return hybrid_raw(HYBRID_TARGETS[name])
    if name not in TARGETS:
        raise UserError(f"unknown --shapes {name!r}; known: {', '.join(target_names())}")
    return dict(TARGETS[name][0])


def _pard_for(shapes: str, tcfg: dict) -> dict:
    if shapes in TARGETS:
        return dict(TARGETS[shapes][1])
    small = HYBRID_TARGETS[shapes]  # a hybrid target: Qwen3-0.6B-shaped PARD with its vocabulary
    return dict(tiny(QWEN3_06B, 2) if small else QWEN3_06B, vocab_size=tcfg["vocab_size"])


def drafter_config(shapes: str, drafter_shapes: str) -> tuple[str | None, dict | None]:
    """(method, drafter config.json contents) for ``--drafter-shapes`` beside target ``shapes``."""
    tcfg = target_config(shapes)
    if drafter_shapes in (None, "", "none"):
        return None, None
    if drafter_shapes == "pard":
        return "pard", _pard_for(shapes, tcfg)
    if drafter_shapes.startswith("dflash-b"):
        try:
            block = int(drafter_shapes[len("dflash-b"):])
        except ValueError:
            block = 0
        if block < 2:
            raise UserError(f"--drafter-shapes {drafter_shapes!r}: give dflash-bN with a block size N >= 2")
        L = tcfg["num_hidden_layers"]
        ids = _DFLASH_LAYERS.get(shapes) or ([1, L // 4, L // 2, 3 * L // 4, L - 3] if L >= 8 else [0, 1, 2])
        return "dflash", dflash_config(tcfg, ids, block)
    raise UserError(f"unknown --drafter-shapes {drafter_shapes!r}; known: {', '.join(DRAFTER_SHAPES)} (dflash-bN)")


def init_(module, seed: int, scaled_residual: bool = True) -> None:
    """N(0, 0.02) weights (residual projections scaled by depth), drawn on the parameters' device."""
    dev = next(module.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    layers = max(1, sum(1 for n, _ in module.named_parameters() if n.endswith("o_proj.weight")))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            std = 0.02 / math.sqrt(2 * layers) if scaled_residual and ("o_proj" in name or "down_proj" in name) else 0.02
            p.copy_((torch.randn(p.shape, generator=g, device=dev) * std).to(p.dtype))


def build_causal(cfg: dict, dtype, device, seed: int):
    from specc.models import CausalLM, model_config_from_hf

    mc = model_config_from_hf(cfg)
    with torch.device("meta"):
        model = CausalLM(mc)
    model = model.to_empty(device=device).to(dtype)
    if mc.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    init_(model, seed)
    model.inv_freq = mc.rope.inv_freq(mc.head_dim).to(device)
    return model.eval()


def build_hybrid(raw: dict, dtype, dev, seed: int):
    """A HybridLM with random weights: N(0, 0.02) matrices (residual outputs scaled by depth),
    zero-centred norms at 0, GDN output norms at 1, conv taps N(0, 0.3), A_log = log U(1, 16)
    and dt_bias = 1 (HF's initialisation of the decay)."""
    from specc.models.hybrid import HybridLM
    from specc.models.hybrid_config import hybrid_config_from_hf

    cfg = hybrid_config_from_hf(raw)
    with torch.device("meta"):
        model = HybridLM(cfg)
    model = model.to_empty(device=dev)
    init_(model, seed)
    g = torch.Generator(device=dev).manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=dev).uniform_(1, 16, generator=g).log())
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g, device=dev) * 0.3)
    model = model.to(dtype)
    model.inv_freq = cfg.rope.inv_freq(cfg.rotary_dim).to(dev)
    return model.eval()


def build_target(cfg: dict, dtype, device, seed: int):
    """The target of a config from :func:`target_config`: a HybridLM or a CausalLM."""
    return build_hybrid(cfg, dtype, device, seed) if is_hybrid(cfg) else build_causal(cfg, dtype, device, seed)


def build_dflash(cfg: dict, dtype, device, seed: int):
    from specc.models import DFlashDraft

    with torch.device("meta"):
        draft = DFlashDraft.from_hf_config(cfg)
    draft = draft.to_empty(device=device).to(dtype)
    init_(draft, seed)
    draft.inv_freq = draft.config.rope.inv_freq(draft.config.head_dim).to(device)
    return draft.eval()


def hf_hybrid_twin(model, raw: dict):
    """HF's Qwen3_5ForCausalLM sharing a HybridLM's tensors (parameter names match, ``model.``
    prefixed); eager attention."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        hf = Qwen3_5ForCausalLM(cfg)
    state = {(k if k.startswith("lm_head") else "model." + k): v for k, v in model.named_parameters()}
    hf.load_state_dict(state, strict=False, assign=True)
    for m in hf.modules():
        if hasattr(m, "inv_freq"):
            m.inv_freq = model.inv_freq.clone()
            m.original_inv_freq = model.inv_freq.clone()
    return hf.eval()


def hf_twin(model, cfg: dict, attn: str = "sdpa"):
    """An HF transformers model sharing ``model``'s tensors (the HF baselines run the same weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_hybrid(cfg):
        return hf_hybrid_twin(model, cfg)
    hf_cfg = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "pard_token"})
    hf_cfg._attn_implementation = attn
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_cfg)
    state = {("model." + k if not k.startswith("lm_head") else k): v for k, v in model.state_dict().items()
             if "cache" not in k and k != "inv_freq"}
    hf.load_state_dict(state, strict=False, assign=True)
    if cfg.get("tie_word_embeddings"):
        hf.lm_head.weight = hf.model.embed_tokens.weight
    for m in hf.modules():  # rotary buffers were on meta; ours are computed as HF does
        if hasattr(m, "inv_freq"):
            m.inv_freq = model.inv_freq.clone()
            m.original_inv_freq = model.inv_freq.clone()
    return hf.eval()
