"""Host syncs, eager glue ops and step forwards per speculative step, counted on any device.

Why: at small batches a speculative step's time is the verify and draft forwards (CUDA graphs on
a GPU) plus the loop's glue between them: the small tensor ops that assemble inputs, decide
acceptance and commit (each one kernel launch on a GPU, a few microseconds of host time each),
and every read of a device value on the host (``.tolist()``, ``.item()``, ``bool(t)``, ``int(t)``,
``.cpu()``...), each of which waits for the device to drain. Neither shows in a CPU timing, but
both can be counted on the CPU, where the tests run.

:class:`StepAudit` counts, while active: ``host_reads`` (value reads of tensors by the loop's own
code), ``glue_ops`` (aten ops outside the steps that are not views: an upper bound on the glue's
kernel launches), ``blocking_uploads`` (host values copied to the device by a blocking copy,
which on CUDA waits for the stream to drain like a host read: ``torch.tensor(..., device=)``
anywhere, and ``.to()`` / ``.cuda()`` of a host tensor to a CUDA device without
``non_blocking``; ``specc.runtime.uploads.upload`` queues them instead), ``forwards`` (calls of the step modules; inside them nothing is counted:
on a GPU a graphed step is one replay, and a compiled step has no host reads) and
``glue_seconds`` (wall time outside the step forwards: the host time a GPU waits through after
each step's host read, since the next step's first launch comes only after it). Steps are found
on the loop (target, ragged and tree steps, the drafter's model) and marked with forward hooks,
so nothing is replaced.
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["StepAudit", "HOST_READS", "step_modules"]

# Tensor methods that copy a value to the host (a device sync on CUDA)
HOST_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"})


def step_modules(loop) -> list[torch.nn.Module]:
    """The loop's step modules (target, ragged and tree steps, the drafter's model), unwrapped
    from graph wrappers: what counts as a forward rather than glue."""
    found = []
    drafter = getattr(loop, "drafter", None)
    candidates = [getattr(loop, "target", None), getattr(loop, "ragged_target", None),
                  getattr(loop, "tree_target", None), getattr(drafter, "model", None), getattr(drafter, "drafter", None)]
    for step in candidates:
        while step is not None and not isinstance(step, torch.nn.Module) and hasattr(step, "step"):
            step = step.step  # a graph wrapper or a spy
        if isinstance(step, torch.nn.Module) and all(step is not m for m in found):
            found.append(step)
    return found


class _Reads(TorchFunctionMode):
    def __init__(self, audit):
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if self.audit._depth == 0:
            if name in HOST_READS or (name == "to" and _to_host(args, kwargs)):
                self.audit.host_reads += 1
                self.audit.reads_by[name] += 1
            elif _blocking_upload(name, args, kwargs or {}):
                self.audit.blocking_uploads += 1
        return func(*args, **(kwargs or {}))


def _blocking_upload(name: str, args, kwargs: dict) -> bool:
    if name in ("tensor", "as_tensor"):
        return kwargs.get("device") is not None
    if name in ("to", "cuda") and torch.is_tensor(args[0]) and not args[0].is_cuda and not kwargs.get("non_blocking"):
        wanted = [a for a in list(args[1:]) + list(kwargs.values()) if isinstance(a, (str, torch.device))]
        return name == "cuda" or any(torch.device(a).type == "cuda" for a in wanted)
    return False


def _to_host(args, kwargs) -> bool:
    wanted = [a for a in list(args[1:]) + list((kwargs or {}).values()) if isinstance(a, (str, torch.device))]
    return any(torch.device(a).type == "cpu" for a in wanted) and torch.is_tensor(args[0]) and args[0].is_cuda


class _Ops(TorchDispatchMode):
    def __init__(self, audit):
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.audit._depth == 0 and not func.is_view and func.__name__ not in ("_local_scalar_dense.default",):
            self.audit.glue_ops += 1
            self.audit.ops_by[func.__name__] += 1
        return func(*args, **(kwargs or {}))


class StepAudit:
    """Counts for the code run inside ``with audit:`` (module doc). ``loop``: a
    ``DeviceSpeculativeDecoder`` (or anything with the same step attributes)."""

    def __init__(self, loop):
        self.loop = loop
        self.host_reads = self.glue_ops = self.forwards = self.blocking_uploads = 0
        self.reads_by: collections.Counter = collections.Counter()
        self.ops_by: collections.Counter = collections.Counter()
        self.glue_seconds = 0.0
        self._depth = 0
        self._since = 0.0
        self._stack: contextlib.ExitStack | None = None

    def _enter_step(self, module, args):
        if self._depth == 0:
            self.forwards += 1
            self.glue_seconds += time.perf_counter() - self._since
        self._depth += 1

    def _leave_step(self, module, args, out):
        self._depth -= 1
        if self._depth == 0:
            self._since = time.perf_counter()

    def __enter__(self) -> "StepAudit":
        stack = contextlib.ExitStack()
        for module in step_modules(self.loop):
            stack.callback(module.register_forward_pre_hook(self._enter_step).remove)
            stack.callback(module.register_forward_hook(self._leave_step).remove)
        stack.enter_context(_Reads(self))
        stack.enter_context(_Ops(self))
        self._stack = stack
        self._since = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self._depth == 0:
            self.glue_seconds += time.perf_counter() - self._since
        self._stack.close()
        self._stack = None

    def counts(self) -> dict:
        return {"host_reads": self.host_reads, "blocking_uploads": self.blocking_uploads, "glue_ops": self.glue_ops,
                "forwards": self.forwards,
                "glue_seconds": self.glue_seconds}
