"""Where a GPU sits idle between kernels, from a ``torch.profiler`` Chrome trace.

A decode step whose wall time exceeds its kernels' time loses the difference in gaps between
kernels: the host was late to launch the next one (Python bookkeeping, a synchronising copy,
eager glue) or the launch itself took time to reach the GPU (graph launch latency). This module
reads a trace exported by ``torch.profiler`` (CUDA + CPU activities; ``with_stack=True`` adds the
Python frames) and sums the gaps per step, split into the part where the host had not yet issued
the next kernel's launch call (``host_late``) and the rest, and groups them by the launching call
and the innermost Python frames of the project at the launch: which line of the loop the GPU
waited for. Used by ``examples/bench_tree.py --kernels``; :func:`kernels_in_ranges` (the kernels
of annotated host ranges, e.g. a batched loop's decode steps) by ``examples/bench_batching.py --kernels``.
:func:`host_windows` measures, without Python stacks (which inflate it), the host's time from the
end of each blocking device -> host copy to its next graph launch, and the host ops inside: at
batch 1 the GPU has nothing queued in that window.
"""

from __future__ import annotations

import bisect
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

MIN_GAP_US = 2.0  # gaps below this are the GPU's own kernel-to-kernel latency
SCAN = 20000  # Python frames looked back through for the ones open at a launch (innermost start last)


def profiled(fn: Callable[[], Any], cuda: bool, stack: bool = False) -> tuple[Any, dict, float]:
    """Run ``fn()`` once under ``torch.profiler`` (CPU activities, and CUDA ones with ``cuda``;
    Python frames with ``stack``): its result, the exported Chrome trace as a dict (what
    :func:`kernel_gaps` and :func:`kernels_in_ranges` read), and the seconds it ran, the device
    synchronised before and after."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=activities, with_stack=stack) as prof:
        result = fn()
        if cuda:
            torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return result, trace, seconds


def kernel_gaps(trace: dict, steps: int, frames: str = "specc/", top: int = 12) -> dict:
    """Idle time between consecutive device kernels of ``trace`` (a Chrome trace dict), per
    step of ``steps``: ``idle_us_per_step`` (gaps of at least ``MIN_GAP_US``), ``host_late_us_per_step``
    (the part of each gap before the host issued the next kernel's launch call), ``kernel_us_per_step``,
    ``span_us_per_step`` (first kernel's start to last kernel's end), and ``top`` groups of gaps by
    (launching runtime call, innermost Python frames whose file contains ``frames``, the kernel
    before the gap, the kernel after it): count and microseconds per step, largest first."""
    events = trace.get("traceEvents", [])
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    py = sorted((e for e in events if e.get("cat") == "python_function" and frames in e.get("name", "")),
                key=lambda e: e["ts"])
    py_starts = [e["ts"] for e in py]
    steps = max(int(steps), 1)
    groups: dict = collections.defaultdict(lambda: [0, 0.0, 0.0])
    idle = late = 0.0
    for prev, nxt in zip(kernels, kernels[1:]):
        end = prev["ts"] + prev.get("dur", 0.0)
        gap = nxt["ts"] - end
        if gap < MIN_GAP_US:
            continue
        launch = launches.get(nxt.get("args", {}).get("correlation"))
        host_late = min(gap, max(0.0, launch["ts"] - end)) if launch else 0.0
        where = _frames_at(py, py_starts, launch["ts"]) if launch else ""
        key = (launch["name"] if launch else "?", where, _short(prev["name"]), _short(nxt["name"]))
        g = groups[key]
        g[0] += 1
        g[1] += gap
        g[2] += host_late
        idle += gap
        late += host_late
    rows = sorted(({"launch": k[0], "frames": k[1], "after": k[2], "before": k[3], "count_per_step": c / steps,
                    "us_per_step": t / steps, "host_late_us_per_step": h / steps}
                   for k, (c, t, h) in groups.items()), key=lambda r: -r["us_per_step"])
    span = (kernels[-1]["ts"] + kernels[-1].get("dur", 0.0) - kernels[0]["ts"]) if kernels else 0.0
    return {"steps": steps, "idle_us_per_step": idle / steps, "host_late_us_per_step": late / steps,
            "kernel_us_per_step": sum(e.get("dur", 0.0) for e in kernels) / steps, "span_us_per_step": span / steps,
            "gaps": rows[:top]}


BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def host_windows(trace: dict, steps: int, top: int = 15) -> dict:
    """Per step, the host time from the end of a blocking runtime call (a synchronising copy or
    synchronize: ``BLOCKING``) to the next ``cudaGraphLaunch`` (``window_us_per_step``), over the
    windows that contain no other graph launch; and the top-level host ops (``cpu_op``) that ran
    inside them, by name: calls and microseconds per step (``ops``), largest first. When the
    device has nothing queued at the copy (batch 1: the step's one host copy waits for its end),
    each window is time the GPU waits."""
    events = trace.get("traceEvents", [])
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    steps = max(int(steps), 1)
    windows, open_at = [], None
    for e in runtime:
        if e["name"].startswith(BLOCKING):
            open_at = e["ts"] + e.get("dur", 0.0)
        elif e["name"] == "cudaGraphLaunch":
            if open_at is not None and e["ts"] >= open_at:
                windows.append((open_at, e["ts"]))
            open_at = None
    groups: dict = collections.defaultdict(lambda: [0, 0.0])
    starts = [e["ts"] for e in ops]
    for lo, hi in windows:
        edge = lo  # top-level ops only: skip ops nested in one already counted
        for e in ops[bisect.bisect_left(starts, lo):bisect.bisect_left(starts, hi)]:
            if e["ts"] < edge:
                continue
            end = min(e["ts"] + e.get("dur", 0.0), hi)
            groups[e["name"]][0] += 1
            groups[e["name"]][1] += end - e["ts"]
            edge = end
    rows = sorted(({"op": name, "calls_per_step": c / steps, "us_per_step": t / steps}
                   for name, (c, t) in groups.items()), key=lambda r: -r["us_per_step"])
    return {"windows_per_step": len(windows) / steps,
            "window_us_per_step": sum(hi - lo for lo, hi in windows) / steps, "ops": rows[:top]}


def _short(name: str) -> str:
    return name.split("(")[0][:160]


def _frames_at(py: list, starts: list, ts: float, depth: int = 2) -> str:
    """The innermost ``depth`` Python frames (of the filtered list) running at ``ts``."""
    hits = []
    last = bisect.bisect_right(starts, ts) - 1
    for i in range(last, max(-1, last - SCAN), -1):
        e = py[i]
        if e["ts"] <= ts <= e["ts"] + e.get("dur", 0.0):
            hits.append(e)
            if len(hits) == depth:
                break
    return " < ".join(_frame_name(e["name"]) for e in hits)


def _frame_name(name: str) -> str:
    """``.../specc/runtime/device_loop.py(470): speculate`` -> ``device_loop.py:470 speculate``."""
    path, _, func = name.partition(": ")
    file = path.rsplit("/", 1)[-1].replace("(", ":").rstrip(")")
    return f"{file} {func}".strip()


def kernels_in_ranges(trace: dict, range_name: str, top: int = 25) -> dict:
    """Device kernels launched inside the host ranges named ``range_name`` (``torch.profiler.
    record_function`` annotations, e.g. one per decode step of a batched loop), grouped by name:
    calls and microseconds per range, the ``top`` largest. A kernel belongs to a range when its
    launch call (matched by correlation id: a CUDA graph's kernels share their graph launch's)
    was issued inside it, so a step's admissions and prefills outside the ranges are left out.
    Without device kernels in the trace (a CPU run) the host ops inside the ranges are counted
    instead (nested ops at every level, so their sum can exceed the range). Also: ``range_ms`` (mean wall time of a range) and ``kernel_us`` (kernel time per
    range), whose difference is the time the device did not spend on the step's kernels."""
    events = trace.get("traceEvents", [])
    ranges = sorted(((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events
                     if e.get("name") == range_name and e.get("ph") == "X"), key=lambda r: r[0])
    count = max(len(ranges), 1)
    starts = [r[0] for r in ranges]

    def inside(ts: float) -> bool:
        i = bisect.bisect_right(starts, ts) - 1
        return i >= 0 and ts <= ranges[i][1]

    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        launches = {e["args"]["correlation"]: e["ts"] for e in events
                    if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
        picked = [e for e in kernels if inside(launches.get(e.get("args", {}).get("correlation"), -1.0))]
        what = "kernel"
    else:
        picked = [e for e in events if e.get("cat") == "cpu_op" and inside(e["ts"])]
        what = "cpu_op"
    groups: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in picked:
        g = groups[_short(e["name"])]
        g[0] += 1
        g[1] += e.get("dur", 0.0)
    rows = sorted(({"kernel": name, "calls_per_range": c / count, "us_per_range": t / count}
                   for name, (c, t) in groups.items()), key=lambda r: -r["us_per_range"])
    return {"ranges": len(ranges), "what": what,
            "range_ms": sum(b - a for a, b in ranges) / count / 1e3,
            "kernel_us": sum(e.get("dur", 0.0) for e in picked) / count,
            "launches": len(picked) / count, "top": rows[:top]}
