"""examples/skinny_mma.py on the CPU: the bf16 kernel's index mapping (which k a lane's 16-byte
vectors hold, how they become MMA fragments, which output each accumulator is) replayed in torch
gives x @ W^T; and the CUDA source (with specc's skinny_mma.cuh) compiles for sm_90 where NVRTC
is installed (the kernel itself runs on a GPU: ``python3 examples/skinny_mma.py``). Its bf12
form is specc's linear_bf12_mma, tested in tests/codegen/kernels/test_linear_bf12_mma.py."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))


@pytest.mark.parametrize("m,unroll,warps,splits", [(1, 2, 2, 1), (8, 2, 2, 2), (13, 1, 3, 1), (16, 2, 1, 4)])
def test_emulated_kernel_is_the_matmul(m, unroll, warps, splits):
    import skinny_mma

    g = torch.Generator().manual_seed(m)
    x, w = torch.randn(m, 512, generator=g), torch.randn(32, 512, generator=g)
    got = skinny_mma.emulate(x, w, unroll=unroll, warps=warps, splits=splits)
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-4)


def test_cuda_source_compiles_for_sm90():
    import skinny_mma

    try:
        ptx = skinny_mma.compile_check()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert ".target sm_90" in ptx and ptx.count(".entry") == 24 and "mma.sync.aligned.m16n8k16" in ptx
