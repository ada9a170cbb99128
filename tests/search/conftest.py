"""Fixtures for the search tests: tiny Qwen3 checkpoints (target, PARD, DFlash, AR drafters), built
once per session, plus Qwen3-8B configs for cost-model checks on the meta device.

Self-contained (not the family-parametrised ``checkpoints`` fixture) so the search tests build
one family only and stay fast.
"""

from __future__ import annotations

import pytest
from model_factory import make_dflash_checkpoint, make_hf_model, save
from real_configs import QWEN3_8B, QWEN3_8B_DFLASH


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


@pytest.fixture
def as_measured_before_run28(monkeypatch):
    """For tests that price steps measured before run 28, when lowering began pairing residual
    adds with the norm after them (codegen/residual_norm.py) and batches began drafting ahead by
    default: price them as they ran."""
    monkeypatch.setenv("SPECC_RESIDUAL_NORM", "0")
    monkeypatch.setenv("SPECC_BATCH_DRAFT_AHEAD", "0")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Paths: target, pard (the target itself with a pard_token: high acceptance), ar (same), dflash."""
    target = make_hf_model("qwen3", seed=0, num_hidden_layers=2)
    return {
        "target": save(target, tmp_path_factory, "search-target"),
        "pard": save(target, tmp_path_factory, "search-pard", {"pard_token": 3}),
        "ar": save(target, tmp_path_factory, "search-ar"),
        "dflash": make_dflash_checkpoint(target, tmp_path_factory, "search-dflash", seed=3, layer_ids=(0, 1),
                                         num_layers=1),
    }


@pytest.fixture(scope="session")
def meta8b():
    """Qwen3-8B and its DFlash drafter built from config.json on the meta device (no weights)."""
    from specc.search.meta_pair import MetaPair

    return MetaPair(QWEN3_8B, QWEN3_8B_DFLASH, "dflash", "bfloat16")
