"""Real-size configs (config.json contents) for cost-model tests on the meta device."""

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
}
QWEN3_8B_DFLASH = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 40960,
    "hidden_act": "silu", "tie_word_embeddings": False, "block_size": 16, "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}, "dtype": "bfloat16",
}
