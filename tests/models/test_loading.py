"""Checkpoint resolution and loading: sharded files, errors users can act on."""

import json

import pytest
import torch
from model_factory import make_hf_model

from specc.models import CheckpointError, load_model
from specc.models.loading import content_hash, resolve_checkpoint


def test_sharded_checkpoint_loads(tmp_path):
    hf = make_hf_model("qwen3", seed=31)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded = load_model(tmp_path)
    torch.testing.assert_close(loaded.model.layers[3].mlp.down_proj.weight, hf.model.layers[3].mlp.down_proj.weight)


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_checkpoint(tmp_path)


def test_offline_unknown_hub_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(CheckpointError, match="not in the local hub cache"):
        resolve_checkpoint("nobody/not-a-model")


def test_hub_cache_layout_resolves_offline(monkeypatch, tmp_path):
    """A model already in the huggingface_hub cache loads with no network."""
    hf = make_hf_model("llama", seed=32)
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("a" * 40)
    hf.save_pretrained(snap)
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir(parents=True)
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_checkpoint("org/tiny") == snap


def test_weight_mismatch_is_reported(tmp_path):
    hf = make_hf_model("qwen3", seed=33)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 100
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load_model(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(CheckpointError, match="unsupported model_type 'gpt2'"):
        load_model(tmp_path)


def test_content_hash_changes_with_weights(tmp_path):
    hf = make_hf_model("qwen3", seed=34)
    hf.save_pretrained(tmp_path)
    before = content_hash(tmp_path)
    with torch.no_grad():
        hf.model.norm.weight.add_(1)
    hf.save_pretrained(tmp_path)
    assert content_hash(tmp_path) != before
