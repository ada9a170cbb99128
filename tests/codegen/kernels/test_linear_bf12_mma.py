"""The bf12 tensor-core kernel for 1 .. 32 rows (specc.codegen.kernels.linear_bf12_mma).

On the CPU: the kernel replayed in torch (index mapping, decode, warp / CTA / split sums, the
rows' power of two, the escape fix-up, the bias) equals x @ W^T + bias on the unpacked weights;
the dispatch rules; the config choice; the CUDA source compiles for sm_90 (NVRTC, where
installed). On a GPU (marked gpu): the kernel against the fp32 reference with escapes of every
kind, the same bits on every call and in a CUDA graph, and linear_bf12's dispatch to it."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import linear_bf12_mma as mma
from specc.codegen.kernels.linear_bf12 import linear_bf12
from specc.formats.bf12 import pack_bf16_12bit

gpu = pytest.mark.gpu


def _weights(n: int, k: int, seed: int, escapes: bool = True, scale: float = 0.02) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * scale).to(torch.bfloat16)
    if escapes:  # a zero, a subnormal, outliers on both sides of the window, two escapes in one row
        w[0, 1] = 0.0
        w[1, 70] = 1e-39
        w[2, 5], w[2, 6] = 300.0, -1e-12
        w[n - 1, k - 1] = -2.0 ** 20
    return w


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.float() @ w.float().T
    return y if bias is None else y + bias.float()


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("m,cfg,base", [
    (1, mma.Bf12MmaConfig(unroll=1, warps=4), "row"),
    (5, mma.Bf12MmaConfig(unroll=2, warps=4, splits=2), "row"),
    (9, mma.Bf12MmaConfig(unroll=1, warps=8, splits=4, prefetch=True), "tensor"),
    (16, mma.Bf12MmaConfig(unroll=2, warps=4), "row"),
    (24, mma.Bf12MmaConfig(unroll=1, warps=4, splits=2), "row"),  # four 8-row x tiles, the last one short
    (32, mma.Bf12MmaConfig(unroll=2, warps=8), "tensor"),
])
def test_emulated_kernel_is_the_matmul_with_escapes_and_bias(m, cfg, base, version):
    """The kernel's reads (layout 2's rows, or layout 3's tiles: plane_strides on the flat
    planes), decode, MMA fragments and sums equal the matmul on the unpacked weights."""
    w = _weights(32, 512, seed=m)
    packed = pack_bf16_12bit(w, version=version, base=base)
    assert packed.esc_idx.numel() >= 5  # the planted escapes (and the tensor window's own)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, 512, generator=g).to(torch.bfloat16).float()
    bias = torch.randn(32, generator=g).to(torch.bfloat16)
    got = mma.emulate(x, packed, bias, cfg)
    want = _reference(x, w, bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("m,cfg", [(3, mma.Bf12MmaConfig(unroll=1, warps=4)),
                                   (12, mma.Bf12MmaConfig(unroll=2, warps=4, splits=2))])
def test_emulated_norm_prologue_and_residual_are_the_separate_ops(m, cfg):
    """The fused RMSNorm prologue normalizes x as ops.rms_norm does (its two roundings), the
    escape fix-up sees the normalized x, and the residual is added to the rounded product and
    rounded again: the result is ``residual + linear(rms_norm(x))`` as three ops."""
    from specc.models import ops

    w = _weights(32, 256, seed=20 + m)
    packed = pack_bf16_12bit(w, version=2)
    g = torch.Generator().manual_seed(m)
    x = (torch.randn(m, 256, generator=g) * 3).to(torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(256, generator=g)).to(torch.bfloat16)
    residual = torch.randn(m, 32, generator=g).to(torch.bfloat16)
    h = ops.rms_norm(x, norm_w, 1e-6)
    got = mma.emulate(x.float(), packed, None, cfg, norm_weight=norm_w, eps=1e-6)
    torch.testing.assert_close(got, h.float() @ w.float().T, rtol=1e-5, atol=1e-3)
    fused = mma.emulate(x.float(), packed, None, cfg, norm_weight=norm_w, eps=1e-6, residual=residual)
    want = residual + (h.float() @ w.float().T).to(torch.bfloat16)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), want.float(), rtol=2 ** -7, atol=1e-2)


def test_emulated_escapes_carry_inf_and_nan():
    w = _weights(16, 128, seed=3, escapes=False)
    w[4, 10], w[7, 3] = float("inf"), float("nan")
    packed = pack_bf16_12bit(w, version=2)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).float()
    got = mma.emulate(x, packed)
    want = _reference(x, w, None)
    assert torch.isinf(got[:, 4]).all() and torch.isnan(got[:, 7]).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4, equal_nan=True)


def test_decode_is_the_weight_times_the_rows_power_of_two():
    w = _weights(16, 64, seed=5, escapes=False)
    packed = pack_bf16_12bit(w, version=2)
    codes = torch.stack([packed.ex[:, 16 * (k // 32) + k % 16] >> (4 * ((k // 16) % 2)) & 0xF for k in range(64)], 1)
    dec = mma.decode_constant_exponent(packed.sm[:, :64], codes)
    scale = torch.pow(2.0, packed.base.float() - 112)[:, None]
    assert torch.equal(dec * scale, w.float())


def _prmt(a: int, sel: int) -> int:
    """PTX ``prmt.b32 d, a, 0, sel`` (default mode): result byte i is input byte ``sel``'s nibble i
    (0-3 of a, 4-7 of the zero word), or that byte's sign replicated when the nibble's bit 3 is set."""
    src = [(a >> (8 * j)) & 0xFF for j in range(4)] + [0, 0, 0, 0]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        out |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * i)
    return out


def test_kernel_decode_by_byte_permutes_is_the_format_decode():
    """cuda/linear_bf12_mma.cu's decode_pair / biased_codes (PRMT with sign replication, one
    mask) give decode_constant_exponent's bits for every sign|mantissa byte, code and nibble."""
    import random

    rng = random.Random(0)
    for _ in range(400):
        smw = rng.getrandbits(32)
        codes = [rng.randrange(16) for _ in range(8)]  # low and high nibbles of 4 code bytes
        codew = sum((codes[j] | codes[4 + j] << 4) << (8 * j) for j in range(4))
        for high in (0, 1):
            bcodes = (((codew >> (4 * high)) & 0x0F0F0F0F) + 0x70707070) & 0xFFFFFFFF
            for pair, (ssel, csel) in enumerate(((0x9180, 0x4140), (0xB3A2, 0x4342))):
                word = (_prmt(smw, ssel) & 0x807F807F) | ((_prmt(bcodes, csel) << 7) & 0xFFFFFFFF)
                for h in (0, 1):
                    j = 2 * pair + h
                    sm = torch.tensor([(smw >> (8 * j)) & 0xFF], dtype=torch.uint8)
                    code = torch.tensor([codes[4 * high + j]], dtype=torch.uint8)
                    want = int(mma.decode_constant_exponent(sm, code).view(torch.int32)) >> 16 & 0xFFFF
                    assert (word >> (16 * h)) & 0xFFFF == want
    for b in range(256):  # every sign|mantissa byte, code 0 and 15
        for c in (0, 15):
            word = (_prmt(b, 0x9180) & 0x807F807F) | ((_prmt(c + 0x70, 0x4140) << 7) & 0xFFFFFFFF)
            want = int(mma.decode_constant_exponent(torch.tensor([b], dtype=torch.uint8),
                                                    torch.tensor([c], dtype=torch.uint8)).view(torch.int32)) >> 16
            assert word & 0xFFFF == want & 0xFFFF


def test_unsupported_reasons(monkeypatch):
    w = _weights(32, 128, seed=6)
    v2, v1 = pack_bf16_12bit(w, version=2), pack_bf16_12bit(w, version=1)
    x = torch.randn(4, 128).to(torch.bfloat16)
    assert "layout version 1" in mma.unsupported_reason(x, v1)
    assert mma.unsupported_reason(x, pack_bf16_12bit(w, version=3)) == "device cpu"  # layout 3: the same rules
    assert "rows" in mma.unsupported_reason(torch.zeros(33, 128, dtype=torch.bfloat16), v2)
    assert mma.unsupported_reason(torch.zeros(32, 128, dtype=torch.bfloat16), v2) == "device cpu"  # two launches
    assert "float32" in mma.unsupported_reason(x.float(), v2)
    assert "aligned" in mma.unsupported_reason(torch.zeros(4, 129, dtype=torch.bfloat16)[:, 1:], v2)
    assert "K % 64" in mma.unsupported_reason(x[:, :96], pack_bf16_12bit(w[:, :96], version=2))
    assert "N % 16" in mma.unsupported_reason(x, pack_bf16_12bit(w[:24], version=2))
    assert "bias" in mma.unsupported_reason(x, v2, torch.zeros(32))
    assert "norm weight" in mma.unsupported_reason(x, v2, norm_weight=torch.ones(96, dtype=torch.bfloat16))
    assert "residual" in mma.unsupported_reason(x, v2, residual=torch.zeros(4, 31, dtype=torch.bfloat16))
    # the epilogue stages bias and residual by 4-byte copies, a fused norm the rows in shared memory
    odd_bias = torch.zeros(33, dtype=torch.bfloat16)[1:]
    assert "bias not 4-byte aligned" in mma.unsupported_reason(x, v2, odd_bias)
    odd_res = torch.zeros(4, 33, dtype=torch.bfloat16)[:, 1:]
    assert "residual rows not 4-byte aligned" in mma.unsupported_reason(x, v2, residual=odd_res)
    wide = pack_bf16_12bit(_weights(16, 2048, seed=8), version=2)
    x16 = torch.zeros(16, 2048, dtype=torch.bfloat16)
    assert "fused norm over 16 x 2048" in mma.unsupported_reason(x16, wide, norm_weight=torch.ones(2048, dtype=torch.bfloat16))
    ok = mma.unsupported_reason(x, v2, norm_weight=torch.ones(128, dtype=torch.bfloat16),
                                residual=torch.zeros(4, 32, dtype=torch.bfloat16))
    assert ok == "device cpu"
    assert mma.unsupported_reason(x, v2) == "device cpu"  # every rule but the device holds
    monkeypatch.setenv(mma.ENV, "0")
    assert mma.unsupported_reason(x, v2) == f"{mma.ENV}=0"
    monkeypatch.delenv(mma.ENV)
    from specc.codegen.kernels.batch_invariant import batch_invariant

    with batch_invariant():
        assert "batch-invariant" in mma.unsupported_reason(x, v2)


@pytest.mark.parametrize("m", [16, 17, 24, 32])
def test_up_to_32_rows_are_one_launch_with_the_residual(monkeypatch, m):
    """Up to 32 rows (a DFlash drafter's context + block, a B = 2 verify, a bs1 tree of 31 nodes)
    run as one launch over the whole of x, the residual and the output (a stand-in extension
    computes it with the emulated kernel, whose four-tile instance covers 17 .. 32 rows), sized
    for its split-K workspace; the result is residual + the rounded matmul."""
    w = _weights(32, 256, seed=m)
    packed = pack_bf16_12bit(w, version=3)
    cfg = mma.Bf12MmaConfig(unroll=1, warps=4, splits=2)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=g).to(torch.bfloat16)
    res = torch.randn(m, 32, generator=g).to(torch.bfloat16)
    bias = torch.randn(32, generator=g).to(torch.bfloat16)
    launched = []

    class Ext:
        @staticmethod
        def bf12_mma_out(x2, *args):
            y, residual, ws = args[15], args[13], args[16]
            assert x2.shape[0] <= mma.MAX_ROWS and y.shape[0] == x2.shape[0] == residual.shape[0]
            # sized for the four-tile instance at any row count (graphs keep their workspace)
            assert ws.numel() >= cfg.splits * (32 // 16) * 32 * 4 * 4
            launched.append((x2.data_ptr(), y.data_ptr()))
            y.copy_(mma.emulate(x2.float(), packed, bias, cfg, residual=residual))

    monkeypatch.setattr(mma, "unsupported_reason", lambda *a, **k: None)
    monkeypatch.setattr(mma, "extension", lambda device: Ext)
    got = mma.linear_bf12_mma(x, packed, bias, cfg, residual=res)
    assert launched == [(x.data_ptr(), got.data_ptr())]
    want = (res.float() + _reference(x.float(), w, bias).to(torch.bfloat16).float()).to(torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=2e-2)
    assert mma.launches_for(m) == 1 and mma.launches_for(33) == 0 and mma.launches_for(0) == 0
    assert mma.x_tiles(m) == (2 if m <= 16 else 4) and mma.x_tiles(8) == 1 and mma.x_tiles(9) == 2


def test_emulated_rows_do_not_depend_on_the_x_tiles_beside_them():
    """Each output row's sum is its own: 32 rows in the four-tile instance give each 16-row
    slice's result bit for bit (what the GPU test checks of the kernel itself)."""
    w = _weights(32, 512, seed=5)
    packed = pack_bf16_12bit(w, version=3)
    cfg = mma.Bf12MmaConfig(unroll=2, warps=4, splits=2)
    x = torch.randn(32, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).float()
    whole = mma.emulate(x, packed, None, cfg)
    assert torch.equal(whole, torch.cat([mma.emulate(x[s:s + 16], packed, None, cfg) for s in (0, 16)]))


def test_cpu_calls_fall_back_and_an_explicit_config_says_why():
    w = _weights(32, 128, seed=7)
    packed = pack_bf16_12bit(w, version=2)
    x = torch.randn(3, 128).to(torch.bfloat16)
    assert mma.linear_bf12_mma(x, packed) is None
    with pytest.raises(ValueError, match="cannot run: device cpu"):
        linear_bf12(x, packed, config=mma.Bf12MmaConfig())


def test_kernel_abi_runs_the_norm_kernel_first_at_every_row_count():
    """Run 29 (H100): the packed AR step is faster with the rms_norm kernel before the tensor-core
    kernel than with the kernel's own prologue, so kernel_abi never fuses it."""
    assert mma.FUSED_NORM_MAX_ROWS == 0
    assert not any(mma.fuses_norm(rows, 4096) for rows in (1, 2, 16))


def test_norm_would_fuse_only_within_the_shared_memory_stage(monkeypatch):
    monkeypatch.setattr(mma, "FUSED_NORM_MAX_ROWS", 1)
    assert mma.fuses_norm(1, 4096) and mma.fuses_norm(1, mma.FUSED_NORM_MAX_STAGED_BYTES // 2)
    assert not mma.fuses_norm(1, mma.FUSED_NORM_MAX_STAGED_BYTES // 2 + 64)  # kernel_abi runs rms_norm first
    assert not mma.fuses_norm(2, 1024)  # every CTA would read all rows whole (FUSED_NORM_MAX_ROWS)


def test_config_by_waves_of_row_blocks():
    C = mma.Bf12MmaConfig
    assert mma.get_config(1, 4096, 12288, 132) == C(unroll=2, warps=8, prefetch=True)  # down: one wave
    assert mma.get_config(1, 6144, 4096, 132) == C(unroll=2, warps=4, prefetch=True)  # qkv: 2.9 blocks an SM (run 29)
    assert mma.get_config(16, 6144, 4096, 132) == C(unroll=2, warps=4, prefetch=True)  # two x tiles
    assert mma.get_config(16, 151936, 4096, 132) == C(unroll=2, warps=4, prefetch=True)  # lm_head: turnover
    assert mma.get_config(1, 4096, 4096, 132, fused_norm=True) == mma.get_config(1, 4096, 4096, 132)


def test_config_above_16_rows_by_waves():
    """17-32 rows run the four-tile instance, whose x registers double: 1 super-group x 8 warps
    up to 2 waves of blocks (o, down, a DFlash drafter's K/V), 2 x 4 up to 4 (qkv), 1 x 4 above
    (gate_up, lm_head); the H100 sweep at 24 and 32 rows (docs/benchmarks/run34.md)."""
    want = {(4096, 4096): (1, 8), (4096, 12288): (1, 8), (2048, 4096): (1, 8), (6144, 4096): (2, 4),
            (24576, 4096): (1, 4), (151936, 4096): (1, 4)}
    for (n, k), (unroll, warps) in want.items():
        for m in (17, 24, 32):
            assert mma.get_config(m, n, k, 132) == mma.Bf12MmaConfig(unroll=unroll, warps=warps, prefetch=True)
    assert mma.get_config(16, 4096, 4096, 132).unroll == 2  # the 16-row rule unchanged


def test_config_splits_small_layers_only():
    assert mma.get_config(16, 4096, 12288, 132).splits == 1
    small = mma.get_config(1, 256, 1024, 132)  # 16 row blocks on 132 SMs
    assert small.splits == 2 and 1024 % (64 * small.splits) == 0
    assert mma.get_config(1, 256, 4096, 132).splits == 8
    with pytest.raises(ValueError):
        mma.Bf12MmaConfig(unroll=3)


def test_a_bad_l2_prefetch_setting_is_refused(monkeypatch):
    monkeypatch.setenv(mma.L2_PREFETCH_ENV, "64")
    with pytest.raises(ValueError, match="use 0, 128 or 256"):
        mma._build("90")


def test_cuda_source_compiles_for_sm90():
    try:
        ptx = mma.compile_check()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    instances = len(mma.X_TILES) * len(mma.UNROLLS) * len(mma.WARPS) * 2  # x tiles, unroll, warps, prefetch
    assert ".target sm_90" in ptx and ptx.count(".entry") == instances and "mma.sync.aligned.m16n8k16" in ptx
    assert "L2::256B" in ptx and "L2::" not in mma.compile_check(l2_prefetch=0)  # the default hint, and without


def test_cuda_source_and_host_launch_compile_with_nvcc(tmp_path):
    """Where nvcc is installed (no GPU needed): the kernel file with its host launch compiles for
    sm_90 as the extension builds it, every instance, and the launches engines run spill no
    registers."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    proc = subprocess.run([nvcc, "-O3", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"),
                           f"-DSKINNY_L2_PREFETCH={mma.L2_PREFETCH_DEFAULT}", "-Xptxas", "-v",
                           str(mma.CUDA_DIR / "linear_bf12_mma.cu")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import re

    blocks = proc.stderr.split("Compiling entry function '")[1:]  # ptxas -v: one block per kernel
    entries = [(b.split("'")[0], re.search(r"(\d+) bytes spill stores", b).group(1)) for b in blocks]
    assert len(entries) == len(mma.X_TILES) * len(mma.UNROLLS) * len(mma.WARPS) * 2
    # the instances get_config picks for the Qwen3-8B layer shapes at 1, 16 and 32 rows spill nothing
    spills = {name.split("EvPK")[0]: n for name, n in entries}
    for m in (1, 16, 32):
        for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)):
            cfg = mma.get_config(m, n, k, 132)
            name = f"_Z8bf12_mmaILi{mma.x_tiles(m)}ELi{cfg.unroll}ELi{cfg.warps}ELb{int(cfg.prefetch)}E"
            assert spills[name] == "0", (m, n, k, name, spills)


# --------------------------------------------------------------------------- GPU


def _gpu_case(n, k, m, seed, base="row", bias=True):
    dev = torch.device("cuda")
    w = _weights(n, k, seed).to(dev)
    packed = pack_bf16_12bit(w, version=2, base=base)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
    b = torch.randn(n, device=dev, generator=g).to(torch.bfloat16) if bias else None
    return w, packed, x, b


@gpu
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 16])
@pytest.mark.parametrize("cfg", [mma.Bf12MmaConfig(), mma.Bf12MmaConfig(unroll=2, warps=4, splits=2, prefetch=True),
                                 mma.Bf12MmaConfig(unroll=1, warps=8, splits=4, prefetch=True)])
def test_gpu_kernel_matches_the_fp32_reference(m, cfg):
    assert mma.extension(torch.device("cuda")) is not None, "the extension did not build"
    w, packed, x, b = _gpu_case(256, 1024, m, seed=m)
    got = mma.linear_bf12_mma(x, packed, b, cfg)
    want = _reference(x, w, b)
    ref_bf16 = torch.nn.functional.linear(x, w, b).float()  # cuBLAS: its own rounding, the yardstick
    tol = 2 * float((ref_bf16 - want).abs().max()) + 1e-2
    assert float((got.float() - want).abs().max()) <= tol
    again = mma.linear_bf12_mma(x, packed, b, cfg)
    assert torch.equal(got, again)  # deterministic, split-K included


@gpu
@pytest.mark.parametrize("m", [17, 24, 32])
@pytest.mark.parametrize("cfg", [None, mma.Bf12MmaConfig(unroll=2, warps=4, splits=2, prefetch=True),
                                 mma.Bf12MmaConfig(unroll=1, warps=8, splits=4, prefetch=True)])
def test_gpu_32_row_instance_gives_each_16_row_slice_its_bits(m, cfg):
    """17 .. 32 rows (a DFlash drafter's context + block, a B = 2 verify, a bs1 tree) in one launch
    of the four-tile instance: the same bits as each 16-row slice launched alone (each output's
    sum is its own row's and column's), with the residual epilogue, inside a CUDA graph too, and
    within cuBLAS's rounding of the fp32 reference; kernel_abi sends them to this kernel."""
    from specc.codegen import kernel_abi

    w, packed, x, b = _gpu_case(256, 1024, m, seed=m)
    res = torch.randn(m, 256, device="cuda").to(torch.bfloat16)
    got = mma.linear_bf12_mma(x, packed, b, cfg, residual=res)
    alone = torch.cat([mma.linear_bf12_mma(x[s:s + 16].contiguous(), packed, b, cfg,
                                           residual=res[s:s + 16].contiguous()) for s in range(0, m, 16)])
    assert torch.equal(got, alone)
    want = res.float() + _reference(x, w, b)
    ref = (res + torch.nn.functional.linear(x, w, b)).float()
    assert float((got.float() - want).abs().max()) <= 2 * float((ref - want).abs().max()) + 1e-2
    y = torch.empty_like(got)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mma.linear_bf12_mma(x, packed, b, cfg, out=y, residual=res)
    y.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, got)
    calls = []
    real = mma.linear_bf12_mma
    try:
        mma.linear_bf12_mma = lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
        via_abi = kernel_abi.packed_linear(x[None], packed.sm, packed.ex, packed.base, packed.esc_idx,
                                           packed.esc_val, 256, 1024, packed.base_mode, bias=b, version=2)
    finally:
        mma.linear_bf12_mma = real
    assert calls == [m] and torch.equal(via_abi[0], real(x, packed, b))


@gpu
@pytest.mark.parametrize("m,cfg,k", [(1, mma.Bf12MmaConfig(), 1024), (16, mma.Bf12MmaConfig(splits=2, prefetch=True), 1024),
                                     (24, mma.Bf12MmaConfig(unroll=2, warps=4, prefetch=True), 256)])
def test_gpu_norm_prologue_and_residual_epilogue(m, cfg, k):
    """One launch computes ``r + linear(rms_norm(x))`` like the three separate ops (their
    roundings), and equals kernel_abi's unfused fallback up to fp32 summation order."""
    from specc.codegen.kernels.rmsnorm import rms_norm as rms_norm_kernel
    from specc.models import ops

    w, packed, x, _ = _gpu_case(256, k, m, seed=30 + m, bias=False)
    x = x * 4
    g = torch.Generator(device="cuda").manual_seed(m)
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda", generator=g)).to(torch.bfloat16)
    r = torch.randn(m, 256, device="cuda", generator=g).to(torch.bfloat16)
    got = mma.linear_bf12_mma(x, packed, None, cfg, norm_weight=norm_w, eps=1e-6, residual=r)
    h = ops.rms_norm(x, norm_w, 1e-6)
    prod = (h.float() @ w.float().T).to(torch.bfloat16)
    want = (r.float() + prod.float()).to(torch.bfloat16)
    # within one bf16 rounding of the product (another summation order) plus the add's
    assert bool(((got.float() - want.float()).abs() <= prod.float().abs() / 128 + r.float().abs() / 128 + 2e-2).all())
    unfused = r + mma.linear_bf12_mma(rms_norm_kernel(x, norm_w, 1e-6), packed, None, cfg)
    assert float((got.float() - unfused.float()).abs().max()) <= float(want.float().abs().max()) / 64
    assert torch.equal(got, mma.linear_bf12_mma(x, packed, None, cfg, norm_weight=norm_w, eps=1e-6, residual=r))


@gpu
@pytest.mark.parametrize("m,norm", [(1, True), (1, False), (16, False), (32, False)])
def test_gpu_more_escapes_than_the_epilogue_stages(m, norm):
    """A 16-row block with more escapes than the kernel stages in shared memory (ESC_CAP) before
    its main loop: the rest are read in the epilogue, in the same CSR order, so the result is
    the same matmul, with the bias, residual and fused norm reading the staged values."""
    from specc.models import ops

    n, k = 64, 1024
    w = _weights(n, k, seed=40 + m).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(m)
    cols = torch.randperm(k, device="cuda", generator=g)[:48]
    w[3, cols] = 3.0e4  # far above row 3's window: 48 escapes in one row
    w[7, cols[:40]] = -1.0e-30  # far below row 7's
    w[12, cols[8:]] = 5.0e3
    packed = pack_bf16_12bit(w, version=2)
    esc_rows = packed.esc_idx.div(k, rounding_mode="floor")
    assert int((esc_rows < 16).sum()) > 64 + 40  # well past the 64 the kernel stages for the first block
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    r = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda", generator=g)).to(torch.bfloat16) if norm else None
    got = mma.linear_bf12_mma(x, packed, b, norm_weight=norm_w, residual=r)
    h = ops.rms_norm(x, norm_w, 1e-6) if norm else x
    prod = (h.float() @ w.float().T + b.float()).to(torch.bfloat16)
    want = (r.float() + prod.float()).to(torch.bfloat16)
    assert bool(((got.float() - want.float()).abs() <= prod.float().abs() / 64 + r.float().abs() / 128 + 2e-2).all())
    assert torch.equal(got, mma.linear_bf12_mma(x, packed, b, norm_weight=norm_w, residual=r))


@gpu
@pytest.mark.parametrize("m,cfg,fused", [
    (1, mma.Bf12MmaConfig(), True), (4, mma.Bf12MmaConfig(unroll=2, warps=4, prefetch=True), False),
    (16, mma.Bf12MmaConfig(splits=2, prefetch=True), False), (9, mma.Bf12MmaConfig(unroll=1, warps=8, splits=4), False),
])
def test_gpu_layout_3_tiles_give_layout_2s_bits(m, cfg, fused):
    """Layout 3 (16 x 64 tiles, a warp's loads one contiguous KB) is layout 2 at other addresses:
    the kernel's lanes, k order and sums are the same, so the outputs are the same bits, with
    escapes past the staged ones, the bias, the residual, a fused norm and split-K."""
    n, k = 96, 1024
    w = _weights(n, k, seed=70 + m).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(m)
    w[20, torch.randperm(k, device="cuda", generator=g)[:80]] = 4.0e4  # more escapes than the kernel stages
    p2, p3 = pack_bf16_12bit(w, version=2), pack_bf16_12bit(w, version=3)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    r = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda", generator=g)).to(torch.bfloat16) if fused else None
    want = mma.linear_bf12_mma(x, p2, b, cfg, norm_weight=norm_w, residual=r)
    got = mma.linear_bf12_mma(x, p3, b, cfg, norm_weight=norm_w, residual=r)
    assert got is not None and torch.equal(got, want)
    assert torch.equal(linear_bf12(x, p3, b), linear_bf12(x, p2, b))  # the dispatch takes layout 3 too


@gpu
def test_gpu_inf_nan_escapes_and_tensor_base():
    w, packed, x, _ = _gpu_case(64, 512, 3, seed=11, base="tensor", bias=False)
    w[5, 9], w[6, 2] = float("inf"), float("nan")
    packed = pack_bf16_12bit(w, version=2, base="tensor")
    got = mma.linear_bf12_mma(x, packed).float()
    want = _reference(x, w, None)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)  # within bf16 rounding of the output (the planted outlier makes some large)
    assert bool(((got[fin] - want[fin]).abs() <= want[fin].abs() / 128 + 1e-2).all())


@gpu
def test_gpu_dispatch_and_graph_replay():
    w, packed, x, b = _gpu_case(512, 2048, 16, seed=12)
    eager = linear_bf12(x, packed, b)  # dispatched to the tensor-core kernel
    assert torch.equal(eager, mma.linear_bf12_mma(x, packed, b))
    y = torch.empty_like(eager)
    linear_bf12(x, packed, b, out=y)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        linear_bf12(x, packed, b, out=y)
    y.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)
    triton_y = linear_bf12(x.float(), packed, b.float()).to(torch.bfloat16)  # fp32 activations: the Triton kernel
    assert float((triton_y.float() - eager.float()).abs().max()) < 5e-2


@gpu
@pytest.mark.parametrize("version", [2, 3])
def test_gpu_packed_specc_tiny_agrees_with_unpacked(monkeypatch, version):
    """specc-tiny (real weights; every linear is eligible) compiled with and without
    pack_weights_12bit (layout 2, and 3: the default): the packed step runs its linears through
    the tensor-core kernel at 1 and 16 rows, and its greedy tokens equal the unpacked step's
    wherever the unpacked top-2 margin is not a tie (the kernels sum in another order than the
    bf16 ones)."""
    from specc.codegen.build import build_steps
    from specc.models import load_model
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.verify.forcing import top2_margins

    calls = []
    real = mma.linear_bf12_mma
    monkeypatch.setattr(mma, "linear_bf12_mma", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    target = load_model("specc-tiny", dtype=torch.bfloat16, device="cuda", with_tokenizer=False).model
    target.setup_caches(1, 16)
    logits = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = {q: torch.randint(0, 8192, (1, q), device="cuda", generator=g) for q in (1, 16)}
    packed = DEFAULT_PIPELINE.replace("dce", "pack_weights_12bit,dce")
    for label, pipeline in (("unpacked", DEFAULT_PIPELINE), ("packed", packed)):
        built = build_steps(target, None, pipeline, pass_options={"pack_version": version} if label == "packed" else {})
        if label == "packed":
            stats = {r["name"]: r["stats"] for r in built.pass_records["target"]}["pack_weights_12bit"]
            assert stats["format_versions"] == {str(version): stats["packed"]}  # every specc-tiny linear tiles
        step = instantiate(built.emitted["target"])
        step.setup_caches(1, 256)
        prompt = torch.arange(100, 164, device="cuda")[None]
        with torch.inference_mode():
            step(prompt, torch.arange(64, device="cuda")[None], torch.tensor([0], device="cuda"))
            for q in (1, 16):
                pos = torch.arange(64, 64 + q, device="cuda")[None]
                logits[label, q] = step(ids[q], pos, torch.tensor([64], device="cuda")).float()
    assert 1 in calls and 16 in calls, calls
    for q in (1, 16):
        u, p = logits["unpacked", q].reshape(q, -1), logits["packed", q].reshape(q, -1)
        flips = (u.argmax(-1) != p.argmax(-1)).nonzero().flatten().tolist()
        assert all(m < 0.25 for m in top2_margins(u[flips])), flips
        assert float((u - p).abs().max()) < 0.5
