"""Kernel tests: on a machine without CUDA the Triton kernels run under the interpreter.

TRITON_INTERPRET must be set before triton is first imported (Triton fixes the mode for its own
library functions at import), so it is set here, at conftest import, before any test module of
this directory imports a kernel. With CUDA the same tests run the compiled kernels on the GPU
(``dev`` fixture) and the ``@pytest.mark.gpu`` tests (bf16) run too; without CUDA those skip
(tests/conftest.py).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def dev() -> str:
    """Where the interpreter-sized tests run: the GPU if there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"
