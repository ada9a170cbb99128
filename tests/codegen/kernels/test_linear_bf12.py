"""Fused decode + GEMV/GEMM on bf12 layout-1 weights against F.linear on the unpacked weights
(layout 2, the default, has its own kernel: test_linear_bf12_v2.py).

On a machine without CUDA these run under the Triton interpreter (conftest.py) in fp32; with
CUDA the same fp32 cases run compiled on the GPU and the bf16 cases (marked gpu) run too.
"""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels.linear_bf12 import (
    INTERPRETED,
    Bf12Config,
    clear_configs,
    get_config,
    linear_bf12,
    linear_bf12_reference,
    m_bucket,
    set_config,
)
from specc.formats import pack_bf16_12bit

HAS_CUDA = torch.cuda.is_available()


def pack_v1(w, **kw):
    """The layout this kernel reads (linear_bf12 hands version-2 weights to the v2 kernel)."""
    return pack_bf16_12bit(w, version=1, **kw)

DEV = "cpu" if INTERPRETED else "cuda"
if not INTERPRETED and not HAS_CUDA:
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU",
                allow_module_level=True)

CONFIGS = {
    "fma-m1": Bf12Config("fma", block_m=1, block_n=16, block_j=4),
    "fma-m1-noprefetch": Bf12Config("fma", block_m=1, block_n=8, block_j=2, prefetch=False, split_k=2),
    "fma-m2-split": Bf12Config("fma", block_m=2, block_n=8, block_j=2, split_k=3),
    "fma-m4": Bf12Config("fma", block_m=4, block_n=16, block_j=8),
    "dot": Bf12Config("dot", block_m=16, block_n=16, block_j=2),
    "dot-swap-split": Bf12Config("dot", block_m=16, block_n=16, block_j=1, swap_ab=True, split_k=3),
}


def weight_with_escapes(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    flat = w.view(-1)
    idx = torch.randperm(n * k, generator=g)[:6]
    flat[idx[0]] = 0.0  # zero
    flat[idx[1]] = -0.0
    flat[idx[2]] = 3.0e-39  # subnormal in bf16
    flat[idx[3]] = 7.5  # outlier above the window
    flat[idx[4]] = -1e-30  # outlier below
    flat[idx[5]] = 1e-8
    return w.bfloat16()


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


def ref64(x, w, bias=None):
    y = x.double() @ w.double().T
    return y if bias is None else y + bias.double()


CASES = [(c, m) for c in CONFIGS for m in (1, 3, 16)
         if not (c.startswith("fma") and m == 16 and c != "fma-m4")  # fma is the small-M path
         and not (c == "fma-m1-noprefetch" and m != 1)]


@pytest.mark.parametrize("base", ["row", "tensor"])
@pytest.mark.parametrize("cfg,m", CASES)
def test_matches_reference_fp32(cfg, m, base):
    n, k = 37, 120 + m  # N, K not multiples of any block; K16 = ceil(K / 16) words
    w = weight_with_escapes(n, k, seed=m)
    p = pack_v1(w, base=base).to(DEV)
    assert p.num_escapes >= 4
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, k, generator=g).to(DEV)
    bias = torch.randn(n, generator=g).to(DEV) if m != 3 else None
    y = linear_bf12(x, p, bias, config=CONFIGS[cfg])
    assert y.shape == (m, n) and y.dtype == torch.float32
    ref = linear_bf12_reference(x, p, bias)
    assert rel_err(y, ref64(x, w.to(DEV), bias)) < 2e-6
    assert rel_err(y, ref) < 2e-6


def test_bf16_activations_on_fma_path():
    # the fma path is integer decode + fp32 FMAs, so bf16 x (read as int32 pairs) runs anywhere;
    # the accumulation must equal the fp32-x path's bit for bit (the interpreter truncates when
    # it stores bf16, the GPU rounds to nearest: compare before the final rounding)
    for k in (94, 206):  # K % 16 != 0: the x pair loads must stop at K
        w = weight_with_escapes(40, k, seed=k)
        p = pack_v1(w).to(DEV)
        x = torch.randn(2, k, device=DEV).bfloat16()
        for cfg in (CONFIGS["fma-m1"], CONFIGS["fma-m2-split"]):
            y = linear_bf12(x, p, config=cfg)
            y32 = linear_bf12(x.float(), p, config=cfg)
            assert y.dtype == torch.bfloat16
            if INTERPRETED:
                trunc = (y32.view(torch.int32) & -65536).view(torch.float32)
                assert torch.equal(y.float(), trunc)
            else:
                assert torch.equal(y, y32.bfloat16())


def test_escapes_are_applied_exactly():
    # a weight that is all escapes in one row and all zeros in another: only the table matters
    n, k = 4, 40
    w = (torch.randn(n, k) * 0.02)
    w[1] = torch.logspace(-30, 30, k) * torch.sign(torch.randn(k))
    w[2] = 0.0
    w = w.bfloat16()
    p = pack_v1(w).to(DEV)
    assert p.num_escapes > k // 2
    x = torch.randn(2, k, device=DEV)
    for cfg in (CONFIGS["fma-m2-split"], CONFIGS["dot"]):
        y = linear_bf12(x, p, config=cfg)
        ref = ref64(x, w.to(DEV))
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
        # an all-zero row is all escapes: the stand-in's product and its correction cancel to
        # within fp32 rounding of the stand-in (2**-126 here), not necessarily to exactly 0
        assert y[:, 2].abs().max().item() < 1e-40


def test_inf_nan_weights_propagate_like_reference():
    w = (torch.randn(3, 50) * 0.02).bfloat16()
    w[0, 7] = float("inf")
    w[2, 9] = float("nan")
    p = pack_v1(w).to(DEV)
    x = torch.randn(1, 50, device=DEV)
    y = linear_bf12(x, p, config=CONFIGS["fma-m1"])
    assert torch.isinf(y[0, 0]) and torch.isnan(y[0, 2]) and torch.isfinite(y[0, 1])


def test_leading_dims_fp16_and_heuristic_configs():
    w = weight_with_escapes(24, 96, seed=5)
    p = pack_v1(w).to(DEV)
    x = torch.randn(2, 3, 96, device=DEV)
    y = linear_bf12(x, p)  # default config (heuristic for M bucket 8)
    assert y.shape == (2, 3, 24)
    assert rel_err(y, ref64(x.reshape(6, 96), w.to(DEV)).reshape(2, 3, 24)) < 2e-6
    xh = torch.randn(1, 96, device=DEV).half()
    yh = linear_bf12(xh, p, config=CONFIGS["fma-m1"])
    assert yh.dtype == torch.float16 and rel_err(yh, ref64(xh, w.to(DEV))) < 2e-3


def test_config_table_and_overrides():
    assert [m_bucket(m) for m in (1, 2, 3, 4, 5, 16, 17, 64, 300)] == [1, 2, 4, 4, 8, 16, 32, 64, 64]
    assert get_config(1, 4096, 4096).kind == "fma"
    cfg = Bf12Config("fma", block_m=1, block_n=8, block_j=2)
    set_config(1, 4096, 4096, cfg)
    try:
        assert get_config(1, 4096, 4096) is cfg
        set_config(1, 4096, 4096, {"kind": "fma", "block_n": 32})
        assert get_config(1, 4096, 4096).block_n == 32
    finally:
        clear_configs()
    assert get_config(1, 4096, 4096) != Bf12Config("fma", block_m=1, block_n=32)
    with pytest.raises(ValueError):
        Bf12Config("dot", block_m=8)
    with pytest.raises(ValueError):
        Bf12Config("fma", block_m=8)
    with pytest.raises(ValueError):
        Bf12Config("fma", block_n=24)


def test_launcher_errors():
    p = pack_v1(weight_with_escapes(8, 32, seed=0)).to(DEV)
    with pytest.raises(ValueError, match="features"):
        linear_bf12(torch.randn(2, 31, device=DEV), p)
    with pytest.raises(ValueError, match="bias"):
        linear_bf12(torch.randn(2, 32, device=DEV), p, bias=torch.randn(7, device=DEV))
    with pytest.raises(TypeError):
        linear_bf12(torch.randn(2, 32, device=DEV), torch.randn(8, 32))
    with pytest.raises(TypeError):
        linear_bf12(torch.randint(0, 3, (2, 32), device=DEV), p)
    p3 = pack_v1(torch.randn(2, 4, 8).bfloat16()).to(DEV)
    with pytest.raises(ValueError, match="2-D"):
        linear_bf12(torch.randn(1, 8, device=DEV), p3)
    if INTERPRETED:
        with pytest.raises(TypeError, match="bf16"):
            linear_bf12(torch.randn(1, 32).bfloat16(), p, config=CONFIGS["dot"])
    with pytest.raises(ValueError, match="out"):
        linear_bf12(torch.randn(2, 32, device=DEV), p, out=torch.empty(2, 9, device=DEV))


# ---------------------------------------------------------------------------------------------
# bf16 on the GPU (compiled kernels, tensor cores)
# ---------------------------------------------------------------------------------------------
gpu = pytest.mark.gpu


@gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRETED, reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 33, 64])
@pytest.mark.parametrize("base", ["row", "tensor"])
def test_bf16_gpu_matches_fp32_reference(m, base):
    n, k = 1000, 2056
    w = weight_with_escapes(n, k, seed=m).cuda()
    p = pack_v1(w, base=base)
    assert torch.equal(p.unpack().view(torch.int16), w.view(torch.int16))
    x = torch.randn(m, k, device="cuda").bfloat16()
    bias = torch.randn(n, device="cuda").bfloat16()
    ref = ref64(x, w, bias)
    cublas = torch.nn.functional.linear(x, w, bias)
    cfgs = [None, Bf12Config("dot", block_m=max(16, m_bucket(m)), block_n=32, block_j=4, split_k=2),
            Bf12Config("dot", block_m=max(16, m_bucket(m)), block_n=64, block_j=4, swap_ab=True),
            Bf12Config("fma", block_m=min(4, m_bucket(m)), block_n=32, block_j=16, use_asm=False,
                       split_k=3)]
    for cfg in cfgs:
        if cfg is not None and cfg.kind == "fma" and m > 4:
            continue
        y = linear_bf12(x, p, bias, config=cfg)
        assert y.dtype == torch.bfloat16
        # bf16 output rounding dominates: as close to the fp64 result as cuBLAS is
        assert rel_err(y, ref) < 2 * rel_err(cublas, ref) + 1e-3
