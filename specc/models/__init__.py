"""specc's model zoo: readable definitions that load HF checkpoints.

Targets: Llama, Qwen3 (``CausalLM``). Drafters: PARD (a ``CausalLM`` with ``pard_token``),
DFlash (``DFlashDraft``), AR (any ``CausalLM`` sharing the target's vocabulary).
"""

from specc.models.config import ConfigError, ModelConfig, RopeConfig, model_config_from_hf
from specc.models.decoder import CausalLM
from specc.models.dflash import DFlashDraft, DFlashDrafter, DFlashSpec
from specc.models.loading import CheckpointError, resolve_checkpoint
from specc.models.registry import ARCHITECTURES, Loaded, classify, load_model

__all__ = [
    "ARCHITECTURES", "CausalLM", "CheckpointError", "ConfigError", "DFlashDraft", "DFlashDrafter",
    "DFlashSpec", "Loaded", "ModelConfig", "RopeConfig", "classify", "load_model", "model_config_from_hf",
    "resolve_checkpoint",
]
