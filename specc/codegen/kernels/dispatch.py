"""Whether a Triton kernel runs for some tensors: the one ``use_triton`` (no triton import here,
so the kernel ABI and the runtime can ask without loading Triton on a CPU).

CUDA tensors: yes, unless ``SPECC_KERNELS=reference``. CPU tensors: only under the Triton
interpreter (``TRITON_INTERPRET=1`` set before triton was first imported); the kernel ABI of
generated steps (``opt_in=True``) also needs ``SPECC_KERNELS=triton`` there (the interpreter is
slow: tests opt in to prove generated code drives the kernels).
"""

from __future__ import annotations

import os

# Triton fixes the interpreter mode at its import; kernels._common records what it found here.
INTERPRETED: bool | None = None


def use_triton(*tensors, opt_in: bool = False) -> bool:
    t = tensors[0]
    if t.is_cuda:
        return os.environ.get("SPECC_KERNELS", "triton") != "reference"
    if t.device.type != "cpu" or (opt_in and os.environ.get("SPECC_KERNELS") != "triton"):
        return False
    return INTERPRETED if INTERPRETED is not None else os.environ.get("TRITON_INTERPRET") == "1"
