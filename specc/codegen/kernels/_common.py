"""Helpers shared by the Triton kernels of this package (dispatch, dtype checks, workspaces).

Dispatch rule of every launcher here: a CUDA tensor runs the Triton kernel; a CPU tensor runs the
Triton kernel under the interpreter when ``TRITON_INTERPRET=1`` was set before triton was first
imported, and otherwise the launcher's pure-torch reference (the CPU fallback). Kernels load
every value, widen it to fp32 at once and round explicitly where the reference rounds, so they
also run under the interpreter on bf16 tensors (the interpreter converts bf16 <-> fp32 but cannot
do bf16 arithmetic); dots take fp32 operands (``input_precision="ieee"``) when interpreted.
"""

from __future__ import annotations

from typing import Mapping

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from specc.codegen.kernels import dispatch as _dispatch
from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled
from specc.codegen.kernels.dispatch import use_triton  # noqa: F401  (the kernels import it from here)


@triton.jit
def _probe(x_ptr):
    pass


# Triton replaces its own library functions when it is imported with TRITON_INTERPRET=1, so the
# mode is fixed process-wide at triton's import; read it off a jitted function's type.
INTERPRETED: bool = type(_probe).__name__ == "InterpretedFunction"
_dispatch.INTERPRETED = INTERPRETED

# The interpreter converts fp32 -> bf16 by truncation; the GPU rounds to nearest even. Kernels
# cast through ``round_to`` so both give the GPU's (and torch's) result.
EMULATE_BF16 = tl.constexpr(INTERPRETED)


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """Cast an fp32 tensor to DTYPE with round-to-nearest-even (also under the interpreter)."""
    if EMULATE_BF16:
        if DTYPE == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True).to(DTYPE)
        else:
            return x.to(DTYPE)
    else:
        return x.to(DTYPE)


@triton.jit
def rounded(x, DTYPE: tl.constexpr):
    """fp32 -> DTYPE -> fp32: the value the reference holds after rounding to DTYPE."""
    return round_to(x, DTYPE).to(tl.float32)


# Precise transcendental functions: libdevice (as torch's CUDA kernels use) when compiled, numpy
# under the interpreter (which does not implement libdevice). tl.cos/tl.sin may lower to the
# approximate hardware instructions, which are poor for rope's large arguments.
_LIBDEVICE = tl.constexpr(not INTERPRETED)


@triton.jit
def precise_cos(x):
    if _LIBDEVICE:
        return libdevice.cos(x)
    else:
        return tl.cos(x)


@triton.jit
def precise_sin(x):
    if _LIBDEVICE:
        return libdevice.sin(x)
    else:
        return tl.sin(x)


@triton.jit
def precise_exp(x):
    if _LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def tl_dtype(dtype: torch.dtype):
    return _TL_DTYPES[dtype]


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def check_tensor(name: str, t, op: str, ndim: int | None = None, dtypes=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} dtype {t.dtype} not supported (use one of {dtypes})")


def check_same_device(op: str, **tensors) -> None:
    devs = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise ValueError(f"{op}: tensors on different devices: "
                         + ", ".join(f"{k} on {v}" for k, v in devs.items()))


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 for an H100/H200 SXM; 132 on the CPU)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 132


_SMS: dict[int, int] = {}


def _sm_count(index: int) -> int:
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


class Workspaces:
    """Per-device scratch buffers that only grow. Buffers that are replaced stay referenced, so
    CUDA graphs captured with an older buffer keep valid pointers. Counters handed out are zero
    and kernels must leave them zero (they reset what they use)."""

    def __init__(self):
        self._bufs: dict[tuple, torch.Tensor] = {}
        self._old: list[torch.Tensor] = []

    def get(self, key: str, device: torch.device, numel: int, dtype: torch.dtype,
            minimum: int = 1 << 12) -> torch.Tensor:
        k = (key, str(device), dtype)
        buf = self._bufs.get(k)
        if buf is None or buf.numel() < numel:
            if buf is not None:
                self._old.append(buf)
            buf = torch.zeros(max(numel, minimum), dtype=dtype, device=device)
            self._bufs[k] = buf
        return buf


WORKSPACES = Workspaces()


def bucket_of(m: int, buckets) -> int:
    """The smallest bucket >= m (the largest bucket above them all): M rows -> config key."""
    for b in buckets:
        if m <= b:
            return b
    return buckets[-1]


class ConfigTable:
    """Per-shape launch configs of a GEMM-like kernel, keyed by (M bucket, N, K).

    Lookup order: a deployment's override (``set``), then the tuned table shipped with the
    kernel, then the kernel's heuristic. One class so every kernel's tuning hooks behave alike.
    ``invariant``: the one config of every shape in the batch-invariant mode
    (:mod:`specc.codegen.kernels.batch_invariant`), where a choice by M would change a row's
    summation order with its batch.
    """

    def __init__(self, config_cls, defaults: dict, heuristic, bucket, invariant=None):
        self.config_cls, self.defaults, self.heuristic, self.bucket = config_cls, defaults, heuristic, bucket
        self.invariant = invariant
        self.overrides: dict = {}

    def key(self, m: int, n: int, k: int) -> tuple[int, int, int]:
        return (self.bucket(m), int(n), int(k))

    def get(self, m: int, n: int, k: int):
        """Config for an ``[m, k] x [n, k]^T`` product: override, else table, else heuristic
        (``invariant`` for every product in the batch-invariant mode)."""
        if self.invariant is not None and batch_invariant_enabled():
            return self.invariant
        key = self.key(m, n, k)
        if key in self.overrides:
            return self.overrides[key]
        if key in self.defaults:
            return self.defaults[key]
        return self.heuristic(*key)

    def set(self, m: int, n: int, k: int, config) -> None:
        """Override the config of (bucket(m), n, k); ``None`` removes the override."""
        key = self.key(m, n, k)
        if config is None:
            self.overrides.pop(key, None)
        else:
            self.overrides[key] = self.coerce(config)

    def clear(self) -> None:
        """Drop all overrides."""
        self.overrides.clear()

    def coerce(self, c):
        if isinstance(c, self.config_cls):
            return c
        if isinstance(c, Mapping):
            return self.config_cls(**c)
        raise TypeError(f"config must be a {self.config_cls.__name__} or a mapping, got {type(c).__name__}")
