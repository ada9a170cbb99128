"""Warm start: the one-time work of loading an artifact, done up front, timed per phase.

``specc.load`` (``runtime.engine.load``) calls, in order:

1. :func:`kernel_cache_dir` before any kernel compiles: Triton keeps compiled kernels in
   ``$TRITON_CACHE_DIR``; unless the user set it, specc points it at a directory keyed by the
   artifact (``$SPECC_KERNEL_CACHE`` or ``~/.cache/specc/kernels``, then the first 16 hex digits
   of the SHA-256 of the artifact's manifest.json), so a second load of the same artifact finds
   every kernel compiled and starts in seconds. The environment variable is process-wide: a
   second artifact loaded in the same process switches it to its own directory.
2. :func:`warm_up` after the engine is built: runs the device loop over the shapes it will use
   on a dummy prompt, twice over on CUDA:

   - ``kernels``: every step called with every shape the loop uses (prefill, the drafter's
     shapes via ``Drafter.capture_shapes``, the verify block), CUDA graphs bypassed: Triton
     compiles (or loads from the cache) and autotunes here. On CUDA, short generations from
     prompts of the lengths in :func:`prefill_lengths` follow: a prefill's kernels are compiled
     per row bucket (the linear's M config) and Triton specializes integer arguments divisible
     by 16, so one dummy prompt left most prompt lengths to compile on the user's first prompt
     of that length (1.4 - 1.9 s stalls on two of eight prompts in an H200 `specc bench` run).
     Given the artifact's kernel cache directory, a marker file there (:func:`prefills_marker`:
     :data:`PREFILLS_MARKER`, with the launch mode where kernels use programmatic dependent
     launch or the batch-invariant configs) records that this was done: a later load finds those
     kernels compiled on disk (a first use then only loads a cached binary, milliseconds) and
     skips the sweep, keeping a second load fast;
   - ``graphs``: the same again with CUDA graphs on: every step shape is captured now, not
     while the user's tokens are being timed (a step that is not idempotent, a hybrid target's,
     at its second call of a shape: ``specc.runtime.graphs``; a shape the dummy generation
     calls once is captured at its second call later).

   On CPU only the first runs (there are no graphs): one short generation, counted and timed.

``engine.load_stats`` holds seconds per phase (``read``: manifest, hashes, weights and modules;
``kernels``; ``graphs``) and the counts (warm-up generations, graphs captured, cache directory).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Callable

import torch

Progress = Callable[[str, float], None]  # (phase description, seconds it took)


def kernel_cache_root() -> Path:
    env = os.environ.get("SPECC_KERNEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specc" / "kernels"


def artifact_key(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of the artifact's manifest.json (which itself
    records the hash of every file of the artifact)."""
    return hashlib.sha256((Path(path) / "manifest.json").read_bytes()).hexdigest()[:16]


def kernel_cache_dir(path: Path) -> str | None:
    """Point Triton's kernel cache at the artifact's directory (see the module docstring) and
    return it; None when the user chose ``TRITON_CACHE_DIR`` themselves (it is kept) or no
    cache directory can be created."""
    if os.environ.get("TRITON_CACHE_DIR") and not os.environ.get("_SPECC_SET_TRITON_CACHE"):
        return None
    target = kernel_cache_root() / artifact_key(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    os.environ["TRITON_CACHE_DIR"] = str(target)
    os.environ["_SPECC_SET_TRITON_CACHE"] = "1"
    _point_live_triton(str(target))
    return str(target)


def _point_live_triton(directory: str) -> None:
    """Triton >= 3.4 keeps its settings in ``triton.knobs``: when triton is already imported,
    point the live cache knob at ``directory`` too."""
    import sys

    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None) if triton is not None else None
    try:
        if knobs is not None and hasattr(knobs, "cache"):
            knobs.cache.dir = directory
    except Exception:  # pragma: no cover - a layout without a settable cache knob
        pass


def _device_of(graphed) -> str:
    return next((str(s.step.device) for s in graphed if s.step.device.type == "cuda"), "cpu")


def _graphed(loop) -> list:
    from specc.runtime.graphs import GraphedStep

    return [s for s in getattr(loop, "steps", {}).values() if isinstance(s, GraphedStep)]


PREFILLS_MARKER = "prefills-compiled"  # in the kernel cache directory: the sweep ran there


def prefills_marker(device) -> str:
    """The marker's name for kernels launched on ``device``: kernels built for programmatic
    dependent launch are other binaries than plain ones (docs/kernels.md), and the
    batch-invariant mode (``SPECC_BATCH_INVARIANT``) launches other configs at every row count,
    so a cache swept in one launch mode is swept again in another."""
    from specc.codegen.kernels import batch_invariant, pdl

    mode = pdl.device_mode(device)
    return (PREFILLS_MARKER + (f"-pdl{mode}" if mode else "")
            + ("-batch-invariant" if batch_invariant.enabled() else ""))


def prefill_lengths(limit: int, skip: int = 0) -> list[int]:
    """Prompt lengths whose prefills reach every kernel variant a prompt of at most ``limit``
    tokens can: each row bucket of the Triton linear (``kernels.linear.M_BUCKETS``) at its edge
    and its neighbours (b - 1, b, b + 1; a prefill feeds the prompt or all but its last token),
    which also covers Triton's divisible-by-16 specializations; ``skip``: a length already run."""
    from specc.codegen.kernels.linear import M_BUCKETS  # imports triton: only when prefills run

    return sorted({n for b in M_BUCKETS for n in (b - 1, b, b + 1) if 1 <= n <= limit} - {skip})


def _dummy_prompt(length: int, vocab_size: int) -> list[int]:
    """Token ids of a warm-up prompt (any ids do: only the shapes matter)."""
    return [(7 + 13 * i) % max(vocab_size, 1) for i in range(length)]


def warm_up(loop, vocab_size: int, prompt_len: int = 16, progress: Progress | None = None,
            cache_dir: str | None = None) -> dict:
    """Run ``loop`` (a ``DeviceSpeculativeDecoder``) over the shapes it will use; returns
    ``{"kernels": s, "graphs": s, "generations": n, "graphs_captured": n}``. ``cache_dir``: the
    artifact's kernel cache directory (:func:`kernel_cache_dir`), where the prefill sweep is
    recorded once done (module docstring); None: the sweep runs on every CUDA warm-up."""
    say = progress or (lambda msg, s: None)
    k = int(getattr(loop, "num_draft", 0) or 0)
    prompt_len = max(1, min(prompt_len, loop.max_len // 2))
    new = max(2, min(2 * (k + 1) + 1, loop.max_len - prompt_len - 1))
    prompt = _dummy_prompt(prompt_len, vocab_size)
    graphed = _graphed(loop)
    device = _device_of(graphed)
    cuda = device != "cpu"
    stats = {"generations": 0}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def generate(tokens: list[int], new_tokens: int):
        loop._shapes_captured = set()
        loop.generate(tokens, new_tokens, ())
        stats["generations"] += 1

    def one_pass():
        generate(prompt, new)

    def prefills():  # kernels of every prefill row bucket (see the module docstring)
        for n in prefill_lengths(min(256, loop.max_len // 2), skip=prompt_len):
            generate(_dummy_prompt(n, vocab_size), 2)

    saved = [s.max_tokens for s in graphed]
    t0 = time.perf_counter()
    for s in graphed:  # kernels only: every call runs eagerly
        s.max_tokens = -1
    try:
        one_pass()
        marker = Path(cache_dir) / prefills_marker(device) if cache_dir else None
        if cuda and not (marker is not None and marker.is_file()):
            prefills()
            if marker is not None:
                try:
                    marker.write_text("the prefill kernels of every row bucket are compiled here\n")
                except OSError:
                    pass
    finally:
        for s, m in zip(graphed, saved):
            s.max_tokens = m
    sync()
    stats["kernels"] = time.perf_counter() - t0
    say("kernels compiled for every step shape", stats["kernels"])
    t0 = time.perf_counter()
    if graphed:
        one_pass()
        sync()
    stats["graphs"] = time.perf_counter() - t0
    # the loop's own graphed functions (chain accept, tree plan / accept / commit) exist after a pass
    graphed += list(loop.graphed_functions().values()) if hasattr(loop, "graphed_functions") else []
    stats["graphs_captured"] = sum(s.captures for s in graphed)
    if graphed:
        say(f"{stats['graphs_captured']} CUDA graphs captured", stats["graphs"])
    for s in graphed:  # the user's runs start their counts at zero
        s.replays = s.eager_calls = 0
    return stats
