"""Fixtures for the search tests: tiny Qwen3 checkpoints (target, PARD, DFlash, AR drafters), built
once per session, plus Qwen3-8B configs for cost-model checks on the meta device.

Self-contained (not the family-parametrised ``checkpoints`` fixture) so the search tests build
one family only and stay fast.
"""

from __future__ import annotations

import json

import pytest
import torch
from search_configs import QWEN3_8B, QWEN3_8B_DFLASH

VOCAB = 96


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny shapes: one intra-op thread is faster than two fighting over a loaded CPU (module scope:
    it must be in place before the module-scoped search fixtures run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="module")
def _pass_registry():
    """Passes imported from files by candidates (+path:Class) register themselves: undo that."""
    from specc.passes import registry

    before = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)


@pytest.fixture(autouse=True)
def _memory_dir(tmp_path, monkeypatch):
    """Never touch ~/.cache: every test gets its own memory directory."""
    monkeypatch.setenv("SPECC_MEMORY_DIR", str(tmp_path / "memory"))


def _hf_qwen3(seed: int, layers: int = 2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      eos_token_id=VOCAB - 1, bos_token_id=1)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05 if "embed" not in name else 1.0)
    return model


def _save(model, tmp_path_factory, name: str, extra: dict | None = None) -> str:
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    if extra:
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(extra)
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(path)


def _dflash(target, tmp_path_factory, seed: int = 3, block_size: int = 4) -> str:
    from safetensors.torch import save_file

    from specc.stock.dflash_reference import DFlashReference

    cfg = target.config
    raw = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": cfg.vocab_size, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "max_position_embeddings": 256, "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "block_size": block_size,
        "num_target_layers": cfg.num_hidden_layers,
        "dflash_config": {"mask_token_id": 2, "target_layer_ids": [0, 1]},
        "layer_types": ["full_attention"], "dtype": "float32",
    }
    torch.manual_seed(seed)
    ref = DFlashReference(raw)
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05)
    path = tmp_path_factory.mktemp("search-dflash")
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if "rotary" not in k},
              str(path / "model.safetensors"))
    return str(path)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Paths: target, pard (the target itself with a pard_token: high acceptance), ar (same), dflash."""
    target = _hf_qwen3(0)
    return {
        "target": _save(target, tmp_path_factory, "search-target"),
        "pard": _save(target, tmp_path_factory, "search-pard", {"pard_token": 3}),
        "ar": _save(target, tmp_path_factory, "search-ar"),
        "dflash": _dflash(target, tmp_path_factory),
    }


@pytest.fixture(scope="session")
def meta8b():
    """Qwen3-8B and its DFlash drafter built from config.json on the meta device (no weights)."""
    from specc.search.driver import MetaPair

    return MetaPair(QWEN3_8B, QWEN3_8B_DFLASH, "dflash", "bfloat16")
