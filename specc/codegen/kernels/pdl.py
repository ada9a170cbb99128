"""Programmatic dependent launch (PDL, Hopper and newer): a kernel overlaps its predecessor.

Between two kernels of a step the GPU drains the first (its last programs' loads, its tail
wave) and only then starts the second, whose first loads then wait a DRAM round trip: on a bs1
decode step of ~250 bandwidth-bound kernels that gap is most of the distance to the weight
floor. With PDL a kernel is launched while its predecessor still runs; it may do work that needs
nothing the predecessor writes (load its own first weight tile) and then waits
(``griddepcontrol.wait``) until the predecessor has finished and its writes are visible.

Modes (``PDL_MODE``, from the environment variable ``SPECC_PDL`` at import; the launchers read
it at every launch, so a CUDA graph records the mode it was captured under):

* 0, off: plain launches.
* 1, wait: kernels start early, wait at once, then let their successor start.
* 2, first tile (the default): as 1, but the GEMV kernels (specc's bf16 linear at one row, the
  bf12 FMA path) load their first weight tile before waiting, so their first DRAM round trip
  overlaps the predecessor's tail.

``SPECC_PDL_SKIP`` (``PDL_SKIP``) launches the named kernel families (``PDL_FAMILIES``; each
launcher names its own) plainly, to measure or rule out one of them.

Every kernel launched with PDL waits before it reads anything an earlier kernel wrote and before
it writes anything, and releases its successor only after that wait, so at most two kernels
overlap and a kernel after the wait sees every earlier kernel's writes (each earlier kernel
finished after waiting on its own predecessor). Kernels launched without PDL (torch's, cuBLAS's)
run as before and start only when everything before them has finished.

On the H200 (docs/benchmarks/h200-run12.md) mode 2 takes 4.2% off the compiled Qwen3-8B AR step
and 2% off the Q = 16 verify step, with logits identical bit for bit; end to end 5-6% more decode
tokens/s. Tried and dropped: bulk L2 prefetches of each program's whole weight slab before the
wait (every linear 10-60% slower), and PDL on the bf12 dot path (slower).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import INTERPRETED
from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled

__all__ = ["PDL_MODES", "PDL_FAMILIES", "PDL_SUPPORTED", "PDL_MODE", "PDL_SKIP", "pdl_mode", "pdl_launch",
           "pdl_args", "pdl_wait", "device_mode", "launch_mode"]

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
    raw = os.environ.get("SPECC_PDL", "2").strip().lower()
    named = {"off": 0, "no": 0, "false": 0, "wait": 1, "on": 2, "yes": 2, "true": 2, "first-tile": 2}
    if raw in named:
        return named[raw]
    if raw.isdigit() and int(raw) in PDL_MODES:
        return int(raw)
    raise ValueError(f"SPECC_PDL={raw!r}: use one of {sorted(PDL_MODES)} or {sorted(named)} ({PDL_MODES})")


PDL_MODE: int = _mode_from_env()
PDL_FAMILIES = ("linear", "linear_dot", "bf12", "attention", "rope", "rms_norm", "silu_mul", "embedding",
                "argmax", "accept", "kv_compact", "tree_beam", "gdn", "ragged_attention")


def _skip_from_env() -> frozenset:
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


def device_mode(device) -> int:
    """:func:`pdl_mode` for a device given by name or ``torch.device``, 0 where no usable CUDA
    device answers (for reports and cache names, which must not fail on a machine without one)."""
    try:
        return pdl_mode(torch.device(device))
    except (RuntimeError, AssertionError):
        return 0


def launch_mode(device) -> str:
    """How kernels launched now on ``device`` start, for reports: ``"plain"``, or the PDL mode
    (``"pdl 2 (first tile)"``) with any families launched plainly; ``", batch-invariant"`` is
    appended in that mode (:mod:`.batch_invariant`: other configs, other timings)."""
    mode = device_mode(device)
    tail = ", batch-invariant" if batch_invariant_enabled() else ""
    if not mode:
        return "plain" + tail
    skip = f", plain: {', '.join(sorted(PDL_SKIP))}" if PDL_SKIP else ""
    return f"pdl {mode} ({PDL_MODES[mode]}{skip}){tail}"


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
