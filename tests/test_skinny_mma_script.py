"""examples/skinny_mma.py on the CPU: the kernel's index mapping (which k a lane's 16-byte vectors
hold, how they become MMA fragments, which output each accumulator is) replayed in torch gives
x @ W^T; and the CUDA source compiles for sm_90 where NVRTC is installed (the kernel itself runs
on a GPU: ``python3 examples/skinny_mma.py``)."""

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
    assert ".target sm_90" in ptx and ptx.count(".entry") == 40 and "mma.sync.aligned.m16n8k16" in ptx


@pytest.mark.parametrize("m,unroll,warps,splits", [(1, 1, 2, 1), (9, 2, 1, 1), (16, 1, 1, 2)])
def test_emulated_bf12_kernel_is_the_matmul(m, unroll, warps, splits):
    """The bf12 kernel's mapping (lanes' 16 weights, code nibbles of the shared group bytes, the
    constant-exponent decode and the rows' power of two) gives x @ W^T on weights without escapes
    (exponents within one 16-binade window)."""
    import skinny_mma

    from specc.formats.bf12 import pack_bf16_12bit

    g = torch.Generator().manual_seed(m)
    sign = torch.where(torch.rand(32, 256, generator=g) < 0.5, -1.0, 1.0)
    w = (sign * (0.5 + 0.5 * torch.rand(32, 256, generator=g))
         * torch.pow(2.0, torch.randint(-12, -3, (32, 256), generator=g).float())).to(torch.bfloat16)
    packed = pack_bf16_12bit(w, version=2)
    assert packed.esc_idx.numel() == 0
    x = torch.randn(m, 256, generator=g)
    got = skinny_mma.emulate_bf12(x, packed, unroll=unroll, warps=warps, splits=splits)
    torch.testing.assert_close(got, x @ w.float().T, rtol=1e-5, atol=1e-5)


def test_standin_weights_put_the_stand_in_at_escapes():
    import skinny_mma

    from specc.formats.bf12 import pack_bf16_12bit

    w = (torch.randn(16, 64) * 0.02).to(torch.bfloat16)
    w[3, 5], w[7, 60] = 0.0, 300.0  # a zero and an outlier: escapes
    packed = pack_bf16_12bit(w, version=2)
    got = skinny_mma.standin_weights(packed)
    base = packed.base.long()
    assert got[3, 5] == 2.0 ** (int(base[3]) - 127) and got[7, 60] == 2.0 ** (int(base[7]) - 127)
    mask = torch.ones_like(w, dtype=torch.bool)
    mask[3, 5] = mask[7, 60] = False
    assert torch.equal(got[mask], w[mask])
    # the decode of the planes equals the stand-in weights up to the rows' power of two
    codes = torch.stack([packed.ex[:, 16 * (k // 32) + k % 16] >> (4 * ((k // 16) % 2)) & 0xF
                         for k in range(64)], dim=1)
    dec = skinny_mma.decode_constant_exponent(packed.sm[:, :64], codes)
    torch.testing.assert_close(dec * torch.pow(2.0, base.float() - 112)[:, None], got.float(), rtol=0, atol=0)
