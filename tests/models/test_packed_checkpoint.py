"""specc.models.packed_checkpoint: bf12 checkpoints load bit-exactly through resolve_checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specc.models.loading import CheckpointError, load_state_dict, resolve_checkpoint
from specc.models.packed_checkpoint import MARKER, is_packed, pack_checkpoint, read_packed_state, unpacked_checkpoint


@pytest.fixture()
def plain_checkpoint(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    conf = Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(conf).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
        model.model.layers[0].mlp.up_proj.weight[0, :5] = 0.0  # zeros are escapes in bf12
    path = tmp_path / "plain"
    model.to(torch.bfloat16).save_pretrained(str(path))
    return path


def test_pack_round_trips_and_is_smaller(plain_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECC_UNPACK_CACHE", str(tmp_path / "cache"))
    packed = tmp_path / "packed"
    marker = pack_checkpoint(plain_checkpoint, packed, max_shard_bytes=80_000)
    assert is_packed(packed) and not is_packed(plain_checkpoint)
    assert len(marker["shards"]) > 1  # split by the shard size
    assert all((packed / s).stat().st_size < 80_000 + 8192 for s in marker["shards"])
    original = load_state_dict(plain_checkpoint)
    assert set(marker["packed"]) == {k for k, v in original.items() if v.dtype == torch.bfloat16 and v.dim() >= 2}
    packed_bytes = sum((packed / s).stat().st_size for s in marker["shards"])
    plain_bytes = (plain_checkpoint / "model.safetensors").stat().st_size
    assert packed_bytes < 0.8 * plain_bytes  # 1.5 of 2 bytes a weight, plus headers and escapes
    restored = read_packed_state(packed)
    assert restored.keys() == original.keys()
    for name, tensor in original.items():
        assert restored[name].dtype == tensor.dtype
        assert torch.equal(restored[name].view(torch.int16), tensor.view(torch.int16)), name

    # the user path: resolve_checkpoint gives an unpacked copy transformers and specc both read
    resolved = resolve_checkpoint(packed)
    assert resolved != packed and (resolved / "model.safetensors").is_file()
    assert resolve_checkpoint(packed) == resolved  # unpacked once, then reused
    assert json.loads((resolved / "config.json").read_text()) == json.loads((plain_checkpoint / "config.json").read_text())
    unpacked = load_file(str(resolved / "model.safetensors"))
    assert all(torch.equal(unpacked[k].view(torch.int16), v.view(torch.int16)) for k, v in original.items())
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[3, 17, 5, 40, 2]])
    a = AutoModelForCausalLM.from_pretrained(str(plain_checkpoint), dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(str(resolved), dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
    from specc.models.registry import load_model

    assert load_model(packed).kind == "causal_lm"


def test_plain_checkpoint_resolves_to_itself(plain_checkpoint):
    assert unpacked_checkpoint(plain_checkpoint) == plain_checkpoint
    assert resolve_checkpoint(plain_checkpoint) == plain_checkpoint


def test_broken_packed_checkpoint_is_a_one_line_error(plain_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECC_UNPACK_CACHE", str(tmp_path / "cache"))
    packed = tmp_path / "packed"
    marker = pack_checkpoint(plain_checkpoint, packed)
    (packed / marker["shards"][0]).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot unpack bf12 weights") as info:
        resolve_checkpoint(packed)
    assert "\n" not in str(info.value)
    assert (packed / MARKER).is_file()
