"""Batch-invariant kernel mode: a row's result does not depend on the rows launched beside it.

Why. The launchers pick their launch configuration from the whole launch: the linear picks GEMV
or tensor-core tiles and a split-K count from the row count M, attention picks its KV splits and
its merge from the batch size, lowering may hand large-M linears to cuBLAS. Each choice sums a
row's fp32 products in another order, so a request's logits differ in the last bits between
running alone and as one row of a batch. Greedy decoding rarely notices; sampled decoding flips a
draw that falls within that rounding of a token boundary or an acceptance threshold, and the
request's output then parts from the one it gives alone (docs/sampling.md, "Not done").

What. With the mode on, every launcher computes each output element with one instruction
sequence whatever the number of rows or requests (what vLLM calls batch-invariant kernels):

* linear (``linear.py``): one fixed tensor-core config for every M
  (:data:`specc.codegen.kernels.linear.BATCH_INVARIANT_CONFIG`), no automatic split-K (its
  count follows the tile count), the norm through the row-wise ``rms_norm`` kernel; the bf12
  kernels likewise take one fixed tensor-core config each; lowering's cuBLAS choice
  (``kernel_abi``'s ``cublas_rows``) is ignored, so every linear runs specc's kernel.
* attention (``attention.py``): the KV splits and the merge are planned as for batch 1 (tiles
  follow the per-request query rows, never the batch); ``ragged_attention.py``, whose one plan
  serves rows of every length, plans as for one row of one token, whatever the mix.

The other launchers (row norms, element-wise ops, rope, argmax, acceptance, cache copies, the GDN
kernels) already launch one program per row or element with tiles sized by the hidden / head /
vocabulary sizes only: they are invariant as they are. Not covered: torch ops outside specc's
kernels (the sampling ops, the eager model definitions' ``F.linear``) and tensor-parallel
all-reduces (NCCL's reduction order follows the message size). A request alone verifies with the
dense kernel, so the speculative loop verifies batches dense too in this mode (no ragged packing,
one level: ``DeviceSpeculativeDecoder.verifies_ragged``).

Cost. The M = 1 GEMV (the fastest bs1 decode linear) is replaced by the 16-row tensor-core
kernel, split-K no longer fills the SMs on small layers, batched steps run bs1 attention splits
(their own plan was up to ~2.5x faster on the H200, docs/benchmarks/h200-run8.md), and large-M
linears lose cuBLAS. Not measured on a GPU yet.

``SPECC_BATCH_INVARIANT`` (``1`` / ``0``, default ``0``) sets the mode at import; the launchers
read :func:`enabled` at every launch, so a CUDA graph keeps the configuration it was captured
with: set the mode before capture (and before warm-up, whose kernel-cache marker names it).
:func:`batch_invariant` switches it in-process (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["ENV", "enabled", "batch_invariant"]

ENV = "SPECC_BATCH_INVARIANT"
_VALUES = {"0": False, "1": True, "off": False, "on": True, "false": False, "true": True}


def _from_env() -> bool:
    raw = os.environ.get(ENV, "0").strip().lower()
    if raw not in _VALUES:
        raise ValueError(f"{ENV}={raw!r}: use 1 (batch-invariant kernels) or 0 (the default)")
    return _VALUES[raw]


BATCH_INVARIANT: bool = _from_env()


def enabled() -> bool:
    """Whether launches now use the batch-invariant configurations."""
    return BATCH_INVARIANT


@contextlib.contextmanager
def batch_invariant(on: bool = True):
    """Launch with the mode ``on`` (or off) while inside; restores the previous mode after. A
    CUDA graph captured inside keeps the configurations it captured."""
    global BATCH_INVARIANT
    saved, BATCH_INVARIANT = BATCH_INVARIANT, bool(on)
    try:
        yield
    finally:
        BATCH_INVARIANT = saved
