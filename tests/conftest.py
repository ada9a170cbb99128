"""Session fixtures: tiny random checkpoints per model family (see model_factory.py)."""

from __future__ import annotations

import os

import pytest
import torch

# Triton fixes interpreter mode at its first import, for the whole process: without a GPU the
# kernels run under the interpreter (tests/codegen/kernels/conftest.py), so the mode is set here,
# before any test module (of any directory, collected in any order) imports a kernel.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from model_factory import make_constant, make_dflash_checkpoint, make_hf_model, perturbed, save

# Tiny models: thread start-up costs more than the matmuls (several times faster on 2 cores).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests, in any directory, skip without a CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _isolated_search_memory(tmp_path_factory):
    """Never read or write the user's search memory (~/.cache/specc/memory) from tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECC_MEMORY_DIR", str(tmp_path_factory.mktemp("specc-memory")))
    yield
    mp.undo()


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def family(request):
    return request.param


@pytest.fixture(scope="session")
def checkpoints(family, tmp_path_factory):
    """Paths of a target and its drafters for one family (built once per session)."""
    target = make_hf_model(family, seed=0)
    const = make_constant(make_hf_model(family, seed=0))
    paths = {
        "target": save(target, tmp_path_factory, f"{family}-target"),
        "ar_same": save(target, tmp_path_factory, f"{family}-ar-same"),
        "ar_perturbed": save(perturbed(target, 0.3, seed=1), tmp_path_factory, f"{family}-ar-pert"),
        # a "constant" drafter always proposes one token, which this target never emits here
        "ar_random": save(make_constant(make_hf_model(family, seed=7, num_hidden_layers=2)), tmp_path_factory,
                          f"{family}-ar-rand"),
        "pard_same": save(target, tmp_path_factory, f"{family}-pard", {"pard_token": 3}),
        "const_target": save(const, tmp_path_factory, f"{family}-const"),
        "const_pard": save(const, tmp_path_factory, f"{family}-const-pard", {"pard_token": 3}),
        "dflash": make_dflash_checkpoint(target, tmp_path_factory, f"{family}-dflash", seed=3),
        "const_dflash": make_dflash_checkpoint(const, tmp_path_factory, f"{family}-const-dflash", seed=3, scale=0.01),
    }
    return paths
