"""Fused decode + GEMV/GEMM on bf12 weights against F.linear on the unpacked weights.

The checks both layouts share (fp32 reference, escapes, inf/nan, leading dims and ``out``, bf16
on the GPU) run once per layout here, parametrized by ``layout``: the two kernels differ in their
configs, not in what they must compute. Below them, what only layout 1 has (bf16 activations on
the fma path, its config table, the launcher's errors); layout 2's own checks (bit-exact decode,
the PRMT asm, split-K workspace, its config table) are in test_linear_bf12_v2.py.

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
from specc.codegen.kernels.linear_bf12_v2 import Bf12v2Config
from specc.formats import pack_bf16_12bit

HAS_CUDA = torch.cuda.is_available()
LAYOUTS = (1, 2)


def pack(w, layout: int, **kw):
    """``w`` packed in bf12 ``layout`` (linear_bf12 hands each layout to its own kernel). Layout 2
    is packed without naming it, so the shared tests also check that it is the default."""
    p = pack_bf16_12bit(w, **kw) if layout == 2 else pack_bf16_12bit(w, version=layout, **kw)
    assert p.version == layout
    return p


DEV = "cpu" if INTERPRETED else "cuda"
if not INTERPRETED and not HAS_CUDA:
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU",
                allow_module_level=True)

C2 = Bf12v2Config
CONFIGS = {  # per layout, named configs that cover each kernel's paths (fma / dot, split-K, swap)
    1: {
        "fma-m1": Bf12Config("fma", block_m=1, block_n=16, block_j=4),
        "fma-m1-noprefetch": Bf12Config("fma", block_m=1, block_n=8, block_j=2, prefetch=False, split_k=2),
        "fma-m2-split": Bf12Config("fma", block_m=2, block_n=8, block_j=2, split_k=3),
        "fma-m4": Bf12Config("fma", block_m=4, block_n=16, block_j=8),
        "dot": Bf12Config("dot", block_m=16, block_n=16, block_j=2),
        "dot-swap-split": Bf12Config("dot", block_m=16, block_n=16, block_j=1, swap_ab=True, split_k=3),
    },
    2: {
        "fma-m1": C2("fma", block_m=1, block_n=16, block_k=64),
        "fma-m1-split": C2("fma", block_m=1, block_n=8, block_k=32, split_k=3),
        "fma-m2-split": C2("fma", block_m=2, block_n=8, block_k=64, split_k=2),
        "fma-m4": C2("fma", block_m=4, block_n=16, block_k=32),
        "dot": C2("dot", block_m=16, block_n=16, block_k=64),
        "dot-swap-split": C2("dot", block_m=16, block_n=32, block_k=32, swap_ab=True, split_k=3),
    },
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


# ---------------------------------------------------------------------------------------------
# both layouts
# ---------------------------------------------------------------------------------------------
CASES = (
    [(1, c, m) for c in CONFIGS[1] for m in (1, 3, 16)
     if not (c.startswith("fma") and m == 16 and c != "fma-m4")  # fma is the small-M path
     and not (c == "fma-m1-noprefetch" and m != 1)]
    + [(2, c, m) for c in CONFIGS[2] for m in (1, 3, 16)
       if not (c.startswith("fma") and m == 16)  # fma is the small-M path
       and not (c.startswith("fma-m1") and m != 1)]
)


@pytest.mark.parametrize("base", ["row", "tensor"])
@pytest.mark.parametrize("layout,cfg,m", CASES)
def test_matches_reference_fp32(layout, cfg, m, base):
    n, k = 37, 120 + m  # N, K not multiples of any block (layout 2 pads K to whole 32-weight groups)
    w = weight_with_escapes(n, k, seed=m)
    p = pack(w, layout, base=base).to(DEV)
    assert p.num_escapes >= 4
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, k, generator=g).to(DEV)
    bias = torch.randn(n, generator=g).to(DEV) if m != 3 else None
    y = linear_bf12(x, p, bias, config=CONFIGS[layout][cfg])
    assert y.shape == (m, n) and y.dtype == torch.float32
    ref = linear_bf12_reference(x, p, bias)  # F.linear on the unpacked weights
    assert rel_err(y, ref64(x, w.to(DEV), bias)) < 2e-6
    assert rel_err(y, ref) < 2e-6


# per layout: K, and the configs that apply the escape table (layout 2's swapped dot path has its own)
ESCAPE_CASES = {1: (40, ("fma-m2-split", "dot")), 2: (70, ("fma-m2-split", "dot", "dot-swap-split"))}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_escapes_are_applied_exactly(layout):
    # a weight that is all escapes in one row and all zeros in another: only the table matters
    k, cfgs = ESCAPE_CASES[layout]
    n = 4
    w = (torch.randn(n, k) * 0.02)
    w[1] = torch.logspace(-30, 30, k) * torch.sign(torch.randn(k))
    w[2] = 0.0
    w = w.bfloat16()
    p = pack(w, layout).to(DEV)
    assert p.num_escapes > k // 2
    x = torch.randn(2, k, device=DEV)
    for cfg in cfgs:
        y = linear_bf12(x, p, config=CONFIGS[layout][cfg])
        ref = ref64(x, w.to(DEV))
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
        # an all-zero row is all escapes: the stand-in's product and its correction cancel to
        # within fp32 rounding of the stand-in (2**-126 here), not necessarily to exactly 0
        assert y[:, 2].abs().max().item() < 1e-40


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inf_nan_weights_propagate_like_reference(layout):
    w = (torch.randn(3, 50) * 0.02).bfloat16()
    w[0, 7] = float("inf")
    w[2, 9] = float("nan")
    p = pack(w, layout).to(DEV)
    x = torch.randn(1, 50, device=DEV)
    y = linear_bf12(x, p, config=CONFIGS[layout]["fma-m1"])
    assert torch.isinf(y[0, 0]) and torch.isnan(y[0, 2]) and torch.isfinite(y[0, 1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_leading_dims_fp16_out_and_heuristic_configs(layout):
    w = weight_with_escapes(24, 96, seed=5)
    p = pack(w, layout).to(DEV)
    x = torch.randn(2, 3, 96, device=DEV)
    y = linear_bf12(x, p)  # default config (heuristic for M bucket 8: the dot path)
    assert y.shape == (2, 3, 24)
    assert rel_err(y, ref64(x.reshape(6, 96), w.to(DEV)).reshape(2, 3, 24)) < 2e-6
    out = torch.full((1, 24), float("nan"), device=DEV)
    y1 = linear_bf12(x[0, :1], p, out=out)  # heuristic M = 1: fma
    assert y1.data_ptr() == out.data_ptr() and rel_err(out, ref64(x[0, :1], w.to(DEV))) < 2e-6
    xh = torch.randn(1, 96, device=DEV).half()
    yh = linear_bf12(xh, p, config=CONFIGS[layout]["fma-m1"])
    assert yh.dtype == torch.float16 and rel_err(yh, ref64(xh, w.to(DEV))) < 2e-3


# ---------------------------------------------------------------------------------------------
# layout 1 only
# ---------------------------------------------------------------------------------------------
def test_bf16_activations_on_fma_path():
    # the fma path is integer decode + fp32 FMAs, so bf16 x (read as int32 pairs) runs anywhere;
    # the accumulation must equal the fp32-x path's bit for bit (the interpreter truncates when
    # it stores bf16, the GPU rounds to nearest: compare before the final rounding)
    for k in (94, 206):  # K % 16 != 0: the x pair loads must stop at K
        w = weight_with_escapes(40, k, seed=k)
        p = pack(w, 1).to(DEV)
        x = torch.randn(2, k, device=DEV).bfloat16()
        for cfg in (CONFIGS[1]["fma-m1"], CONFIGS[1]["fma-m2-split"]):
            y = linear_bf12(x, p, config=cfg)
            y32 = linear_bf12(x.float(), p, config=cfg)
            assert y.dtype == torch.bfloat16
            if INTERPRETED:
                trunc = (y32.view(torch.int32) & -65536).view(torch.float32)
                assert torch.equal(y.float(), trunc)
            else:
                assert torch.equal(y, y32.bfloat16())


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
    p = pack(weight_with_escapes(8, 32, seed=0), 1).to(DEV)
    with pytest.raises(ValueError, match="features"):
        linear_bf12(torch.randn(2, 31, device=DEV), p)
    with pytest.raises(ValueError, match="bias"):
        linear_bf12(torch.randn(2, 32, device=DEV), p, bias=torch.randn(7, device=DEV))
    with pytest.raises(TypeError):
        linear_bf12(torch.randn(2, 32, device=DEV), torch.randn(8, 32))
    with pytest.raises(TypeError):
        linear_bf12(torch.randint(0, 3, (2, 32), device=DEV), p)
    p3 = pack(torch.randn(2, 4, 8).bfloat16(), 1).to(DEV)
    with pytest.raises(ValueError, match="2-D"):
        linear_bf12(torch.randn(1, 8, device=DEV), p3)
    if INTERPRETED:
        with pytest.raises(TypeError, match="bf16"):
            linear_bf12(torch.randn(1, 32).bfloat16(), p, config=CONFIGS[1]["dot"])
    with pytest.raises(ValueError, match="out"):
        linear_bf12(torch.randn(2, 32, device=DEV), p, out=torch.empty(2, 9, device=DEV))


# ---------------------------------------------------------------------------------------------
# bf16 on the GPU (compiled kernels, tensor cores; layout 2 also its asm decode), both layouts
# ---------------------------------------------------------------------------------------------
gpu = pytest.mark.gpu


def gpu_configs(layout: int, m: int) -> list:
    """The configs each layout's bf16 GPU check runs at M = ``m`` (None: the table's); fma only
    where it applies (M <= 4), and with the Triton decode as well as the asm one."""
    if layout == 1:
        bm = m_bucket(m)
        cfgs = [None, Bf12Config("dot", block_m=max(16, bm), block_n=32, block_j=4, split_k=2),
                Bf12Config("dot", block_m=max(16, bm), block_n=64, block_j=4, swap_ab=True)]
        if m <= 4:
            cfgs += [Bf12Config("fma", block_m=min(4, bm), block_n=32, block_j=16, use_asm=False, split_k=3)]
        return cfgs
    bm = 1 << (m - 1).bit_length()
    cfgs = [None, C2("dot", block_m=max(16, bm), block_n=32, block_k=64, split_k=2),
            C2("dot", block_m=max(16, bm), block_n=64, block_k=128, swap_ab=True),
            C2("dot", block_m=max(16, bm), block_n=64, block_k=64, use_asm=False)]
    if m <= 4:
        cfgs += [C2("fma", block_m=bm, block_n=16, block_k=256, split_k=3),
                 C2("fma", block_m=bm, block_n=32, block_k=128, use_asm=False)]
    return cfgs


@gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRETED, reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 33, 64])
@pytest.mark.parametrize("base", ["row", "tensor"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_gpu_matches_fp32_reference(layout, m, base):
    n, k = 1000, 2056
    w = weight_with_escapes(n, k, seed=m).cuda()
    p = pack(w, layout, base=base)
    assert torch.equal(p.unpack().view(torch.int16), w.view(torch.int16))
    x = torch.randn(m, k, device="cuda").bfloat16()
    bias = torch.randn(n, device="cuda").bfloat16()
    ref = ref64(x, w, bias)
    cublas = torch.nn.functional.linear(x, w, bias)
    for cfg in gpu_configs(layout, m):
        y = linear_bf12(x, p, bias, config=cfg)
        assert y.dtype == torch.bfloat16
        # bf16 output rounding dominates: as close to the fp64 result as cuBLAS is
        assert rel_err(y, ref) < 2 * rel_err(cublas, ref) + 1e-3, cfg
