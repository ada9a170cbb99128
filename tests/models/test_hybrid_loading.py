"""Loading hybrid checkpoints: Qwen3.5 text and multimodal (text part), Qwen3-Next dense; MoE and
mismatched weights refused with one-line errors; compiling a hybrid target refused."""

import json

import pytest
import torch
from hybrid_factory import make_hybrid
from model_factory import save
from safetensors.torch import load_file, save_file

from specc.errors import UserError
from specc.models import CheckpointError, classify, load_model
from specc.models.hybrid_config import hybrid_config_from_hf
from specc.pairing import resolve_pair

PROMPT = [5, 17, 33, 2, 61]


@pytest.fixture(scope="module")
def text_path(tmp_path_factory):
    return save(make_hybrid("qwen3_5", seed=4), tmp_path_factory, "hy-text")


def _logits(model, ids):
    model.setup_caches(1, 16)
    return model(ids, torch.arange(ids.shape[1])[None], torch.tensor([0]))


def test_text_config_fields(text_path):
    raw = json.loads(open(f"{text_path}/config.json").read())
    assert classify(raw) == "hybrid"
    cfg = hybrid_config_from_hf(raw)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert cfg.rotary_dim == 4 and cfg.conv_channels == 2 * 2 * 8 + 4 * 8
    assert cfg.num_params == sum(p.numel() for p in load_model(text_path).model.parameters())


def test_multimodal_checkpoint_loads_its_text_part(text_path, tmp_path):
    """A qwen3_5 (multimodal) checkpoint: text_config nested, weights under
    model.language_model., a vision tower and MTP heads beside them (ignored)."""
    raw = json.loads(open(f"{text_path}/config.json").read())
    nested = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
              "tie_word_embeddings": False, "text_config": {**raw, "model_type": "qwen3_5_text"},
              "vision_config": {"model_type": "qwen3_5_vision", "depth": 1}}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    state = load_file(f"{text_path}/model.safetensors")
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in state.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    renamed["mtp.fc.weight"] = torch.zeros(2, 2)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(_logits(load_model(tmp_path).model, ids), _logits(load_model(text_path).model, ids))
    pair = resolve_pair(str(tmp_path))
    assert pair.target.kind == "hybrid" and pair.target.raw["vocab_size"] == raw["vocab_size"]


def test_qwen3_next_with_experts_is_refused(tmp_path):
    model = make_hybrid("qwen3_next", seed=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32)
    model.config.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="mixture-of-experts .* not supported") as err:
        load_model(tmp_path)
    assert "\n" not in str(err.value)


def test_mismatched_weights_are_refused(text_path, tmp_path):
    (tmp_path / "config.json").write_text(open(f"{text_path}/config.json").read())
    state = load_file(f"{text_path}/model.safetensors")
    del state["model.layers.0.linear_attn.A_log"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing 1 weights .*A_log"):
        load_model(tmp_path)


def test_compile_refuses_hybrid_targets(text_path, tmp_path):
    from specc.compiler import compile_artifact

    with pytest.raises(UserError, match="hybrid recurrent target .* cannot compile"):
        compile_artifact(text_path, out=tmp_path / "hy.specc")
    assert not (tmp_path / "hy.specc").exists()
