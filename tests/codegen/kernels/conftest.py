"""Kernel tests: on a machine without CUDA the Triton kernels run under the interpreter.

TRITON_INTERPRET must be set before triton is first imported (Triton fixes the mode for its own
library functions at import), so it is set here, at conftest import, before any test module of
this directory imports a kernel. With CUDA the same tests run the compiled kernels on the GPU
(``dev`` fixture) and the ``@pytest.mark.gpu`` tests (bf16) run too; without CUDA those skip.
"""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture
def dev() -> str:
    """Where the interpreter-sized tests run: the GPU if there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"
