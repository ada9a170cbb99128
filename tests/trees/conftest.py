"""Tree tests run generated steps through the Triton kernels under the interpreter on CPU:
TRITON_INTERPRET must be set before triton is first imported (see tests/codegen/kernels/conftest.py)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
