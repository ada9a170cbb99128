"""Lossless 12-bit format: bit-exact round trips, escape table, serialisation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specc.formats import Packed12, pack_bf16_12bit
from specc.formats.bf12 import FORMAT_VERSION, MAX_BASE, MIN_BASE, plane_strides, tileable


def all_bf16_patterns() -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def assert_bit_exact(packed: Packed12, ref: torch.Tensor) -> None:
    out = packed.unpack()
    assert out.dtype == torch.bfloat16
    assert tuple(out.shape) == tuple(ref.shape)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("base", ["row", "tensor"])
@pytest.mark.parametrize("shape", [(65536,), (256, 256), (16, 4096), (4096, 16),
                                   (4, 16, 1024), (128, 512), (1024, 64)])
def test_all_65536_patterns_round_trip(shape, base, version):
    # every bf16 bit pattern: +-0, subnormals, normals, +-inf, every NaN payload
    w = all_bf16_patterns()
    if version == 3 and not tileable(shape):  # layout 3 needs 16-row blocks of 64-weight tiles
        with pytest.raises(ValueError, match="version 3"):
            pack_bf16_12bit(w.reshape(shape), base=base, version=version)
        return
    perm = torch.randperm(w.numel(), generator=torch.Generator().manual_seed(0))
    for x in (w, w[perm]):  # sorted (rows = exponent ranges) and shuffled
        p = pack_bf16_12bit(x.reshape(shape), base=base, version=version)
        assert p.version == version
        p.validate()
        assert_bit_exact(p, x.reshape(shape))


def test_default_layout_is_version_2():
    p = pack_bf16_12bit((torch.randn(3, 40) * 0.02).bfloat16())
    assert p.version == FORMAT_VERSION == 2 and p.metadata()["version"] == 2
    assert p.sm.shape == (3, 64) and p.ex.shape == (3, 32)  # K padded to whole 32-weight groups


def test_version_2_layout_places_bytes_and_nibbles():
    """v2: sm in natural K order; group g's code byte i holds weight 32g + i (low nibble) and
    32g + 16 + i (high nibble) -- what the kernel's wide loads and decode assume."""
    g = torch.Generator().manual_seed(3)
    n, k = 5, 70  # two full groups and a padded third
    w = (torch.randn(n, k, generator=g) * 0.02).bfloat16()
    p = pack_bf16_12bit(w, version=2)
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    exp = (bits >> 7) & 0xFF
    code = exp - p.base.to(torch.int32)[:, None]
    inside = (code >= 0) & (code < 16)
    sm = ((bits >> 8) & 0x80) | (bits & 0x7F)
    got_sm = p.sm[:, :k].to(torch.int32)
    assert torch.equal(torch.where(inside, got_sm, 0), torch.where(inside, sm, 0))
    assert torch.all(got_sm[~inside] == 0) and torch.all(p.sm[:, k:] == 0)
    ex = p.ex.to(torch.int32)
    for kk in range(k):
        grp, q = divmod(kk, 32)
        byte = ex[:, 16 * grp + q % 16]
        nib = (byte & 0xF) if q < 16 else (byte >> 4)
        want = torch.where(inside[:, kk], code[:, kk], 0)
        assert torch.equal(nib, want), kk


def test_version_3_is_version_2_in_tiles():
    """v3: the v2 bytes and codes, each 16-row block stored as 64-weight tiles: sm byte j of row
    16 B + r, super-group S at flat 16 B Kp + 1024 S + 64 r + j; ex at 8 B Kp + 512 S + 32 r + j
    (plane_strides gives the kernels these numbers); the rest of the pack is v2's."""
    g = torch.Generator().manual_seed(4)
    n, k = 48, 150  # Kp = 160: not whole 64-weight tiles
    assert not tileable((n, k)) and tileable((n, 192)) and tileable((n, 100)) and not tileable((40, 192))
    w = (torch.randn(n, 192, generator=g) * 0.02).bfloat16()
    w[5, 7], w[20, 100] = 0.0, 3.0e4
    p2, p3 = pack_bf16_12bit(w, version=2), pack_bf16_12bit(w, version=3)
    assert p3.version == 3 and p3.sm.shape == p2.sm.shape and p3.ex.shape == p2.ex.shape
    for part in ("base", "esc_idx", "esc_val"):
        assert torch.equal(getattr(p3, part), getattr(p2, part))
    kp = p2.padded_cols
    assert plane_strides(3, kp) == (64, 1024, 32, 512) and plane_strides(2, kp) == (kp, 64, kp // 2, 32)
    sm3, ex3 = p3.sm.reshape(-1), p3.ex.reshape(-1)
    for row in (0, 7, 16, 31, 47):
        blk, r = divmod(row, 16)
        for kk in (0, 1, 63, 64, 130, 191):
            sg, j = divmod(kk, 64)
            assert sm3[16 * blk * kp + 1024 * sg + 64 * r + j] == p2.sm[row, kk]
        for kh in (0, 31, 32, 95):
            sg, j = divmod(kh, 32)
            assert ex3[8 * blk * kp + 512 * sg + 32 * r + j] == p2.ex[row, kh]
    assert_bit_exact(p3, w)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_real_shape_weights_round_trip(version):
    """A real-shape slice (4096 columns, Qwen3-8B's hidden size) of N(0, 0.02) weights with a
    sprinkle of zeros and outliers: bit-exact in both layouts."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(96, 4096, generator=g) * 0.02).bfloat16()
    w.view(-1)[torch.randint(0, w.numel(), (50,), generator=g)] = 0.0
    w.view(-1)[torch.randint(0, w.numel(), (50,), generator=g)] = 1.5
    assert_bit_exact(pack_bf16_12bit(w, version=version), w)


def test_escape_table_cases():
    w = (torch.randn(8, 300, generator=torch.Generator().manual_seed(1)) * 0.02).bfloat16()
    bits = w.view(torch.int16)
    specials = {  # flat index -> bf16 bit pattern
        3: 0x0000,  # +0
        4: -0x8000,  # -0 (0x8000)
        5: 0x0001,  # smallest subnormal
        6: -0x7FFF,  # negative subnormal (0x8001)
        7: 0x7F80,  # +inf
        8: -0x0080,  # -inf (0xFF80)
        9: 0x7FC1,  # NaN with payload
        10: -0x0001,  # NaN, all ones (0xFFFF)
        11: 0x4700,  # 32768.0, far above the window
        12: 0x0080,  # smallest normal, far below
        2399: 0x7F7F,  # largest finite, last element
        0: 0x0100,  # tiny normal, first element
    }
    for i, b in specials.items():
        bits.view(-1)[i] = b
    for base in ("row", "tensor"):
        p = pack_bf16_12bit(w, base=base)
        assert_bit_exact(p, w)
        esc = set(p.esc_idx.tolist())
        assert set(specials) <= esc, "zeros/subnormals/inf/nan/outliers must be escapes"
        assert p.esc_idx.dtype == torch.int32 and p.esc_val.dtype == torch.int16
        assert torch.all(p.esc_idx[1:] > p.esc_idx[:-1]), "escape table sorted, unique"
        for i, b in specials.items():
            j = p.esc_idx.tolist().index(i)
            assert p.esc_val[j].item() == b
        # escaped positions are stored as sm = 0, code = 0 (the window's smallest normal)
        assert p.num_escapes == len(esc) and p.escape_rate == pytest.approx(len(esc) / w.numel())


def test_window_choice_and_codes():
    # a row whose values span exactly 16 binades: no escapes, base = smallest exponent
    e = torch.arange(100, 116, dtype=torch.int32)
    bits = (e << 7) | 0x35
    w = bits.to(torch.int16).view(torch.bfloat16).reshape(1, 16)
    p = pack_bf16_12bit(w)
    assert p.num_escapes == 0 and int(p.base[0]) == 100
    assert_bit_exact(p, w)
    # one more binade: exactly one escape
    w17 = torch.cat([w, torch.tensor([[2.0 ** (99 - 127)]], dtype=torch.bfloat16)], dim=1)
    assert pack_bf16_12bit(w17).num_escapes == 1
    # bases stay in range so the window never contains exponent 0 or 255
    for x in (torch.full((1, 8), 1e-38, dtype=torch.bfloat16), torch.full((1, 8), 3e38, dtype=torch.bfloat16),
              torch.zeros(3, 5, dtype=torch.bfloat16)):
        p = pack_bf16_12bit(x)
        assert MIN_BASE <= int(p.base.min()) and int(p.base.max()) <= MAX_BASE
        assert_bit_exact(p, x)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    scale=st.sampled_from([0.02, 1.0, 1e-20, 1e20, 3e38]),
    specials=st.floats(0.0, 0.3),
    base=st.sampled_from(["row", "tensor"]),
    seed=st.integers(0, 2**31 - 1),
    version=st.sampled_from([1, 2]),
)
def test_random_odd_shapes_round_trip(shape, scale, specials, base, seed, version):
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    w = (torch.randn(n, generator=g) * scale).bfloat16()
    # sprinkle raw random bit patterns (NaNs, infs, subnormals, -0, ...)
    raw = torch.randint(-32768, 32768, (n,), generator=g, dtype=torch.int32).to(torch.int16)
    pick = torch.rand(n, generator=g) < specials
    w = torch.where(pick, raw.view(torch.bfloat16), w).reshape(shape)
    p = pack_bf16_12bit(w, base=base, version=version)
    p.validate()
    assert_bit_exact(p, w)
    assert 0.0 <= p.escape_rate <= 1.0


def test_realistic_escape_rates():
    """N(0, 0.02) weights (also with per-row scales and heavier tails): escapes must be rare.
    Prints the per-row vs per-tensor rates quoted in the format's docstring."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for n, k in [(1024, 4096), (4096, 1024)]:
        iid = torch.randn(n, k, generator=g) * 0.02
        row_scaled = iid * torch.exp(0.5 * torch.randn(n, 1, generator=g))
        heavy = torch.randn(n, k, generator=g) * 0.02 / torch.sqrt(torch.rand(n, k, generator=g) + 0.05) / 3
        for name, w in [("normal*0.02", iid), ("row-scaled", row_scaled), ("heavy-tailed", heavy)]:
            w = w.bfloat16()
            r = {b: pack_bf16_12bit(w, base=b) for b in ("row", "tensor")}
            for p in r.values():
                assert_bit_exact(p, w)
            rows.append((name, n, k, r["row"].escape_rate, r["tensor"].escape_rate, r["row"].bits_per_weight))
            assert r["row"].num_escapes <= r["tensor"].num_escapes  # per-row window is optimal per row
            assert r["row"].escape_rate < 1e-3
            if name == "normal*0.02":
                assert r["tensor"].escape_rate < 3e-4
    print("\nbf12 escape rates (per-row vs per-tensor base):")
    for name, n, k, er, et, bpw in rows:
        print(f"  {name:13s} {n:5d}x{k:<5d} row {er:.2e}  tensor {et:.2e}  ({bpw:.3f} bits/weight, row)")


def test_state_dict_round_trip_through_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(2)
    w1 = (torch.randn(33, 70, generator=g) * 0.02).bfloat16()
    w1.view(-1)[5] = 0.0
    w2 = (torch.randn(5, 3, 17, generator=g)).bfloat16()
    p1, p2 = pack_bf16_12bit(w1), pack_bf16_12bit(w2, base="tensor")
    sd = {**p1.to_state_dict("layers.0.q."), **p2.to_state_dict("layers.0.k.")}
    assert all(isinstance(v, torch.Tensor) and v.is_contiguous() for v in sd.values())
    meta = {"q": str(p1.metadata()), "k": str(p2.metadata())}
    save_file(sd, str(tmp_path / "w.safetensors"), metadata=meta)
    back = load_file(str(tmp_path / "w.safetensors"))
    q = Packed12.from_state_dict(back, "layers.0.q.", metadata=p1.metadata())
    k = Packed12.from_state_dict(back, "layers.0.k.")
    assert q.shape == (33, 70) and q.base_mode == "row"
    assert k.shape == (5, 3, 17) and k.base_mode == "tensor"
    assert_bit_exact(q, w1)
    assert_bit_exact(k, w2)
    assert q.nbytes == p1.nbytes
    with pytest.raises(ValueError):
        Packed12.from_state_dict(back, "layers.0.q.", metadata={"shape": [1, 2], "base": "row"})
    with pytest.raises(ValueError):
        Packed12.from_state_dict(back, "layers.0.q.", metadata={**p1.metadata(), "version": 1})


def test_version_1_artifacts_still_load(tmp_path):
    """State dicts written in layout 1 (meta[0] == 1) load as version 1 and unpack exactly;
    an unknown version is refused with a clear error."""
    from safetensors.torch import load_file, save_file

    w = (torch.randn(7, 50, generator=torch.Generator().manual_seed(4)) * 0.02).bfloat16()
    p1 = pack_bf16_12bit(w, version=1)
    sd = p1.to_state_dict("w.")
    assert int(sd["w.meta"][0]) == 1 and p1.metadata()["version"] == 1
    save_file(sd, str(tmp_path / "v1.safetensors"))
    back = Packed12.from_state_dict(load_file(str(tmp_path / "v1.safetensors")), "w.")
    assert back.version == 1 and back.sm.shape == (7, 64)
    assert_bit_exact(back, w)
    p2 = Packed12.from_state_dict(pack_bf16_12bit(w).to_state_dict("w."), "w.")
    assert p2.version == 2 and p2.sm.shape == (7, 64) and p2.ex.shape == (7, 32)
    assert_bit_exact(p2, w)
    bad = dict(sd)
    bad["w.meta"] = sd["w.meta"].clone()
    bad["w.meta"][0] = 9
    with pytest.raises(ValueError, match="version 9"):
        Packed12.from_state_dict(bad, "w.")
    with pytest.raises(ValueError, match="expected"):  # a v1 plane shape read as v2
        Packed12(sm=p1.sm[:, :48].contiguous(), ex=p1.ex[:, :24].contiguous(), base=p1.base,
                 esc_idx=p1.esc_idx, esc_val=p1.esc_val, shape=(7, 50), version=2).validate()


def test_sizes_and_errors():
    w = (torch.randn(64, 4096) * 0.02).bfloat16()
    p = pack_bf16_12bit(w)
    assert p.sm.shape == (64, 4096) and p.ex.shape == (64, 2048) and p.base.shape == (64,)
    assert 12.0 <= p.bits_per_weight < 12.1
    assert p.nbytes == 64 * 4096 * 3 // 2 + 64 + p.num_escapes * 6
    with pytest.raises(TypeError):
        pack_bf16_12bit(w.float())
    with pytest.raises(ValueError):
        pack_bf16_12bit(w, base="column")
    with pytest.raises(ValueError, match="version"):
        pack_bf16_12bit(w, version=4)
    with pytest.raises(ValueError, match="version 3 needs"):
        pack_bf16_12bit(w[:40], version=3)  # 40 rows: not whole 16-row blocks
    assert pack_bf16_12bit(w, version=3).nbytes == p.nbytes  # the same bytes, in tiles
    with pytest.raises(ValueError):
        pack_bf16_12bit(torch.zeros(0, 4, dtype=torch.bfloat16))
    assert_bit_exact(pack_bf16_12bit(torch.tensor(1.5, dtype=torch.bfloat16)), torch.tensor(1.5, dtype=torch.bfloat16))


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("base", ["row", "tensor"])
def test_packed_meta_has_the_planes_of_a_real_pack(version, base):
    """A weight without values (meta) packs to meta planes of exactly a real pack's sizes, and an
    escape table of the estimated rate (its count needs values)."""
    from specc.formats.bf12 import ESTIMATED_ESCAPE_RATE, packed_meta

    w = (torch.randn(48, 100) * 0.02).to(torch.bfloat16)
    real = pack_bf16_12bit(w, base=base, version=version)
    meta = packed_meta(tuple(w.shape), base=base, version=version, escape_rate=0.01)
    for part in ("sm", "ex", "base"):
        assert getattr(meta, part).is_meta and getattr(meta, part).shape == getattr(real, part).shape
        assert getattr(meta, part).dtype == getattr(real, part).dtype
    assert meta.num_escapes == 48 and meta.esc_val.dtype == torch.int16 and meta.esc_idx.dtype == torch.int32
    assert meta.shape == real.shape and meta.version == version and meta.padded_cols == real.padded_cols
    assert packed_meta((4096, 4096)).num_escapes == round(ESTIMATED_ESCAPE_RATE * 4096 * 4096)
    with pytest.raises(ValueError, match="version"):
        packed_meta((16, 64), version=4)
    with pytest.raises(ValueError, match="version 3"):
        packed_meta((8, 64), version=3)
