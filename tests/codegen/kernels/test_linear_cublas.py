"""The cuBLAS lowering of the linears (kernel_abi with ``cublas_rows``): the fused variants become
separate torch ops with the reference's roundings, and only rows inside the ranges take it."""

from __future__ import annotations

import pytest
import torch

from specc.codegen import kernel_abi as abi
from specc.codegen.kernels import linear_cublas
from specc.models import fused_ops as fused
from specc.models import ops


def _tensors(rows: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 48, generator=g).to(dtype)
    w = (torch.randn(40, 48, generator=g) * 0.1).to(dtype)
    b = torch.randn(40, generator=g).to(dtype)
    nw = (torch.rand(48, generator=g) + 0.5).to(dtype)
    r = torch.randn(1, rows, 40, generator=g).to(dtype)
    return x, w, b, nw, r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cublas_path_equals_the_reference_bodies(dtype):
    """On CPU the reference bodies are torch ops too: equal bit for bit, bias, norm prologue and
    residual add included (the residual is added to the rounded product)."""
    x, w, b, nw, r = _tensors(5, dtype)
    rows = ((1, None),)
    assert torch.equal(abi.linear(x, w, b, cublas_rows=rows), ops.linear(x, w, b))
    assert torch.equal(abi.linear(x, w, None, cublas_rows=rows), ops.linear(x, w))
    assert torch.equal(abi.norm_linear(x, nw, 1e-6, w, b, cublas_rows=rows), fused.norm_linear(x, nw, 1e-6, w, b))
    assert torch.equal(abi.linear_add(x, w, b, r, cublas_rows=rows), fused.linear_add(x, w, b, r))
    assert torch.equal(linear_cublas.linear_cublas(x, w, b, residual=r), r + ops.linear(x, w, b))


def test_only_rows_in_range_take_cublas(monkeypatch):
    calls = []
    real = linear_cublas.linear_cublas
    monkeypatch.setattr(linear_cublas, "linear_cublas", lambda x, *a, **k: calls.append(x.shape[1]) or real(x, *a, **k))
    ranges = ((2, 3), (6, None))
    for rows in range(1, 9):
        x, w, b, nw, r = _tensors(rows)
        abi.linear(x, w, b, cublas_rows=ranges)
        abi.norm_linear(x, nw, 1e-6, w, cublas_rows=ranges)
        abi.linear_add(x, w, None, r, cublas_rows=ranges)
        abi.linear(x, w, b)  # no ranges: never
    assert calls == [m for m in (2, 3, 6, 7, 8) for _ in range(3)]


def test_interpreted_triton_outside_the_ranges(monkeypatch):
    """With the interpreted Triton kernels opted in, rows outside the ranges run the Triton linear
    (close to the reference, another summation order) and rows inside run torch (exact)."""
    from specc.codegen.kernels.dispatch import use_triton

    monkeypatch.setenv("SPECC_KERNELS", "triton")
    x, w, b, nw, r = _tensors(4)
    if not use_triton(x, opt_in=True):
        pytest.skip("needs TRITON_INTERPRET=1 (or a GPU)")
    want = fused.linear_add(x, w, b, r)
    assert torch.equal(abi.linear_add(x, w, b, r, cublas_rows=((4, 4),)), want)
    torch.testing.assert_close(abi.linear_add(x, w, b, r, cublas_rows=((5, None),)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64, 512])
def test_cublas_path_bf16_in_a_cuda_graph(rows):
    """bf16 on the GPU: the cuBLAS path of every fused variant, captured in a CUDA graph as the
    runtime does, replays what it computes eagerly and stays within bf16 rounding of the Triton
    linear (fp32 accumulation in both; only the summation order differs)."""
    torch.manual_seed(rows)
    n, k = 3072, 1024
    x = torch.randn(1, rows, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 0.05).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16()
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16()
    r = torch.randn(1, rows, n, device="cuda").bfloat16()
    on = ((1, None),)
    calls = {
        "linear": lambda cr: abi.linear(x, w, b, cublas_rows=cr),
        "norm_linear": lambda cr: abi.norm_linear(x, nw, 1e-6, w, b, cublas_rows=cr),
        "linear_add": lambda cr: abi.linear_add(x, w, b, r, cublas_rows=cr),
    }
    for name, call in calls.items():
        eager = call(on)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call(on)  # warm-up off the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call(on)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), name
        triton_out = call(())
        torch.testing.assert_close(eager.float(), triton_out.float(), rtol=2e-2, atol=2e-2, msg=name)
