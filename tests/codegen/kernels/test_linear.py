"""linear: GEMV / skinny-GEMM Triton kernels (+ fused RMSNorm prologue) against the reference."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import linear as L
from specc.models import ops

GEMV = L.LinearConfig("gemv", block_n=8, block_k=32, split_k=1)
GEMV_SPLIT = L.LinearConfig("gemv", block_n=16, block_k=16, split_k=3)
GEMV_ROWS = L.LinearConfig("gemv", block_m=4, block_n=8, block_k=32, split_k=1)
GEMV_ROWS_SPLIT = L.LinearConfig("gemv", block_m=2, block_n=16, block_k=16, split_k=3)
DOT_SWAP = L.LinearConfig("dot", block_m=16, block_n=16, block_k=32, split_k=1, swap_ab=True)
DOT_SPLIT = L.LinearConfig("dot", block_m=16, block_n=32, block_k=16, split_k=2, swap_ab=False)
DOT_PROLOGUE = L.LinearConfig("dot", block_m=16, block_n=16, block_k=32, split_k=2,
                              norm_prologue=True)
DOT_TMA = L.LinearConfig("dot", block_m=16, block_n=16, block_k=32, split_k=2, tma=True)
DOT_TMA_PROLOGUE = DOT_TMA.replace(norm_prologue=True, swap_ab=False)
CONFIGS = {"gemv": GEMV, "gemv_split": GEMV_SPLIT, "gemv_rows": GEMV_ROWS, "gemv_rows_split": GEMV_ROWS_SPLIT,
           "dot_swap": DOT_SWAP, "dot_split": DOT_SPLIT,
           "dot_prologue": DOT_PROLOGUE, "dot_tma": DOT_TMA, "dot_tma_prologue": DOT_TMA_PROLOGUE,
           "auto": None}


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("cfg", ["gemv", "gemv_split", "gemv_rows", "dot_swap", "dot_split", "dot_tma", "auto"])
@pytest.mark.parametrize("m,n,k", [(1, 37, 96), (3, 21, 100), (18, 33, 64)])
def test_linear_fp32(dev, cfg, m, n, k):
    torch.manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, device=dev)
    w = torch.randn(n, k, device=dev) * 0.1
    b = torch.randn(n, device=dev)
    y = L.linear(x, w, b, config=CONFIGS[cfg])
    ref = L.linear_reference(x.double(), w.double(), b.double())
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert _rel(y, ref) < 2e-6


@pytest.mark.parametrize("cfg", ["gemv", "gemv_split", "gemv_rows_split", "dot_swap", "dot_split", "dot_prologue",
                                 "dot_tma_prologue"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_residual_epilogue_equals_separate_add(dev, cfg, dtype):
    """residual + linear(x) in one kernel is bit-identical to the same kernel then a torch add
    (the product is rounded, then the sum), with and without the norm prologue."""
    torch.manual_seed(2)
    m, n, k = (1 if cfg in ("gemv", "gemv_split") else 6), 40, 96
    x = torch.randn(m, k, device=dev).to(dtype)
    w = (torch.randn(n, k, device=dev) * 0.1).to(dtype)
    r = torch.randn(m, n, device=dev).to(dtype)
    g = (1 + 0.1 * torch.randn(k, device=dev)).to(dtype)
    for norm in (None, g):
        fused = L.linear(x, w, None, norm_weight=norm, config=CONFIGS[cfg], residual=r)
        separate = r + L.linear(x, w, None, norm_weight=norm, config=CONFIGS[cfg])
        assert fused.dtype == dtype and torch.equal(fused, separate)


def test_linear_residual_is_checked(dev):
    x, w = torch.randn(2, 8, device=dev), torch.randn(4, 8, device=dev)
    with pytest.raises(ValueError, match="residual must be"):
        L.linear(x, w, residual=torch.zeros(2, 5, device=dev))
    with pytest.raises(ValueError, match="residual must be"):
        L.linear(x, w, residual=torch.zeros(2, 4, device=dev, dtype=torch.float16))


@pytest.mark.parametrize("cfg", ["gemv_split", "dot_swap", "dot_prologue", "dot_tma_prologue"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_norm_prologue(dev, cfg, dtype):
    torch.manual_seed(1)
    m, n, k = (1 if cfg.startswith("gemv") else 5), 19, 80
    x = (torch.randn(2, m, k, device=dev) * 3).to(dtype)
    w = (torch.randn(n, k, device=dev) * 0.1).to(dtype)
    g = (1 + 0.1 * torch.randn(k, device=dev)).to(dtype)
    y = L.linear(x, w, None, norm_weight=g, eps=1e-6, config=CONFIGS[cfg])
    assert y.shape == (2, m, n) and y.dtype == dtype
    # the prologue rounds exactly like ops.rms_norm: same as the plain kernel on the normed x
    h = ops.rms_norm(x, g, 1e-6)
    y_unfused = L.linear(h, w, None, config=CONFIGS[cfg])
    if dtype == torch.float32:
        assert _rel(y, L.linear_reference(x.double(), w.double(), None, g.double(), 1e-6)) < 2e-6
        assert _rel(y, y_unfused) < 2e-6
    else:
        # rstd may differ from torch's in the last fp32 bit: a rare one-ulp flip of h
        assert _rel(y, y_unfused) < 2e-3
        assert _rel(y, L.linear_reference(x.float(), w.float(), None, g.float(), 1e-6)) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", ["gemv", "dot_split"])
def test_linear_half_dtypes(dev, dtype, cfg):
    torch.manual_seed(2)
    m = 1 if cfg == "gemv" else 7
    x = torch.randn(m, 64, device=dev).to(dtype)
    w = (torch.randn(40, 64, device=dev) * 0.1).to(dtype)
    b = torch.randn(40, device=dev).to(dtype)
    y = L.linear(x, w, b, config=CONFIGS[cfg])
    ref = L.linear_reference(x.float(), w.float(), b.float()).to(dtype)  # one rounding
    assert y.dtype == dtype
    ulp = 2.0 ** (-10 if dtype == torch.float16 else -7)
    assert ((y.float() - ref.float()).abs() <= ulp * ref.float().abs() + 1e-3).all()


@pytest.mark.parametrize("swap_ab", [True, False])
def test_tma_loads_equal_pointer_loads(dev, swap_ab):
    """TMA tiles (zero-filled past M, N and K) give the pointer-load kernel's bits, and an
    operand TMA cannot describe (misaligned base) falls back to pointer loads."""
    torch.manual_seed(4)
    plain = DOT_SWAP.replace(split_k=3, swap_ab=swap_ab, block_k=16)
    tma = plain.replace(tma=True)
    for m, n, k in [(5, 37, 96), (18, 33, 80)]:
        x = torch.randn(m, k + 4, device=dev)
        w = torch.randn(n, k, device=dev) * 0.1
        for xs in (x[:, :k], x[:, 1:k + 1]):  # 16-byte aligned base, then misaligned by 4 bytes
            assert L._use_tma(xs, w) == (xs.data_ptr() % 16 == 0)
            assert torch.equal(L.linear(xs, w, config=tma), L.linear(xs, w, config=plain))
    with pytest.raises(ValueError, match="tma"):
        L.LinearConfig("gemv", tma=True)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_rstd_in_kernel_equals_pre_kernel(dev, split, dtype):
    """The GEMV's in-kernel row statistics give the pre-kernel's bits (one shared code path),
    with K not a multiple of the block and with split-K programs that each see part of K."""
    torch.manual_seed(6)
    x = (torch.randn(3, 2, 200, device=dev) * 2).to(dtype)
    w = (torch.randn(40, 200, device=dev) * 0.1).to(dtype)
    g = (1 + 0.1 * torch.randn(200, device=dev)).to(dtype)
    cfg = GEMV.replace(split_k=split)
    fused = L.linear(x, w, None, g, 1e-5, config=cfg)
    assert torch.equal(fused, L.linear(x, w, None, g, 1e-5, config=cfg.replace(rstd_in_kernel=False)))
    assert _rel(fused, L.linear_reference(x.double(), w.double(), None, g.double(), 1e-5)) < (
        2e-6 if dtype == torch.float32 else 1e-2)


# (M, BLOCK_M): every row count of the multi-row GEMV's range against every row tile: one
# partial tile (3 / 4, 5 / 8), several tiles with a partial last one (3 / 2, 5 / 2, 5 / 4)
ROWS_TILES = [(m, bm) for m in (2, 3, 5, 8) for bm in (2, 4, 8)]


def _same_rows(dev, a, b, tol):
    """The multi-row GEMV's rows against the one-row GEMV's: the same bits under the interpreter
    (same products, same per-row K order); on the GPU the K reduction's order follows the
    register layout Triton picks for each kernel's accumulator, so only values are compared."""
    if dev == "cpu":
        assert torch.equal(a, b)
    else:
        assert _rel(a, b) < tol


@pytest.mark.parametrize("m,bm", ROWS_TILES)
def test_gemv_rows_equal_one_row_gemv(dev, m, bm):
    """The multi-row GEMV (block_m > 1) computes each row with the one-row GEMV's accumulator,
    summation order and roundings: the same bits as block_m = 1 at the same block_n, block_k
    and split (N and K not multiples of the tiles, bias; split-K on every other case, the
    prefetch of the next weight tile (num_stages 2) at block_m 2 and 8), and the reference's
    values."""
    torch.manual_seed(10 * m + bm)
    n, k = 21, 100
    x = torch.randn(m, k, device=dev)
    w = torch.randn(n, k, device=dev) * 0.1
    b = torch.randn(n, device=dev)
    one = L.LinearConfig("gemv", block_m=1, block_n=8, block_k=32, split_k=3 if (m + bm) % 2 else 1)
    rows = one.replace(block_m=bm, num_stages=1 if bm == 4 else 2)
    y = L.linear(x, w, b, config=rows)
    assert y.shape == (m, n) and y.dtype == torch.float32
    _same_rows(dev, y, L.linear(x, w, b, config=one), 2e-6)
    assert _rel(y, L.linear_reference(x.double(), w.double(), b.double())) < 2e-6


@pytest.mark.parametrize("rstd_in_kernel", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,bm,split,stages", [(3, 2, 1, 1), (5, 4, 2, 2)])
def test_gemv_rows_norm_prologue_and_residual(dev, m, bm, split, stages, dtype, rstd_in_kernel):
    """The fused RMSNorm prologue on the multi-row GEMV (each row its own statistics, computed in
    the kernel or by the pre-kernel) with bias and the residual epilogue: the one-row GEMV's
    bits, and rms_norm then the plain kernel / the reference."""
    torch.manual_seed(7 * m + split)
    n, k = 19, 80
    x = (torch.randn(m, k, device=dev) * 3).to(dtype)
    w = (torch.randn(n, k, device=dev) * 0.1).to(dtype)
    b = torch.randn(n, device=dev).to(dtype)
    g = (1 + 0.1 * torch.randn(k, device=dev)).to(dtype)
    r = torch.randn(m, n, device=dev).to(dtype)
    one = L.LinearConfig("gemv", block_n=8, block_k=32, split_k=split, rstd_in_kernel=rstd_in_kernel)
    rows = one.replace(block_m=bm, num_stages=stages)
    y = L.linear(x, w, b, g, 1e-6, config=rows, residual=r)
    assert y.dtype == dtype
    _same_rows(dev, y, L.linear(x, w, b, g, 1e-6, config=one, residual=r), 2e-6 if dtype == torch.float32 else 2e-3)
    assert torch.equal(y, r + L.linear(x, w, b, g, 1e-6, config=rows))
    y = L.linear(x, w, b, g, 1e-6, config=rows)
    if dtype == torch.float32:
        ref = L.linear_reference(x.double(), w.double(), b.double(), g.double(), 1e-6)
        assert _rel(y, ref) < 2e-6
    else:  # rstd may differ from torch's in the last fp32 bit: a rare one-ulp flip of h
        assert _rel(y, L.linear(ops.rms_norm(x, g, 1e-6), w, b, config=rows)) < 2e-3


def test_gemv_rows_x_layouts_and_lead_dims(dev):
    """x as the accumulator-shaped broadcast (x_2d, the default without a norm) or as a
    [BLOCK_M, BLOCK_K] tile gives the one-row GEMV's bits (interpreter), also for x with leading
    dims and a row stride."""
    torch.manual_seed(8)
    x = torch.randn(2, 3, 72, device=dev)[..., :64]  # rows 72 apart
    w = torch.randn(24, 64, device=dev) * 0.1
    y = L.linear(x, w, config=GEMV_ROWS)
    assert y.shape == (2, 3, 24)
    _same_rows(dev, y, L.linear(x, w, config=GEMV_ROWS.replace(x_2d=False)), 2e-6)
    _same_rows(dev, y, L.linear(x, w, config=GEMV_ROWS.replace(block_m=1)), 2e-6)


def test_gemv_rows_split_plan_counts_row_tiles(dev):
    """Automatic split-K of the multi-row GEMV counts row tiles, not rows (block_m = 1: the
    rows, as before)."""
    one = L.LinearConfig("gemv", block_n=16, block_k=64, split_k=0)
    cpu = torch.device("cpu")
    n, k = 4096, 4096
    for m in (1, 4, 8):
        assert L._split_plan(one.replace(block_m=4), m, n, k, cpu) == L._split_plan(
            one, -(-m // 4), n, k, cpu)
    assert L._split_plan(one.replace(block_m=8), 5, n, k, cpu) == L._split_plan(one, 1, n, k, cpu)


def test_linear_bf16_weight_fp32_activations(dev):
    torch.manual_seed(3)
    x = torch.randn(3, 48, device=dev)
    w = torch.randn(24, 48, device=dev).bfloat16()
    y = L.linear(x, w, config=DOT_SWAP)
    assert y.dtype == torch.float32
    assert _rel(y, x.double() @ w.double().T) < 2e-6


def test_split_k_deterministic_and_reusable(dev):
    torch.manual_seed(4)
    x = torch.randn(1, 128, device=dev)
    w = torch.randn(50, 128, device=dev)
    y1 = L.linear(x, w, config=GEMV_SPLIT)
    y2 = L.linear(x, w, config=GEMV_SPLIT)
    x2 = torch.randn(1, 128, device=dev)
    y3 = L.linear(x2, w, config=GEMV_SPLIT)
    assert torch.equal(y1, y2)
    assert _rel(y3, x2.double() @ w.double().T) < 2e-6


def test_empty_and_lead_dims(dev):
    w = torch.randn(8, 16, device=dev)
    assert L.linear(torch.randn(0, 16, device=dev), w).shape == (0, 8)
    y = L.linear(torch.randn(2, 3, 16, device=dev), w)
    assert y.shape == (2, 3, 8)


def test_errors(dev):
    w = torch.randn(8, 16, device=dev)
    with pytest.raises(ValueError, match="expects"):
        L.linear(torch.randn(2, 15, device=dev), w)
    with pytest.raises(ValueError, match="bias"):
        L.linear(torch.randn(2, 16, device=dev), w, torch.randn(7, device=dev))
    with pytest.raises(ValueError, match="norm_weight"):
        L.linear(torch.randn(2, 16, device=dev), w, norm_weight=torch.randn(8, device=dev))
    with pytest.raises(TypeError):
        L.linear(torch.randn(2, 16, device=dev).long(), w)
    with pytest.raises(ValueError, match="power of two"):
        L.LinearConfig("gemv", block_n=12)
    with pytest.raises(ValueError, match=">= 16"):
        L.LinearConfig("dot", block_m=8)
    with pytest.raises(ValueError, match="power of two"):
        L.LinearConfig("gemv", block_m=3)
    with pytest.raises(ValueError, match="block_m 1 .. 8"):  # the old default, recorded in JSON
        L.LinearConfig("gemv", block_m=16)
    # block_m left out: the kind's default (the one-row GEMV; the 16-row tensor-core tile)
    assert L.LinearConfig("gemv").block_m == 1 and L.LinearConfig("dot").block_m == 16
    assert L.LinearConfig(**{"kind": "gemv", "block_n": 8}).block_m == 1


def test_dot_norm_without_prologue_equals_rms_norm_then_linear(dev, monkeypatch):
    torch.manual_seed(5)
    x = torch.randn(4, 64, device=dev).bfloat16()
    w = (torch.randn(24, 64, device=dev) * 0.1).bfloat16()
    g = (1 + 0.1 * torch.randn(64, device=dev)).bfloat16()
    from specc.codegen.kernels import rmsnorm as N

    y = L.linear(x, w, None, g, 1e-6, config=DOT_SWAP)  # norm_prologue None: pre-normalise
    assert torch.equal(y, L.linear(N.rms_norm(x, g, 1e-6), w, config=DOT_SWAP))


def test_config_table():
    assert [L.m_bucket(m) for m in (1, 2, 3, 5, 16, 17, 64, 65, 1000)] == [1, 2, 4, 8, 16, 32,
                                                                          64, 128, 256]
    assert L.get_config(1, 4096, 4096).kind == "gemv"
    assert L.get_config(16, 4096, 4096).kind == "dot"
    # measured table entries (Qwen3-8B), buckets 2 and 8 share the M = 4 / 16 winners except
    # where the multi-row GEMV won at M = 2 (qkv, o, down; gate_up keeps the dot kernel)
    assert (1, 151936, 4096) in L.DEFAULT_CONFIGS and (64, 4096, 12288) in L.DEFAULT_CONFIGS
    assert L.get_config(2, 24576, 4096) == L.get_config(4, 24576, 4096)
    two = L.get_config(2, 4096, 4096)
    assert (two.kind, two.block_m) == ("gemv", 2) and L.weight_passes(2, 4096, 4096) == 1
    assert L.get_config(7, 6144, 4096) == L.get_config(16, 6144, 4096)
    h = L.get_config(1, 1000, 2048)
    assert (h.kind, h.block_n, h.block_k) == ("gemv", 4, 1024)
    c = L.LinearConfig("gemv", block_n=32, block_k=128, split_k=2)
    try:
        L.set_config(1, 100, 200, c)
        assert L.get_config(1, 100, 200) is c
        L.set_config(3, 100, 200, {"kind": "dot", "block_m": 16, "block_n": 16, "block_k": 16})
        assert L.get_config(4, 100, 200).block_k == 16
    finally:
        L.clear_configs()
    assert L.get_config(1, 100, 200) != c


def test_weight_passes_count_row_tiles():
    """One weight pass per row tile: the default configs cover up to 64 rows in one tile and
    65..128 rows in two 64-row tiles (one 128-row tile measured slower on the H200); the one-row
    GEMV streams the weight once per row, the multi-row GEMV once per block_m rows."""
    for m in (2, 16, 17, 32, 33, 64):
        assert L.weight_passes(m, 6144, 4096) == 1, (m, L.get_config(m, 6144, 4096))
    assert L.weight_passes(65, 4096, 4096) == L.weight_passes(128, 4096, 4096) == 2
    assert L.weight_passes(129, 4096, 4096) == 3
    assert L.weight_passes(3, 4096, 4096, config=GEMV) == 3
    # the multi-row GEMV: once per block_m rows
    for m, bm, passes in [(1, 2, 1), (2, 2, 1), (3, 2, 2), (4, 4, 1), (5, 4, 2), (8, 4, 2), (5, 8, 1),
                          (8, 8, 1), (8, 2, 4), (9, 8, 2)]:
        assert L.weight_passes(m, 4096, 4096, config=GEMV.replace(block_m=bm)) == passes, (m, bm)
    one = L.LinearConfig("dot", block_m=128, block_n=64, block_k=64, swap_ab=True)
    assert L.weight_passes(65, 4096, 4096, config=one) == 1


@pytest.mark.parametrize("m", [17, 65])
def test_linear_one_row_tile_configs_fp32(dev, m):
    """A 32-row tile over 17 rows (the tuned 32 bucket's form) and a 128-row tile over 65 rows
    (the one-tile alternative profile_tree times) compute the linear exactly."""
    torch.manual_seed(m)
    n, k = 72, 256
    x = torch.randn(m, k, device=dev)
    w = torch.randn(n, k, device=dev) * 0.1
    cfg = L.LinearConfig("dot", block_m=32 if m <= 32 else 128, block_n=64, block_k=64, swap_ab=True)
    y = L.linear(x, w, None, config=cfg)
    assert _rel(y, L.linear_reference(x.double(), w.double())) < 2e-6


def test_cpu_fallback_without_interpreter(monkeypatch):
    monkeypatch.setattr(L, "use_triton", lambda *t: False)
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    g = torch.rand(16) + 0.5
    assert torch.equal(L.linear(x, w, None, g, 1e-5), L.linear_reference(x, w, None, g, 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 64, 65, 128])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("tma", [False, True])
def test_linear_bf16_gpu(m, norm, tma):
    torch.manual_seed(m)
    n, k = 3000, 1024
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 0.05).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16()
    g = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16() if norm else None
    cfg = L.get_config(m, n, k)
    if tma:
        if cfg.kind != "dot":
            pytest.skip("TMA is a dot-kernel option")
        cfg = cfg.replace(tma=True)
    y = L.linear(x, w, b, g, 1e-6, config=cfg)
    ref = L.linear_reference(x.float(), w.float(), b.float(), None if g is None else g.float(), 1e-6)
    assert _rel(y, ref) < 1e-2
