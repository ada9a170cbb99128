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


# ------------------------------------------------------------------------------------------
# Programmatic dependent launch (PDL, Hopper and newer)
# ------------------------------------------------------------------------------------------
# Between two kernels of a step the GPU drains the first (its last programs' loads, its tail
# wave) and only then starts the second, whose first loads then wait a DRAM round trip: on a
# bs1 decode step of ~250 bandwidth-bound kernels that gap is most of the distance to the weight
# floor. With PDL a kernel is launched while its predecessor still runs; it may do work that
# needs nothing the predecessor writes (prefetch its own weights into L2) and then waits
# (``griddepcontrol.wait``) until the predecessor has finished and its writes are visible.
#
# Modes (``PDL_MODE``, from the environment variable ``SPECC_PDL`` at import; the launchers read
# it at every launch, so a CUDA graph records the mode it was captured under; ``PDL_SKIP`` below
# turns single kernel families off):
#   0  off: plain launches.
#   1  wait: kernels start early, wait at once, then let their successor start.
#   2  first tile (the default): as 1, but the GEMV kernels (specc's bf16 linear at one row, the bf12 FMA
#      path) load their first weight tile before waiting, so their first DRAM round trip
#      overlaps the predecessor's tail.
# Every kernel launched with PDL waits before it reads anything an earlier kernel wrote and
# before it writes anything, and releases its successor only after that wait, so at most two
# kernels overlap and a kernel after the wait sees every earlier kernel's writes (each earlier
# kernel finished after waiting on its own predecessor). Kernels launched without PDL (torch's,
# cuBLAS's) run as before and start only when everything before them has finished.
# On the H200 (docs/benchmarks/h200-run12.md) mode 2 takes 4.2% off the compiled Qwen3-8B AR step
# and 2.1% off the Q = 16 verify step, with logits identical bit for bit; end to end 5-6% more
# decode tokens/s. Tried and dropped: bulk L2 prefetches of each program's whole weight slab
# before the wait (every linear 10-60% slower), and PDL on the bf12 dot path (slower).
PDL_MODES = {0: "off", 1: "wait", 2: "first tile"}


def _pdl_supported() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except Exception:  # an older Triton: no griddepcontrol
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


PDL_SUPPORTED: bool = (not INTERPRETED) and _pdl_supported()


def _mode_from_env() -> int:
    import os

    raw = os.environ.get("SPECC_PDL", "2").strip().lower()
    named = {"off": 0, "no": 0, "false": 0, "wait": 1, "on": 2, "yes": 2, "true": 2, "first-tile": 2}
    if raw in named:
        return named[raw]
    if raw.isdigit() and int(raw) in PDL_MODES:
        return int(raw)
    raise ValueError(f"SPECC_PDL={raw!r}: use one of {sorted(PDL_MODES)} or {sorted(named)} ({PDL_MODES})")


PDL_MODE: int = _mode_from_env()
# The kernel families that launch with PDL (each launcher names its own); ``SPECC_PDL_SKIP`` (a
# comma-separated list) launches the named ones plainly, to measure or rule out one family.
PDL_FAMILIES = ("linear", "linear_dot", "bf12", "attention", "rope", "rms_norm", "silu_mul", "embedding",
                "argmax")


def _skip_from_env() -> frozenset:
    import os

    names = frozenset(n.strip() for n in os.environ.get("SPECC_PDL_SKIP", "").split(",") if n.strip())
    unknown = sorted(names - set(PDL_FAMILIES))
    if unknown:
        raise ValueError(f"SPECC_PDL_SKIP: unknown kernel families {unknown} (use {', '.join(PDL_FAMILIES)})")
    return names


PDL_SKIP: frozenset = _skip_from_env()
_PDL_DEVICES: dict[int, bool] = {}


def pdl_mode(t: torch.Tensor | torch.device, family: str | None = None) -> int:
    """The PDL mode a launch of ``family``'s kernel on ``t``'s device (or on the device ``t``)
    uses: ``PDL_MODE`` on a CUDA device of compute capability 9.0 or newer with a Triton that
    has griddepcontrol, unless the family is in ``PDL_SKIP``; else 0."""
    device = t if isinstance(t, torch.device) else t.device
    if not PDL_MODE or not PDL_SUPPORTED or device.type != "cuda" or family in PDL_SKIP:
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _PDL_DEVICES:
        _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return PDL_MODE if _PDL_DEVICES[index] else 0


def pdl_launch(mode: int) -> dict:
    """Launch keyword arguments for a kernel compiled with ``PDL=mode``."""
    return {"launch_pdl": True} if mode else {}


def pdl_args(t: torch.Tensor, family: str) -> dict:
    """``PDL=mode`` and the launch flag for a kernel of ``family`` whose only PDL code is
    :func:`pdl_wait` at its top, launched on ``t``'s device."""
    mode = pdl_mode(t, family)
    return {"PDL": mode, **pdl_launch(mode)}


if PDL_SUPPORTED:
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_release
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
else:
    _gdc_release = _gdc_wait = None


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous kernel has finished and its writes are visible (no-op unless
    launched with PDL), then let the next kernel start."""
    if PDL > 0:
        _gdc_wait()
        _gdc_release()


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
    """

    def __init__(self, config_cls, defaults: dict, heuristic, bucket):
        self.config_cls, self.defaults, self.heuristic, self.bucket = config_cls, defaults, heuristic, bucket
        self.overrides: dict = {}

    def key(self, m: int, n: int, k: int) -> tuple[int, int, int]:
        return (self.bucket(m), int(n), int(k))

    def get(self, m: int, n: int, k: int):
        """Config for an ``[m, k] x [n, k]^T`` product: override, else table, else heuristic."""
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
