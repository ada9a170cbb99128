"""Launch counts: how many kernels (CUDA) or dispatched ops (CPU) one IR node of a kind becomes
once lowered (``lower.LOWERING`` -> ``kernel_abi``); the cost model prices a launch each.

Codegen publishes this next to the lowering it describes: change a kernel_abi function's
kernels, change its count here. Kinds not listed: 1.
"""

from __future__ import annotations

import math
from typing import Any

def _packed_linear_cuda(m, rows=None) -> int:
    """kernel_abi.packed_linear: at 1 .. 32 rows of layout 2 or 3 the tensor-core kernel (one
    launch), which fuses the residual add, and the norm where
    ``linear_bf12_mma.fuses_norm`` says (nowhere since run 29: an rms_norm kernel first); else the
    bf12 GEMM plus an rms_norm kernel (norm prologue) and an add (residual epilogue)."""
    from specc.codegen.kernels.linear_bf12_mma import fuses_norm, launches_for
    from specc.formats.bf12 import WIDE_LAYOUTS

    norm = bool(m.attrs.get("norm_prologue"))
    mma = launches_for(int(math.ceil(rows))) if rows is not None else 0  # the tensor-core kernel's
    if m.attrs.get("format_version") in WIDE_LAYOUTS and mma:
        return mma + (norm and not fuses_norm(rows, int(m.attrs.get("k", 0))))
    return 1 + norm + bool(m.attrs.get("residual_epilogue"))


# From the kernel_abi functions and the reference bodies (specc.models.ops, specc.models.fused_ops).
# A value is an int or a function of the node's NodeMeta.
LAUNCHES: dict[str, dict[str, Any]] = {
    # attention: write_kv (arange, add, arange, 2 index_put) + split + merge kernels;
    # rope / rope_tables run their eager bodies (mul, neg, cat, mul, add / float, mul, cat, cos, sin, 2 casts);
    # norm_linear: one GEMV at M = 1 (it computes the row statistics itself), an rms_norm kernel
    # + the GEMM for more rows; packed_linear: see _packed_linear_cuda. A function gets the
    # NodeMeta and, if it takes it, ``rows`` (M).
    # rope_attention: rope_and_cache + the attention split and merge kernels.
    # ragged_attention: the K/V write, split and merge kernels; on CPU its reference body runs
    # ~20 ops per row (counted at one row: the table has no per-row count).
    # GDN: gdn_conv, gated_delta_rule, gdn_gates, gated_rms_norm, offset_rms_norm one Triton
    # kernel each; tree_parents runs its reference body (12 ops).
    "cuda": {"attention": 7, "ragged_attention": 3, "rope": 5, "rope_tables": 7, "norm_linear": lambda m, rows=None: 1 if rows == 1 else 2,
             "rope_attention": 3, "gdn_conv": 1, "gated_delta_rule": 1, "gdn_gates": 1, "gated_rms_norm": 1,
             "offset_rms_norm": 1, "tree_parents": 12,
             "packed_linear": _packed_linear_cuda},
    # CPU runs the reference bodies: each aten op is one dispatch.
    # GDN on CPU: the conv ~20 ops; the delta rule ~12 per block token plus ~15 (counted at a
    # 4-token block, the cost model has no per-token launch count).
    "cpu": {"attention": 20, "ragged_attention": 20, "rope": 5, "rope_tables": 7, "norm_linear": 9, "rms_norm": 8, "silu_mul": 2,
            "rope_attention": 48, "gdn_conv": 20, "gated_delta_rule": 63, "gdn_gates": 8, "gated_rms_norm": 12,
            "offset_rms_norm": 10, "tree_parents": 12,
            "packed_linear": lambda m: (10 if m.attrs.get("norm_prologue") else 2) + (1 if m.attrs.get("residual_epilogue")
                                                                                      else 0)},
}


def register_launches(kind: str, launches, device: str | None = None) -> None:
    """Tell the cost model how many kernels a (new) node kind lowers to (an int, or a function
    of the node's NodeMeta), on one device type or all."""
    for dev in ([device] if device else list(LAUNCHES)):
        LAUNCHES.setdefault(dev, {})[kind] = launches if callable(launches) else int(launches)


# A linear lowered to cuBLAS (codegen/linear_choice.py, kernels/linear_cublas.py) runs its fusions
# as separate ops: the GEMM (bias in its epilogue), the rms_norm kernel before it (norm_linear),
# the residual add after it (linear_add). On CPU the norm is its reference body (8 ops).
CUBLAS_LAUNCHES: dict[str, dict[str, int]] = {
    "cuda": {"linear": 1, "norm_linear": 2, "linear_add": 2},
    "cpu": {"linear": 1, "norm_linear": 9, "linear_add": 2},
}
