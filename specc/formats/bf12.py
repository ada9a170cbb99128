"""Lossless 12-bit storage of bf16 weights ("bf12").

What is stored
==============
A bf16 number is ``sign(1) | exponent(8) | mantissa(7)``. Trained weights use few exponents (their
entropy is ~2.6 bits), so bf12 keeps, per weight,

* one byte ``sm = sign << 7 | mantissa`` (exact), and
* a 4-bit code ``c = exponent - base`` relative to a base exponent chosen per row (``base="row"``,
  the default) or per tensor (``base="tensor"``): the window is the 16 exponents
  ``[base, base + 15]``,

i.e. 1.5 bytes per weight instead of 2. Weights whose exponent falls outside the window -- zeros
and subnormals (exponent field 0), inf/NaN (255) and outliers -- are *escapes*: they are kept
exactly, as their original bf16 bit pattern (int16), in an escape table sorted by flat index
(int32, or int64 beyond 2**31 elements). In the packed planes an escape is written as
``sm = 0, c = 0``, i.e. it decodes to ``+2**(base - 127)`` (the window's smallest normal, a
finite stand-in), and :meth:`Packed12.unpack` overwrites it from the table. No code value is
reserved for escapes: all 16 codes are window exponents (one more binade than a reserved code
would leave, which halves the small-magnitude escapes of a bell-shaped row), and the consumers
that need to know which weights are escapes (unpack, the GEMM correction) read the table, which
they need anyway to get the true values. ``base`` is chosen in [1, 239] so that the window never
contains exponent 0 or 255; it is the 16-wide window that holds the most weights of the row
(tensor), the first such on ties.

Three layouts share all of the above (the per-weight bytes and codes, the bases, the escape
table) and differ only in where the bytes sit: **version 2** (the default of
:func:`pack_bf16_12bit`), **version 3** (version 2's bytes in 16-row x 64-weight tiles: what the
``pack_weights_12bit`` pass writes where the shape allows) and **version 1** (still read and
written on request). The version is
in :meth:`Packed12.metadata`, in the ``meta`` tensor of :meth:`Packed12.to_state_dict` and, for
compiled steps, in each ``packed_linear`` call and the ``pack_weights_12bit`` pass statistics of
the manifest.

Layout version 2 (wide loads)
=============================
Row-major ``[N, K]`` (``nn.Linear.weight``; other ranks as ``[prod(shape[:-1]), shape[-1]]``),
K padded to ``Kp = 32 * ceil(K / 32)``:

* ``sm[n, k]``: the sign|mantissa byte of weight k, in natural K order (uint8 ``[N, Kp]``);
* ``ex[n, 16 g + i]``: 32-weight group g's code byte i holds weight ``32 g + i`` in its low
  nibble and weight ``32 g + 16 + i`` in its high nibble (uint8 ``[N, Kp / 2]``).

Why: a kernel tile of ``BLOCK_K`` weights per row is three tiles of ``BLOCK_K / 2`` bytes -- the
groups' first-half sm bytes, second-half sm bytes and code bytes -- each made of aligned
16-byte runs (rows start at multiples of 32 / 16 bytes), so a thread reads 32 weights with three
128-bit loads, and the three tiles have one shape and one register layout. The low and high
nibbles of the code tile belong to the first- and second-half sm tiles element by element, so
decoding is element-wise (no shuffles between lanes), and each decoded half tile is a plain
operand (a 2-D tile of bf16) for FMAs or ``tl.dot``. For a byte permute decoder, four weights'
sm bytes and four code bytes are one 32-bit register each, and ``prmt`` + shift + ``lop3`` give
two bf16x2 words (see :mod:`specc.codegen.kernels.linear_bf12_v2`).

Bytes per weight, Qwen3-8B shapes (random N(0, 0.02) bf16 weights in the real shapes stand in
for the checkpoint here; per-row bases; escapes cost 6 bytes: int32 index + int16 value)::

    shape     N x K            planes  bases    escapes  total B/weight  escape rate
    qkv       6144 x 4096      1.5     0.00024  0.00047  1.50071         7.8e-5
    o         4096 x 4096      1.5     0.00024  0.00043  1.50067         7.2e-5
    gate_up   24576 x 4096     1.5     0.00024  0.00045  1.50069         7.5e-5
    down      4096 x 12288     1.5     0.00008  0.00045  1.50054         7.6e-5
    lm_head   151936 x 4096    1.5     0.00024  0.00047  1.50071         7.8e-5 (8192 rows)

i.e. 0.7503 - 0.7504 of the bf16 bytes, so the byte floor of a packed step is ~0.75x (K is a
multiple of 32 in all of them: no padding). Escapes never enter a kernel's inner loop: the planes
hold ``sm = 0, c = 0`` there (the finite stand-in ``2**(base - 127)``), and the kernels apply the
sorted table as a sparse exact fix-up after their main loop.

Layout version 3 (version 2 in 16 x 64 tiles)
=============================================
The bytes and codes of version 2, in another order, for weights with ``N % 16 == 0`` and
``Kp % 64 == 0`` (:func:`tileable`; every Qwen3-8B linear): each 16-row block's planes are
stored tile by tile, a tile being the block's 64-weight super-group ``S`` (weights ``64 S ..
64 S + 63``, two 32-weight code groups):

* ``sm``: block ``B``'s tile ``S`` is the 1024 bytes at flat offset ``16 B Kp + 1024 S``, row
  ``r`` of the block at ``+ 64 r``, each row's 64 bytes in natural K order;
* ``ex``: the same with 512-byte tiles (``8 B Kp + 512 S``, row ``r`` at ``+ 32 r``), each
  row's 32 code bytes the version-2 bytes of its two groups.

The planes keep their ``[N, Kp]`` / ``[N, Kp / 2]`` shapes (as flat buffers: "row" n of the
tensor no longer holds row n's bytes). Why: the tensor-core kernel
(:mod:`specc.codegen.kernels.linear_bf12_mma`) gives each warp one 16-row block and one
super-group at a time, so a warp's two weight loads cover one contiguous KB instead of 16 rows'
64-byte pieces K bytes apart. On the H100 the Qwen3-8B layers took 4.5% less time alone at one row
and 6.1% at 16 than in layout 2, the packed AR step 5.4% less and the Q = 16 verify step 6.7%
(docs/benchmarks/run21.md). The Triton kernels read it with the same address arithmetic.

Layout version 1 (16-weight words)
==================================
Everything is row-major ``[N, K]`` like ``nn.Linear.weight`` (N = output features, rows;
K = input features); a tensor of another rank is packed as ``[prod(shape[:-1]), shape[-1]]``.
The consumer that matters is the fused decode + GEMV/GEMM kernel
(``specc.codegen.kernels.linear_bf12``), which streams every byte exactly once and must decode
with a handful of integer instructions. Three choices serve it:

The first layout, kept so that version-1 artifacts keep loading and for
:mod:`specc.codegen.kernels.linear_bf12`:

1. **16-weight words.** K is padded to ``Kp = 16 * K16`` (``K16 = ceil(K / 16)``); word ``j``
   of a row holds the 16 consecutive weights ``k = 16 j + q`` (q = 0..15): 16 sm bytes and 16
   codes, 24 bytes. Kernel tiles are ranges of words, so a tile covers a contiguous range of K
   and its activations are one contiguous slice of x (a single load, a plain ``tl.dot``
   operand), and a decoded pair (q, q+1) is two *consecutive* K elements -- the bf16x2 register
   pair that MMA operands are made of.
2. **Three 8-byte streams of one shape.** Per row, ``sm`` holds two planes of ``K16`` 8-byte
   words: ``sm[n, 8 * (h * K16 + j) + i]`` is the sm byte of weight ``16 j + 8 h + i`` (h = 0, 1;
   i = 0..7); ``ex[n, 8 * j:8 * j + 8]`` is one 64-bit word with the 16 codes of word j. A kernel
   loads three int64 tensors of shape ``[BLOCK_N, BLOCK_J]``, all contiguous along j, so Triton
   gives them one register layout (no layout conversion between the streams), each access is a
   wide coalesced load, and every stream runs along K.
3. **Nibble order made for the decoder.** In each 32-bit half of an ex word (half h: weights
   16j + 8h + 0..7), nibble slot ``s`` (bits 4s..4s+3) holds weight ``8h + 2s`` for s < 4 and
   ``8h + 2(s - 4) + 1`` for s >= 4. Then one shift by ``7 - 4p`` puts the codes of the pair
   (8h+2p, 8h+2p+1) at bits 7..10 and 23..26 of a word -- exactly where the exponent fields of
   a packed bf16x2 pair sit -- and the sm bytes of the pair are spread into the same word by
   one byte permute (``prmt``). A pair of weights decodes in about four integer instructions
   (prmt, shift, two lop3) into the bf16x2 register that tensor cores and fp32 FMAs (one more
   shift / and each) consume. In bytes: byte ``4h + b`` of the ex word holds weight
   ``8h + [0, 4, 1, 5][b]`` in its low nibble and ``8h + [2, 6, 3, 7][b]`` in its high nibble.
   (Little-endian, as on every CUDA GPU and x86/ARM host.)

The kernel decodes the code into the exponent ``0x70 + c`` (a constant, not the row's base):
the result is the weight times ``2**(112 - base)``, a power of two that is undone once per
output element (``y[n] *= 2**(base_n - 112)``); scaling by a power of two is exact, so this is
the same bf16 product with fp32 accumulation, and no per-row value enters the inner loop. The
escape table gives the kernel a sparse, exact correction (see the kernel module).

Escape rates (tests/formats/test_bf12.py::test_realistic_escape_rates prints them; 1024 x 4096
and 4096 x 1024 bf16 weights):

  ===========================================  ===============  ===============
  weights                                      per-row base     per-tensor base
  ===========================================  ===============  ===============
  N(0, 0.02), every row the same distribution  6.8e-5 - 8.3e-5  7.4e-5 - 8.3e-5
  N(0, 0.02) * per-row scale (lognormal 0.5)   6.1e-5 - 7.1e-5  1.8e-4 - 2.0e-4
  heavier tails (scale mixture)                1.2e-4 - 1.5e-4  1.6e-4
  ===========================================  ===============  ===============

(Qwen3-8B shapes, N(0, 0.02), per-row: 7.4e-5 - 7.9e-5.) For a bell-shaped row the best
16-binade window drops the few weights above ~4 sigma and those below ~2**-12 sigma. When all
rows share one distribution the two modes are equal; when row scales differ -- as in trained
checkpoints, where rows of one matrix differ in norm -- a per-tensor window loses whole binades
of the outlying rows and escapes 3x more. Per-row costs one byte per row (4 KB of a 25 MB
4096 x 4096 matrix) and is the default; per-tensor (one byte per tensor) is kept for tensors whose
rows share one scale. Either way the cost is ~6 bytes per escape: ~0.005 bits per weight.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = ["Packed12", "pack_bf16_12bit", "packed_meta", "tileable", "plane_strides", "ESTIMATED_ESCAPE_RATE",
           "FORMAT_NAME", "FORMAT_VERSION", "FORMAT_VERSIONS", "WIDE_LAYOUTS", "TILE_ROWS", "TILE_K"]

FORMAT_NAME = "bf12"
FORMAT_VERSION = 2  # what pack_bf16_12bit writes by default (the pack pass: 3 where tileable)
FORMAT_VERSIONS = (1, 2, 3)  # what this build reads
# v2 and its tiled order v3: one family of kernels reads both, through plane_strides
WIDE_LAYOUTS = (2, 3)
TILE_ROWS = 16  # v3: rows of a tile (a tensor-core kernel block)
TILE_K = 64  # v3: weights of a tile row (a tensor-core kernel super-group)

NUM_PHASES = 16  # v1: weights per 16-weight word
GROUP = 32  # v2: weights per group (16 code bytes: low nibbles = first half, high = second)
HALF = GROUP // 2
WINDOW = 16  # exponents covered by the 4-bit code
MIN_BASE = 1  # window never includes exponent 0 (zero / subnormal) ...
MAX_BASE = 254 - (WINDOW - 1)  # ... nor 255 (inf / NaN)
# nibble order inside one 32-bit half of an ex word (see module docstring, point 3)
_I_LO = (0, 4, 1, 5)  # phase-in-half stored in the low nibble of byte b
_I_HI = (2, 6, 3, 7)  # phase-in-half stored in the high nibble of byte b
_BASE_MODES = ("row", "tensor")
_CHUNK_ELEMS = 1 << 22  # rows are packed in chunks of about this many weights (bounded memory)


def _rows_view(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    k = int(shape[-1])
    n = int(math.prod(shape[:-1])) if len(shape) > 1 else 1
    return n, k


def _k16(k: int) -> int:
    return (k + NUM_PHASES - 1) // NUM_PHASES


def _padded_cols(k: int, version: int) -> int:
    """Kp: K padded to the layout's unit (16 weights in v1, 32 in v2)."""
    unit = NUM_PHASES if version == 1 else GROUP
    return unit * ((k + unit - 1) // unit)


def tileable(shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` can take layout version 3 (16-row blocks of 64-weight tiles)."""
    n, k = _rows_view(tuple(int(s) for s in shape))
    return n % TILE_ROWS == 0 and _padded_cols(k, 2) % TILE_K == 0


def plane_strides(version: int, kp: int) -> tuple[int, int, int, int]:
    """Where a layout-2/3 weight's bytes sit inside its 16-row block, for the kernels' address
    arithmetic: (sm bytes between two rows of a block, sm bytes between two 64-weight
    super-groups of a row, the same two for ex). Byte ``j`` of row ``16 B + r``, super-group
    ``S`` is at ``16 B Kp + r * row + S * group + j`` in sm (``8 B Kp + ...`` in ex)."""
    if version == 3:
        return TILE_K, TILE_ROWS * TILE_K, TILE_K // 2, TILE_ROWS * TILE_K // 2
    if version == 2:
        return kp, TILE_K, kp // 2, TILE_K // 2
    raise ValueError(f"plane_strides: layout versions {WIDE_LAYOUTS}, not {version}")


def _tile(plane: torch.Tensor, width: int) -> torch.Tensor:
    """A version-2 plane ``[R, C]`` (R % 16 == 0; ``width`` bytes per row and super-group) in
    version 3's tile order (the same shape)."""
    r, c = plane.shape
    return plane.reshape(r // TILE_ROWS, TILE_ROWS, c // width, width).permute(0, 2, 1, 3).reshape(r, c)


def _untile(plane: torch.Tensor, width: int) -> torch.Tensor:
    """The inverse of :func:`_tile`."""
    r, c = plane.shape
    return plane.reshape(r // TILE_ROWS, c // width, TILE_ROWS, width).permute(0, 2, 1, 3).reshape(r, c)


@dataclasses.dataclass(eq=False)
class Packed12:
    """A bf16 tensor in the lossless 12-bit format (see the module docstring for the layouts).

    Tensors (all on one device):
      sm       uint8 [N, Kp]      sign|mantissa bytes: v2 in natural K order (Kp = 32 *
                                  ceil(K / 32)); v3 those in 16 x 64 tiles; v1 as two
                                  planes (Kp = 16 * ceil(K / 16))
      ex       uint8 [N, Kp // 2] 4-bit exponent codes: v2 16 bytes per 32-weight group (low
                                  nibbles the first 16 weights, high the last 16); v1 16 per
                                  8-byte word
      base     uint8 [N] ("row") or [1] ("tensor"), window = [base, base + 15]
      esc_idx  int32 (int64 if numel >= 2**31) [E], sorted flat indices into the tensor
      esc_val  int16 [E], the exact bf16 bit patterns of the escaped weights
    """

    sm: torch.Tensor
    ex: torch.Tensor
    base: torch.Tensor
    esc_idx: torch.Tensor
    esc_val: torch.Tensor
    shape: tuple[int, ...]
    base_mode: str = "row"
    version: int = 1  # layout version (the module docstring); pack_bf16_12bit writes 2
    _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    # -- geometry ---------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        """N: rows of the 2-D view ``[prod(shape[:-1]), shape[-1]]``."""
        return _rows_view(self.shape)[0]

    @property
    def cols(self) -> int:
        """K: columns (the reduction dimension of a linear layer)."""
        return _rows_view(self.shape)[1]

    @property
    def k16(self) -> int:
        """v1: 16-weight words per row."""
        return _k16(self.cols)

    @property
    def padded_cols(self) -> int:
        """Kp: columns of the sm plane (K padded to 16 in v1, to 32 in v2)."""
        return _padded_cols(self.cols, self.version)

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape)) if len(self.shape) else 1

    @property
    def device(self) -> torch.device:
        return self.sm.device

    @property
    def num_escapes(self) -> int:
        return int(self.esc_idx.numel())

    @property
    def escape_rate(self) -> float:
        """Fraction of weights kept in the escape table."""
        return self.num_escapes / max(self.numel, 1)

    @property
    def nbytes(self) -> int:
        """Bytes of all stored tensors (padding, bases and escape table included)."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / max(self.numel, 1)

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {"sm": self.sm, "ex": self.ex, "base": self.base,
                "esc_idx": self.esc_idx, "esc_val": self.esc_val}

    # -- conversion -------------------------------------------------------------------------
    def to(self, device: torch.device | str) -> "Packed12":
        t = {k: v.to(device) for k, v in self._tensors().items()}
        return Packed12(shape=self.shape, base_mode=self.base_mode, version=self.version, **t)

    def unpack(self) -> torch.Tensor:
        """The original bf16 tensor, bit for bit."""
        n, k = self.rows, self.cols
        if self.version == 1:
            k16 = self.k16
            dev = self.sm.device
            ex = self.ex.view(n, k16, 2, 4).to(torch.int32)
            codes = torch.empty(n, k16, 2, 8, dtype=torch.int32, device=dev)
            codes[..., list(_I_LO)] = ex & 0xF
            codes[..., list(_I_HI)] = ex >> 4
            codes = codes.reshape(n, NUM_PHASES * k16)[:, :k]
            sm = self.sm.view(n, 2, k16, 8).permute(0, 2, 1, 3).reshape(n, NUM_PHASES * k16)[:, :k]
        else:
            sm, ex = self.sm, self.ex
            if self.version == 3:  # the tiles back in version 2's row order
                sm, ex = _untile(sm, TILE_K), _untile(ex, TILE_K // 2)
            ex = ex.reshape(n, -1, 1, HALF).to(torch.int32)
            codes = torch.cat([ex & 0xF, ex >> 4], dim=2).reshape(n, -1)[:, :k]
            sm = sm[:, :k]
        sm = sm.to(torch.int32)
        base = self.base.to(torch.int32).view(-1, 1)
        bits = ((sm & 0x80) << 8) | ((codes + base) << 7) | (sm & 0x7F)
        bits = bits.to(torch.int16).reshape(-1)
        if self.num_escapes:
            bits[self.esc_idx.long()] = self.esc_val
        return bits.view(torch.bfloat16).reshape(self.shape)

    # -- serialisation ----------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """Small JSON-able description (also encoded in the ``meta`` tensor of the state dict)."""
        return {"format": FORMAT_NAME, "version": self.version, "shape": list(self.shape),
                "base": self.base_mode, "escapes": self.num_escapes}

    def to_state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Plain contiguous tensors under ``prefix + name``; safetensors-ready and self-describing
        (``prefix + "meta"`` is an int64 tensor [version, base_mode, ndim, *shape])."""
        out = {prefix + k: v.contiguous() for k, v in self._tensors().items()}
        out[prefix + "meta"] = torch.tensor(
            [self.version, _BASE_MODES.index(self.base_mode), len(self.shape), *self.shape],
            dtype=torch.int64)
        return out

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, torch.Tensor], prefix: str = "",
                        metadata: dict[str, Any] | None = None) -> "Packed12":
        """Inverse of :meth:`to_state_dict`. ``metadata`` (from :meth:`metadata`) is optional
        and, when given, is checked against the ``meta`` tensor."""
        meta = state_dict[prefix + "meta"].tolist()
        version, mode, ndim = int(meta[0]), int(meta[1]), int(meta[2])
        if version not in FORMAT_VERSIONS:
            raise ValueError(f"bf12 format version {version} is not supported "
                             f"(this build reads versions {FORMAT_VERSIONS})")
        shape = tuple(int(s) for s in meta[3:3 + ndim])
        base_mode = _BASE_MODES[mode]
        if metadata is not None and (list(metadata.get("shape", shape)) != list(shape)
                                     or metadata.get("base", base_mode) != base_mode
                                     or int(metadata.get("version", version)) != version):
            raise ValueError(f"bf12 metadata {metadata} does not match the stored tensors")
        p = cls(sm=state_dict[prefix + "sm"], ex=state_dict[prefix + "ex"],
                base=state_dict[prefix + "base"], esc_idx=state_dict[prefix + "esc_idx"],
                esc_val=state_dict[prefix + "esc_val"], shape=shape, base_mode=base_mode,
                version=version)
        p.validate()
        return p

    def validate(self) -> None:
        """Check shapes and dtypes (not values)."""
        n, k = self.rows, self.cols
        if self.version not in FORMAT_VERSIONS:
            raise ValueError(f"bf12 version {self.version} not in {FORMAT_VERSIONS}")
        kp = _padded_cols(k, self.version)
        if self.version == 3 and not tileable(self.shape):
            raise ValueError(f"bf12 version 3 needs N % {TILE_ROWS} == 0 and Kp % {TILE_K} == 0, got {n} x {kp}")
        want = {"sm": ((n, kp), torch.uint8), "ex": ((n, kp // 2), torch.uint8),
                "base": ((n if self.base_mode == "row" else 1,), torch.uint8)}
        for name, (shape, dtype) in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"bf12 {name}: expected {dtype} {shape}, got {t.dtype} "
                                 f"{tuple(t.shape)}")
        if self.base_mode not in _BASE_MODES:
            raise ValueError(f"bf12 base mode {self.base_mode!r} not in {_BASE_MODES}")
        if self.esc_idx.dim() != 1 or self.esc_idx.dtype not in (torch.int32, torch.int64):
            raise ValueError("bf12 esc_idx must be a 1-D int32/int64 tensor")
        if self.esc_val.shape != self.esc_idx.shape or self.esc_val.dtype != torch.int16:
            raise ValueError("bf12 esc_val must be int16 with the shape of esc_idx")


def _exponent_hist(exp: torch.Tensor) -> torch.Tensor:
    """[R, 256] int32 counts of the exponent fields of each row."""
    hist = torch.zeros(exp.shape[0], 256, dtype=torch.int32, device=exp.device)
    hist.scatter_add_(1, exp, torch.ones_like(exp, dtype=torch.int32))
    return hist


def _best_base(hist: torch.Tensor) -> torch.Tensor:
    """Per row of ``hist`` [R, 256]: the base b in [MIN_BASE, MAX_BASE] whose window
    [b, b + 15] holds the most weights (first on ties), as int64 [R]."""
    h = hist.to(torch.int64)
    h[:, 0] = 0
    h[:, 255] = 0
    cs = torch.cumsum(h, dim=1)
    cs = torch.nn.functional.pad(cs, (1, 0))  # cs[:, i] = sum(h[:, :i])
    b = torch.arange(MIN_BASE, MAX_BASE + 1, device=hist.device)
    win = cs[:, b + WINDOW] - cs[:, b]
    return torch.argmax(win, dim=1) + MIN_BASE


def _check_layout(base: str, version: int, shape: tuple[int, ...]) -> None:
    """A pack's base mode and layout version (for ``shape``), or a ValueError naming the ones there are."""
    if base not in _BASE_MODES:
        raise ValueError(f"base must be one of {_BASE_MODES}, got {base!r}")
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"bf12 version must be one of {FORMAT_VERSIONS}, got {version!r}")
    if version == 3 and not tileable(shape):
        raise ValueError(f"bf12 version 3 needs {TILE_ROWS}-row blocks of {TILE_K}-weight tiles: "
                         f"shape {tuple(shape)} (use version 2)")


# Escapes per weight assumed where there are no values to count (meta tensors): the rate measured
# on N(0, 0.02) weights in Qwen3-8B's shapes (7.5e-5 .. 7.7e-5, examples/bench_bf12.py). At 6 bytes
# an escape it moves a layer's packed bytes by < 0.05%, so the estimate cannot change a price.
ESTIMATED_ESCAPE_RATE = 7.7e-5


def packed_meta(shape: tuple[int, ...], base: str = "row", version: int = FORMAT_VERSION,
                escape_rate: float = ESTIMATED_ESCAPE_RATE) -> Packed12:
    """The packed form of a bf16 tensor of ``shape`` that has no values (the meta device: ``specc
    cost`` prices steps traced from config.json alone): meta planes of the layout's exact sizes,
    and an escape table of ``escape_rate`` x numel entries, an estimate (the count needs values)."""
    shape = tuple(int(s) for s in shape)
    _check_layout(base, version, shape)
    n, k = _rows_view(shape)
    kp = _padded_cols(k, version)
    numel = n * k
    escapes = int(round(escape_rate * numel))

    def meta(size, dtype):
        return torch.empty(size, dtype=dtype, device="meta")

    return Packed12(sm=meta((n, kp), torch.uint8), ex=meta((n, kp // 2), torch.uint8),
                    base=meta((n if base == "row" else 1,), torch.uint8),
                    esc_idx=meta((escapes,), torch.int32 if numel < 2 ** 31 else torch.int64),
                    esc_val=meta((escapes,), torch.int16), shape=shape, base_mode=base, version=version)


def pack_bf16_12bit(tensor: torch.Tensor, base: str = "row", version: int = FORMAT_VERSION) -> Packed12:
    """Pack a bf16 tensor into the lossless 12-bit format (see the module docstring).

    ``base="row"`` chooses one base exponent per row of the ``[prod(shape[:-1]), shape[-1]]``
    view (the default; fewer escapes), ``base="tensor"`` one for the whole tensor.
    ``version`` picks the layout (2, the default: natural-order sign|mantissa plane and
    32-weight code groups; 3: those in 16 x 64 tiles, for :func:`tileable` shapes; 1: the
    16-weight-word layout). Works on any device; the result
    lives on the input's device. ``unpack()`` returns it bit-exactly.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"pack_bf16_12bit expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bfloat16:
        raise TypeError(f"pack_bf16_12bit expects a bfloat16 tensor, got {tensor.dtype}")
    _check_layout(base, version, tuple(tensor.shape))
    if tensor.numel() == 0:
        raise ValueError(f"cannot pack an empty tensor (shape {tuple(tensor.shape)})")
    shape = tuple(int(s) for s in tensor.shape)
    n, k = _rows_view(shape)
    k16 = _k16(k)
    kp = _padded_cols(k, version)
    dev = tensor.device
    w = tensor.detach().contiguous().view(torch.int16).reshape(n, k)
    chunk = max(1, _CHUNK_ELEMS // max(k, 1))
    if version == 3:  # chunks of whole 16-row blocks: each is tiled in place
        chunk = TILE_ROWS * max(1, chunk // TILE_ROWS)

    def exps(rows: torch.Tensor) -> torch.Tensor:
        return ((rows.to(torch.int64) >> 7) & 0xFF)

    if base == "tensor":
        hist = torch.zeros(1, 256, dtype=torch.int64, device=dev)
        for r0 in range(0, n, chunk):
            hist += _exponent_hist(exps(w[r0:r0 + chunk]).reshape(1, -1)).to(torch.int64)
        tensor_base = _best_base(hist)  # [1]

    sm_out = torch.empty(n, kp, dtype=torch.uint8, device=dev)
    ex_out = torch.empty(n, kp // 2, dtype=torch.uint8, device=dev)
    base_out = torch.empty(n if base == "row" else 1, dtype=torch.uint8, device=dev)
    esc_parts: list[torch.Tensor] = []
    i_lo = torch.tensor(_I_LO, device=dev)
    i_hi = torch.tensor(_I_HI, device=dev)
    for r0 in range(0, n, chunk):
        rows = w[r0:r0 + chunk]
        r = rows.shape[0]
        bits = rows.to(torch.int32) & 0xFFFF
        exp = (bits >> 7) & 0xFF
        if base == "row":
            b = _best_base(_exponent_hist(exp.to(torch.int64)))
            base_out[r0:r0 + r] = b.to(torch.uint8)
        else:
            b = tensor_base.expand(r)
        code = exp - b.to(torch.int32).view(-1, 1)
        esc = (code < 0) | (code >= WINDOW)
        sm = torch.where(esc, 0, ((bits >> 8) & 0x80) | (bits & 0x7F))
        code = torch.where(esc, 0, code)
        flat = torch.nonzero(esc.reshape(-1)).reshape(-1)
        if flat.numel():
            esc_parts.append(flat + r0 * k)
        if kp != k:
            sm = torch.nn.functional.pad(sm, (0, kp - k))
            code = torch.nn.functional.pad(code, (0, kp - k))
        if version == 1:
            # [r, K16 words, 2 halves, 8] -> sm planes [r, 2 halves, K16 words, 8]
            sm_out[r0:r0 + r] = sm.view(r, k16, 2, 8).permute(0, 2, 1, 3).reshape(r, kp).to(torch.uint8)
            c = code.view(r, k16, 2, 8)
            exb = c.index_select(3, i_lo) | (c.index_select(3, i_hi) << 4)  # [r, K16, 2, 4]
        else:
            # natural-order sm; group g's code byte i = code(32g + i) | code(32g + 16 + i) << 4
            sm = sm.to(torch.uint8)
            c = code.view(r, kp // GROUP, 2, HALF)
            exb = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(r, kp // 2).to(torch.uint8)
            if version == 3:
                sm, exb = _tile(sm, TILE_K), _tile(exb, TILE_K // 2)
            sm_out[r0:r0 + r] = sm
        ex_out[r0:r0 + r] = exb.reshape(r, kp // 2).to(torch.uint8)
    if base == "tensor":
        base_out[0] = tensor_base.to(torch.uint8)[0]
    numel = n * k
    idx_dtype = torch.int32 if numel < 2 ** 31 else torch.int64
    if esc_parts:
        esc_idx = torch.cat(esc_parts)
    else:
        esc_idx = torch.zeros(0, dtype=torch.int64, device=dev)
    esc_val = w.reshape(-1)[esc_idx]
    return Packed12(sm=sm_out, ex=ex_out, base=base_out, esc_idx=esc_idx.to(idx_dtype),
                    esc_val=esc_val.contiguous(), shape=shape, base_mode=base, version=version)
