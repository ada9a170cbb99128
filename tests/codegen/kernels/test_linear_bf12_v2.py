"""What only the layout-2 bf12 kernel has: bit-exact decode (Triton ops, and the PRMT inline asm
emulated instruction by instruction), bf16 patterns through the kernel, the split-K workspace,
its configs and errors. The GEMV/GEMM checks both layouts share (F.linear on the unpacked
weights, escapes, inf/nan, leading dims, bf16 on the GPU) run for layout 2 in
test_linear_bf12.py, parametrized by layout.

Without CUDA these run under the Triton interpreter (conftest.py) in fp32; with CUDA the fp32
cases run compiled and the bf16 cases (marked gpu) run too, including the asm decode.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from specc.codegen.kernels.linear_bf12 import linear_bf12
from specc.codegen.kernels.linear_bf12_v2 import (
    DECODE_ASM,
    INTERPRETED,
    Bf12v2Config,
    _decode,
    clear_configs,
    get_config,
    linear_bf12_v2,
    set_config,
)
from specc.formats import pack_bf16_12bit

from test_linear_bf12 import ref64, rel_err, weight_with_escapes

HAS_CUDA = torch.cuda.is_available()
DEV = "cpu" if INTERPRETED else "cuda"
if not INTERPRETED and not HAS_CUDA:
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU",
                allow_module_level=True)
gpu = pytest.mark.gpu
C = Bf12v2Config


def expected_bits(sm: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """The bf16 bits the decoder must produce: sign|mantissa byte, exponent 0x70 + code."""
    sm, code = sm.to(torch.int64), code.to(torch.int64)
    return ((sm & 0x80) << 8) | ((0x70 + code) << 7) | (sm & 0x7F)


# ---------------------------------------------------------------------------------------------
# decode, bit for bit
# ---------------------------------------------------------------------------------------------
@triton.jit
def _decode_probe(s_ptr, e_ptr, out_ptr, HI: tl.constexpr, USE_ASM: tl.constexpr,
                  OUT_BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w = _decode(tl.load(s_ptr + offs), tl.load(e_ptr + offs), HI, USE_ASM, OUT_BF16)
    if OUT_BF16:
        tl.store(out_ptr + offs, w.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
    else:
        tl.store(out_ptr + offs, w.to(tl.int32, bitcast=True))


def _all_pairs():
    """Every (sm byte, code byte) combination: 65536 pairs, in a shuffled order so that each
    lane of a 4-byte register sees every value next to varied neighbours."""
    s = torch.arange(256, dtype=torch.int32).repeat_interleave(256)
    e = torch.arange(256, dtype=torch.int32).repeat(256)
    perm = torch.randperm(65536, generator=torch.Generator().manual_seed(0))
    return s[perm].to(torch.uint8), e[perm].to(torch.uint8)


@pytest.mark.parametrize("hi", [False, True])
def test_triton_decode_is_bit_exact(hi):
    s, e = _all_pairs()
    code = (e.to(torch.int32) >> 4) if hi else (e.to(torch.int32) & 0xF)
    want = expected_bits(s, code)
    out = torch.empty(65536, dtype=torch.int32, device=DEV)
    _decode_probe[(65536 // 4096,)](s.to(DEV), e.to(DEV), out, HI=hi, USE_ASM=False, OUT_BF16=False,
                                    BLOCK=4096)
    assert torch.equal(out.cpu().to(torch.int64) & 0xFFFFFFFF, want << 16)  # fp32 = bf16 bits << 16, exact


def _run_ptx(asm: str, ins: dict[str, np.ndarray], n_out: int) -> list[np.ndarray]:
    """Execute the decoder's PTX (prmt.b32, shl.b32, lop3.b32 only) on uint32 vectors."""
    regs: dict[str, np.ndarray] = {f"${i}": v for i, v in ins.items()}

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return np.full_like(next(iter(ins.values())), int(tok, 0), dtype=np.uint32)

    body = asm.strip().lstrip("{").rstrip("}")
    ops = [op.strip() for op in body.split(";") if op.strip() and not op.strip().startswith(".reg")]
    for op in ops:
        m = re.fullmatch(r"(\S+)\s+(.*)", op)
        name, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if name == "prmt.b32":  # default mode: selector nibble i picks byte (0..7) of {b, a}
            a, b, sel = val(args[1]), val(args[2]), int(args[3], 0)
            pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
            res = np.zeros_like(a)
            for i in range(4):
                nib = (sel >> (4 * i)) & 0xF
                assert nib < 8, "sign-replicate mode not used by the decoder"
                res |= pool[nib] << (8 * i)
            regs[args[0]] = res.astype(np.uint32)
        elif name == "shl.b32":
            regs[args[0]] = (val(args[1]) << np.uint32(int(args[2], 0))).astype(np.uint32)
        elif name == "lop3.b32":
            a, b, c, lut = val(args[1]), val(args[2]), val(args[3]), int(args[4], 0)
            res = np.zeros_like(a)
            for bit_a in (0, 1):  # LUT index = a << 2 | b << 1 | c (PTX: ta = 0xF0, tb = 0xCC, tc = 0xAA)
                for bit_b in (0, 1):
                    for bit_c in (0, 1):
                        if (lut >> (bit_a << 2 | bit_b << 1 | bit_c)) & 1:
                            ma = a if bit_a else ~a
                            mb = b if bit_b else ~b
                            mc = c if bit_c else ~c
                            res |= ma & mb & mc
            regs[args[0]] = res.astype(np.uint32)
        else:
            raise AssertionError(f"unexpected instruction {name}")
    return [regs[f"${i}"] for i in range(n_out)]


@pytest.mark.parametrize("hi", [False, True])
def test_prmt_asm_decode_is_bit_exact_emulated(hi):
    """The inline asm (what the GPU runs) executed instruction by instruction on the CPU: for
    every (sm byte, code byte) pair in every lane of the packed registers, the bf16 bits equal
    the format's decode. (Lane i of a pack=4 operand is byte i / bf16 half i of the register,
    as in Triton's packed inline asm.)"""
    s, e = _all_pairs()
    s4 = s.numpy().astype(np.uint32).reshape(-1, 4)
    e4 = e.numpy().astype(np.uint32).reshape(-1, 4)
    pack = lambda v: v[:, 0] | v[:, 1] << 8 | v[:, 2] << 16 | v[:, 3] << 24  # noqa: E731
    out0, out1 = _run_ptx(DECODE_ASM[hi], {2: pack(s4), 3: pack(e4)}, 2)
    got = np.stack([out0 & 0xFFFF, out0 >> 16, out1 & 0xFFFF, out1 >> 16], axis=1).reshape(-1)
    code = (e.to(torch.int32) >> 4) if hi else (e.to(torch.int32) & 0xF)
    assert np.array_equal(got.astype(np.int64), expected_bits(s, code).numpy())


@gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRETED, reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("hi", [False, True])
@pytest.mark.parametrize("use_asm", [False, True])
def test_gpu_decode_to_bf16_is_bit_exact(hi, use_asm):
    s, e = _all_pairs()
    code = (e.to(torch.int32) >> 4) if hi else (e.to(torch.int32) & 0xF)
    out = torch.empty(65536, dtype=torch.int32, device="cuda")
    _decode_probe[(16,)](s.cuda(), e.cuda(), out, HI=hi, USE_ASM=use_asm, OUT_BF16=True, BLOCK=4096)
    assert torch.equal(out.cpu().to(torch.int64), expected_bits(s, code))


def test_kernel_reproduces_bf16_patterns():
    """x = identity: y = W^T (one exact product per output), so every finite bf16 pattern of a
    random quarter of all 65536 (every exponent; the decoders themselves are checked on every
    input above) comes out of the kernel as its own value: exactly for in-window weights; an escape's value arrives
    as stand-in + (true - stand-in) in fp32, i.e. within rounding of the stand-in 2**(base - 127)
    (the sparse fix-up's contract: exact products, fp32 sums). Compiled on a GPU, a split-K
    config's subnormal results may flush to zero (float atomics; see below): engines' bf16
    outputs are sums over thousands of products, never one subnormal product."""
    w = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    w = w[torch.randperm(65536, generator=torch.Generator().manual_seed(1))[:16384]].reshape(64, 256)
    w = torch.where(torch.isfinite(w.float()), w, torch.zeros((), dtype=torch.bfloat16))
    p = pack_bf16_12bit(w).to(DEV)
    assert p.num_escapes > 2000
    esc = torch.zeros(16384, dtype=torch.bool)
    esc[p.esc_idx.long().cpu()] = True
    esc = esc.reshape(64, 256)
    standin = torch.exp2(p.base.cpu().double() - 127)[:, None].expand(64, 256)
    x = torch.eye(256, device=DEV)
    for cfg, rows in ((C("dot", block_m=64, block_n=64, block_k=128, swap_ab=True, split_k=2, esc_block=256), 256),
                      (C("fma", block_m=4, block_n=64, block_k=128, esc_block=1024), 4)):
        y = linear_bf12(x[:rows], p, config=cfg).T.cpu()  # [64 weight rows, rows]
        want, e, s = w[:, :rows].float(), esc[:, :rows], standin[:, :rows]
        assert torch.equal(y[~e], want[~e])
        err = (y[e].double() - want[e].double()).abs()
        ok = err <= torch.maximum(s[e], want[e].double().abs()) * 2.0 ** -23
        if cfg.split_k > 1 and not INTERPRETED:  # split-K partials meet in float atomics, which flush
            # subnormals to zero on NVIDIA GPUs: an output whose exact value is subnormal may come back 0
            ok |= (want[e].abs() < 2.0 ** -126) & (y[e] == 0)
        assert torch.all(ok)


@pytest.mark.parametrize("cfg,m", [
    (C("fma", block_m=1, block_n=16, block_k=64), 1),
    (C("fma", block_m=4, block_n=32, block_k=128, split_k=2), 3),
    (C("dot", block_m=16, block_n=32, block_k=64, swap_ab=True), 17),
    (C("dot", block_m=32, block_n=16, block_k=128, split_k=2), 40),
])
def test_layout_3_tiles_give_layout_2s_result(cfg, m):
    """Layout 3 (layout 2's bytes in 16 x 64 tiles) through the Triton kernel: the same tiles by
    their tiled addresses, so the same sums as layout 2, bit for bit, with escapes and padding."""
    w = weight_with_escapes(48, 150 + 42, seed=11)  # K = 192: three 64-weight tiles a row
    p2, p3 = pack_bf16_12bit(w, version=2).to(DEV), pack_bf16_12bit(w, version=3).to(DEV)
    assert p3.version == 3 and p3.num_escapes > 0 and not torch.equal(p2.sm, p3.sm)
    x = torch.randn(m, 192, generator=torch.Generator().manual_seed(m)).to(DEV)
    y2, y3 = linear_bf12_v2(x, p2, config=cfg), linear_bf12_v2(x, p3, config=cfg)
    assert torch.equal(y2, y3) and rel_err(y3, ref64(x, w.to(DEV))) < 2e-6


# ---------------------------------------------------------------------------------------------
# split-K, configs and errors (the GEMV / GEMM checks: test_linear_bf12.py)
# ---------------------------------------------------------------------------------------------
def test_split_k_workspace_is_left_clean():
    """Split-K partials go through a shared workspace: repeated calls must give the answer again,
    i.e. the last program of a tile zeroes it (a dirty workspace would add the previous call's
    sums). Under the interpreter the programs run in order, so the answers are equal bit for bit;
    compiled on a GPU the partials meet in float atomics in no fixed order, so each answer is
    checked against the fp64 reference instead."""
    w = weight_with_escapes(40, 300, seed=9)
    p = pack_bf16_12bit(w).to(DEV)
    x = torch.randn(2, 300, device=DEV)
    cfg = C("fma", block_m=2, block_n=16, block_k=32, split_k=4)
    ref = ref64(x, w.to(DEV))
    y1 = linear_bf12(x, p, config=cfg)
    y2 = linear_bf12(x, p, config=cfg)
    assert rel_err(y1, ref) < 2e-6 and rel_err(y2, ref) < 2e-6
    if INTERPRETED:
        assert torch.equal(y1, y2)


def test_config_table_and_errors():
    assert get_config(1, 4096, 4096).kind == "fma" and get_config(16, 4096, 4096).kind == "dot"
    assert get_config(1, 4096, 4096).block_k == 256  # 16 bytes per plane per thread at 4 warps
    cfg = C("fma", block_m=1, block_n=8, block_k=64)
    set_config(1, 4096, 4096, cfg)
    try:
        assert get_config(1, 4096, 4096) is cfg
    finally:
        clear_configs()
    for bad in (dict(kind="dot", block_m=8), dict(kind="fma", block_m=8), dict(block_k=16),
                dict(block_k=96), dict(kind="gemv")):
        with pytest.raises(ValueError):
            C(**bad)
    from specc.codegen.kernels.linear_bf12 import Bf12Config

    p = pack_bf16_12bit(weight_with_escapes(8, 32, seed=0)).to(DEV)
    with pytest.raises(TypeError, match="Bf12v2Config"):  # a layout-1 config for a layout-2 weight
        linear_bf12(torch.randn(1, 32, device=DEV), p, config=Bf12Config())
    p1 = pack_bf16_12bit(weight_with_escapes(8, 32, seed=0), version=1).to(DEV)
    with pytest.raises(TypeError, match="Bf12Config"):
        linear_bf12(torch.randn(1, 32, device=DEV), p1, config=cfg)
    with pytest.raises(ValueError, match="version-2"):
        linear_bf12_v2(torch.randn(1, 32, device=DEV), p1)
    if INTERPRETED:
        with pytest.raises(TypeError, match="bf16"):
            linear_bf12(torch.randn(1, 32).bfloat16(), p)
