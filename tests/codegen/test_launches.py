"""Launch counts the cost model prices: a packed linear is one kernel where the bf12 tensor-core
kernel fuses its residual epilogue (layouts 2 and 3, 1 .. 32 rows), with an rms_norm kernel first
for a norm prologue (since run 29 at every row count; where ``FUSED_NORM_MAX_ROWS`` lets the kernel
fuse it: one row whose normalized values fit its shared-memory stage), else the bf12 GEMM plus an
rms_norm kernel and an add."""

from types import SimpleNamespace

import pytest

from specc.codegen.launches import LAUNCHES


@pytest.mark.parametrize("version,rows,norm,res,want", [
    (2, 1, True, False, 2), (2, 1, True, True, 2), (2, 1, False, True, 1), (2, 16, True, True, 2),
    (2, 16, False, True, 1), (2, 17, True, True, 2), (2, 24, False, True, 1), (2, 32, True, False, 2),
    (2, 33, False, True, 2), (2, 64, False, True, 2), (2, 33, True, True, 3),
    (1, 1, True, True, 3), (1, 4, False, False, 1), (2, None, True, False, 2),
    (3, 1, True, True, 2), (3, 16, True, True, 2), (3, 17, True, True, 2),
])
def test_packed_linear_launches_on_cuda(version, rows, norm, res, want):
    meta = SimpleNamespace(attrs={"format_version": version, "norm_prologue": norm, "residual_epilogue": res})
    assert LAUNCHES["cuda"]["packed_linear"](meta, rows=rows) == want


def test_a_row_too_long_for_the_norm_stage_gets_the_rms_norm_kernel_first(monkeypatch):
    from specc.codegen.kernels import linear_bf12_mma
    from specc.codegen.kernels.linear_bf12_mma import FUSED_NORM_MAX_STAGED_BYTES

    monkeypatch.setattr(linear_bf12_mma, "FUSED_NORM_MAX_ROWS", 1)  # the kernel's prologue allowed at one row
    for k, want in ((4096, 1), (FUSED_NORM_MAX_STAGED_BYTES, 2)):
        meta = SimpleNamespace(attrs={"format_version": 2, "norm_prologue": True, "residual_epilogue": False, "k": k})
        assert LAUNCHES["cuda"]["packed_linear"](meta, rows=1) == want


def test_packed_linear_launches_on_cpu_count_the_residual_add():
    meta = SimpleNamespace(attrs={"format_version": 2, "norm_prologue": True, "residual_epilogue": True})
    assert LAUNCHES["cpu"]["packed_linear"](meta) == 11
