"""Calibration: microbenchmarks -> efficiency factors the cost model uses for a deployment.

``specc calibrate --deployment h200-bs1 -o h200-bs1.json`` measures, on the device it runs on:

- copy bandwidth (device-to-device copy, read + write bytes / time);
- linear ``y = x W^T`` by M (rows) and shape: torch ``F.linear`` and, on CUDA, specc's Triton
  linear (``specc.codegen.kernels.linear.linear``, what compiled modules call) and the fused
  12-bit one (``linear_bf12``, what ``pack_weights_12bit`` lowers to); weights are rotated over
  enough copies that they cannot stay in L2 (on CPU: in the last-level cache, :func:`cache_bytes`;
  a decode step streams every weight from memory, so a weight timed from cache would price its
  linears several times too fast; a ``--model``'s own shapes rotate over that model's weight bytes
  instead where those are less than twice the cache, since its steps then find their weights
  there too: :func:`resident_cache_bytes`);
- attention by Q and C (specc's Triton attention on CUDA, the reference op on CPU);
- kernel launch overhead (back-to-back tiny kernels, eager) and CUDA-graph per-node replay
  overhead (the same kernels captured in one graph);
- a large square matmul (achievable fraction of the bf16 peak);
- with ``--model`` (:mod:`specc.search.model_shapes`): also the linears at that model's (and its
  drafter's) own weight shapes and attention at its head layout. The built-in sizes are one
  reference model (Qwen3-8B's on CUDA); a much smaller model runs short, latency-bound kernels
  those efficiencies misprice, and on CUDA its measured shapes join the per-shape linear table.

On CUDA every time is a median over CUDA-event-timed graph replays after warm-up; on CPU a
median of ``perf_counter`` times after warm-up, at small-model sizes (``--quick``: smaller, so
tests can run it), with the copy and the linears' weights past the last-level cache.

Peaks: a deployment's ``hbm_bandwidth`` and ``bf16_flops`` are datasheet leads (the built-in
``cpu`` profile's are guesses for a small x86 machine). Where this machine measured more (the
copy or a linear at M <= 16 moving more bytes per second, the square matmul or a linear more
FLOP/s), the fit raises the figure to the measurement (:func:`raise_peaks`) instead of clamping
an efficiency at 1, which would price every such node at the too-low lead; efficiencies are
then fractions of the raised peak, and the record's ``notes`` say what was raised. Any
efficiency still clamped at 1 gets a note too.

Fits (``t_net`` = measured time minus the launch overhead of the kernels timed):

- ``bandwidth_efficiency`` (deployment field) = median over memory-bound linear points of
  ``bytes / t_net / hbm_bandwidth`` (weight streaming dominates a decode step);
- ``flops_efficiency`` (deployment field) = ``2 n^3 / t_net / bf16_flops`` of the square matmul;
- ``launch_overhead_s`` / ``graph_node_overhead_s`` (deployment fields): as measured;
- per-kind efficiencies (the calibration record): ``elementwise`` bandwidth from the copy,
  ``linear`` bandwidth, ``packed_linear`` bandwidth (on packed bytes), ``attention``: on CUDA
  the split-KV kernel's form (:func:`fit_split_kv_attention`: latency, bandwidth on K/V +
  partial bytes, ``merge_slot_s`` per merge program slot, flops on padded row tiles), elsewhere
  a line ``t = latency_s + bytes / (bandwidth x hbm_bandwidth)`` fitted by least squares over
  the single-token samples (a batch-1 call moves a few MB and is mostly fixed latency: a bare
  efficiency would mistake that for slow streaming and overprice large batches) and a flops
  efficiency from the samples it underprices;
- ``attention_by_heads`` (CUDA): the same split-KV form fitted over each head layout's own
  samples (:func:`fit_attention_by_heads`; the reference layout's and a ``--model``'s), which
  the cost model prices a node of that layout by; the fit across layouts prices the others;
- ``linear_bandwidth_by_m`` and ``linear_flops_by_m``: per M, the median over shapes of
  ``bytes / t_net / hbm_bandwidth`` and of ``flops / t_net / bf16_flops``. At one M the weight-
  dominated shapes share an arithmetic intensity (~M flops per weight byte), so the roofline
  ``max(bytes / bw(M), flops / peak(M))`` reproduces the measurements whichever side binds.
  These describe the Triton linear, which compiled steps run at every shape the linear choice
  did not measure;
- ``linear_choice`` (CUDA, both linears timed): per shape and M, Triton or cuBLAS, whichever was
  faster by more than ``LINEAR_CHOICE_MARGIN`` (``specc.codegen.linear_choice``), with both times:
  the table lowering uses to pick each linear's implementation, and the cost model to price it.
- ``packed_linear_bandwidth_by_m``: per M, the median over shapes of the bf12 linear's
  ``packed bytes / t_net / hbm_bandwidth`` (the bf12 kernels lose efficiency with M much faster
  than bf16 ones: with it the cost model packs the M = 1 steps where packing wins and not the
  verify steps where it loses).

Output: the deployment file (every field of the base deployment kept, the fitted ones replaced,
``calibrated = true``), loadable with ``get_deployment(FILE)``, and beside it the calibration
record ``FILE-stem.calibration.json`` with every measurement and the per-kind efficiencies; the
cost model finds the record through the deployment's ``source`` path (:func:`calibration_for`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from specc.codegen.launches import LAUNCHES
from specc.codegen.linear_choice import LinearChoice
from specc.errors import UserError

# cuBLAS replaces the Triton linear at a shape and M only when faster by more than this fraction
# of the Triton time (whole-step timings vary ~1% between identical configs: docs/kernels.md)
LINEAR_CHOICE_MARGIN = 0.02
# attention samples: at most this many rotating copies of q and the cache in one timed graph
ATTENTION_MAX_COPIES = 64
# a linear raises the measured HBM peak only when it streams at least this many bytes: a call of
# ~1 us minus the ~1 us graph-node overhead gives any rate (the H200 run of 2026-12-05 read
# specc-tiny's 0.5 MB o projection as 6.2 TB/s, above the device's 4.8)
PEAK_MIN_BYTES = 16 << 20


@dataclasses.dataclass
class Calibration:
    """A calibration record: per-kind efficiencies plus the raw measurements they came from."""

    deployment: str
    device: str
    device_name: str = ""
    kind_efficiency: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    linear_flops_by_m: dict[int, float] = dataclasses.field(default_factory=dict)
    linear_bandwidth_by_m: dict[int, float] = dataclasses.field(default_factory=dict)
    packed_linear_bandwidth_by_m: dict[int, float] = dataclasses.field(default_factory=dict)
    fitted: dict[str, float] = dataclasses.field(default_factory=dict)
    measurements: dict[str, Any] = dataclasses.field(default_factory=dict)
    linear_choice: dict[str, Any] | None = None  # LinearChoice.to_json(): per-shape Triton vs cuBLAS
    # the split-KV attention fit per head layout ("Hq/Hkv/d") that has samples of its own
    # (``fit_attention_by_heads``): a model's own layout (``--model``) is priced from its own
    # samples, not from the fit across layouts; older records: empty
    attention_by_heads: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # the per-M linear tables were fitted on the bytes of the Triton kernel's row tiles (the weight
    # once per tile, ``linear_traffic``), as the cost model prices them; older records: False
    linear_tiles: bool = False
    date: str = ""
    specc_version: str = ""
    torch_version: str = ""
    quick: bool = False
    # what the fit did beyond measuring: peaks raised to the measurement, efficiencies clamped at 1
    notes: list[str] = dataclasses.field(default_factory=list)

    def linear_flops_at(self, rows: float) -> float:
        """Flops efficiency of a linear with ``rows`` = M, log-linear between measured M."""
        return interpolate_log(self.linear_flops_by_m, rows, "flops")

    def linear_bandwidth_at(self, rows: float) -> float:
        """Bandwidth efficiency of a linear with ``rows`` = M, log-linear between measured M."""
        return interpolate_log(self.linear_bandwidth_by_m, rows, "bandwidth")

    @property
    def models(self) -> list[str]:
        """The models whose own shapes were measured (``specc calibrate --model``)."""
        return [str(x.get("label", "?")) for x in self.measurements.get("models") or [] if isinstance(x, dict)]

    def choice_table(self) -> LinearChoice | None:
        """The measured per-shape linear implementations (None: not measured, Triton everywhere)."""
        return None if self.linear_choice is None else LinearChoice.from_json(self.linear_choice)

    def packed_linear_bandwidth_at(self, rows: float) -> float:
        """Bandwidth efficiency (on packed bytes) of a bf12 linear with ``rows`` = M: the packed
        kernels' efficiency falls with M much faster than bf16's, so one figure cannot say where
        packing wins."""
        return interpolate_log(self.packed_linear_bandwidth_by_m, rows, "packed bandwidth")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("linear_flops_by_m", "linear_bandwidth_by_m", "packed_linear_bandwidth_by_m"):
            out[key] = {str(k): v for k, v in getattr(self, key).items()}
        out["format"] = "specc-calibration/1"
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Calibration":
        """Parse a record, checking every field the cost model reads (ValueError otherwise)."""
        import math

        def number(v, what):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{what} must be a positive number (got {v!r})")
            return float(v)

        if not isinstance(data, dict):
            raise ValueError("a calibration record is one JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        for key in ("deployment", "device"):
            if not isinstance(kwargs.get(key), str):
                raise ValueError(f"{key} must be a string")
        for key in ("linear_flops_by_m", "linear_bandwidth_by_m", "packed_linear_bandwidth_by_m"):
            table = data.get(key) or {}
            if not isinstance(table, dict):
                raise ValueError(f"{key} must be an object of rows -> efficiency")
            out = {}
            for k, v in table.items():
                try:
                    m = int(k)
                except (TypeError, ValueError):
                    raise ValueError(f"{key}: row count {k!r} is not an integer") from None
                if m < 1:
                    raise ValueError(f"{key}: row count {m} must be >= 1")
                out[m] = number(v, f"{key}[{k}]")
            kwargs[key] = out
        for key, what in (("kind_efficiency", "kind"), ("attention_by_heads", "head layout")):
            table = kwargs.get(key, {})
            if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
                raise ValueError(f"{key} must be an object of {what} -> {{field: value}}")
            for kind, vals in table.items():
                for name, v in vals.items():
                    number(v, f"{key}.{kind}.{name}")
        for key in ("fitted", "measurements"):
            if not isinstance(kwargs.get(key, {}), dict):
                raise ValueError(f"{key} must be an object")
        for key in ("device_name", "date", "specc_version", "torch_version"):
            if not isinstance(kwargs.get(key, ""), str):
                raise ValueError(f"{key} must be a string")
        if not isinstance(kwargs.get("quick", False), bool):
            raise ValueError("quick must be true or false")
        if not isinstance(kwargs.get("linear_tiles", False), bool):
            raise ValueError("linear_tiles must be true or false")
        notes = kwargs.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ValueError("notes must be a list of strings")
        if kwargs.get("linear_choice") is not None:
            try:
                LinearChoice.from_json(kwargs["linear_choice"])
            except ValueError as exc:
                raise ValueError(f"linear_choice: {exc}") from None
        return cls(**kwargs)


def interpolate_log(by_m: dict[int, float], rows: float, what: str) -> float:
    """An efficiency at ``rows`` = M from a per-M table: log-linear between measured M, flat outside."""
    table = sorted((int(m), float(e)) for m, e in by_m.items())
    if not table:
        raise ValueError(f"no linear {what} table")
    if rows <= table[0][0]:
        return table[0][1]
    if rows >= table[-1][0]:
        return table[-1][1]
    for (m0, e0), (m1, e1) in zip(table, table[1:]):
        if m0 <= rows <= m1:
            w = (math.log(rows) - math.log(m0)) / (math.log(m1) - math.log(m0))
            return e0 + w * (e1 - e0)
    return table[-1][1]  # pragma: no cover


def record_path(deployment_file) -> Path:
    """``h200.json`` -> ``h200.calibration.json`` (the record beside a calibrated deployment)."""
    p = Path(deployment_file)
    return p.with_name(p.stem + ".calibration.json")


def calibration_for(deployment) -> Calibration | None:
    """The calibration record of a deployment loaded from a file, if one lies beside it."""
    source = getattr(deployment, "source", "") or ""
    if not getattr(deployment, "calibrated", False) or not source.endswith((".json", ".toml")):
        return None
    path = record_path(source)
    if not path.is_file():
        return None
    try:
        return Calibration.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:  # ValueError: JSON, UTF-8 and field errors
        raise UserError(f"{path}: unreadable calibration record ({exc})") from exc


def linear_choice_for(deployment):
    """The linear choice steps are built with for ``deployment`` (what ``specc compile`` lowers):
    its calibration record's measured table, else on CUDA the stated rule for its GPU
    (``codegen.linear_choice.BUILTIN_RULES``), else None (the Triton linear everywhere)."""
    return choice_of(calibration_for(deployment), deployment)


def choice_of(record, deployment):
    """The linear choice of ``deployment`` with calibration ``record`` (None: none): the record's
    measured table, else on CUDA the GPU's stated rule, else None (the Triton linear everywhere).
    What ``specc compile`` lowers and the cost model prices. The stated rule carries the GPU's
    packaged cuBLAS times only without a record: a record's own linear efficiencies (measured on
    this machine) price its linears, not another machine's times."""
    from specc.codegen.linear_choice import builtin_choice

    table = None if record is None else record.choice_table()
    if table is not None:
        return table
    return builtin_choice(deployment.gpu, times=record is None) if deployment.device == "cuda" else None


# --------------------------------------------------------------------------- timing


class Timer:
    """Median time of a callable on a device: CUDA graphs + events, or perf_counter on CPU."""

    def __init__(self, device: str, reps: int = 10, warmup: int = 2):
        self.device, self.reps, self.warmup = device, reps, warmup

    def __call__(self, fn: Callable[[], Any], inner: int = 1) -> float:
        """Seconds per call of ``fn`` (which may itself do ``inner`` calls: divided out)."""
        import torch

        if self.device == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(self.warmup):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            from specc.runtime.graphs import capture

            graph = torch.cuda.CUDAGraph()
            with capture(graph):
                fn()
            for _ in range(self.warmup):
                graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(self.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            return statistics.median(times) / inner
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) / inner


# --------------------------------------------------------------------------- benchmarks


def _sizes(device: str, quick: bool) -> dict[str, Any]:
    if device == "cuda":
        if quick:
            return dict(copy_bytes=256 * 2**20, square=4096, linear_shapes=[(4096, 12288), (12288, 4096)],
                        linear_m=[1, 16, 128], attn_heads=(32, 8, 128), attn_q=[1, 16], attn_c=[1024, 4096],
                        attn_b=[1, 8], launches=200, short_m=[1, 16],
                        short_width=4096)
        return dict(copy_bytes=2 * 2**30, square=8192,
                    linear_shapes=[(4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936)],
                    linear_m=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], attn_heads=(32, 8, 128),
                    attn_q=[1, 4, 16, 64], attn_c=[512, 1024, 4096], attn_b=[1, 8, 32], launches=1000,
                    short_m=[1, 16, 64, 256], short_width=4096)
    # CPU: the copy and the weights' rotation are sized past the last-level cache in _calibrate;
    # the full run has the shapes of a small model (an up, a down and a vocabulary projection:
    # a one-thread GEMV streams small-K weights ~25% slower than large-K ones, and a decoder's
    # bytes are mostly in the former, so the median is one of them; head_dim 64) and the row
    # counts of AR and verify steps
    if quick:
        return dict(copy_bytes=1 * 2**20, square=96, linear_shapes=[(256, 1024)], linear_m=[1, 32],
                    attn_heads=(4, 2, 16), attn_q=[1, 8], attn_c=[64], attn_b=[1], launches=100)
    return dict(copy_bytes=16 * 2**20, square=256, linear_shapes=[(512, 2048), (2048, 512), (512, 8192)],
                linear_m=[1, 4, 16, 64],
                attn_heads=(8, 4, 64), attn_q=[1, 16], attn_c=[128, 512], attn_b=[1, 2], launches=500)


def cache_bytes(dep, device: str) -> int:
    """Cache a streamed operand must exceed to be read from memory: the deployment's ``l2_bytes``
    (a GPU's L2); on CPU at least the largest cache the kernel reports for CPU 0 (its last level,
    which the built-in profile's 32 MiB may understate)."""
    size = int(dep.l2_bytes)
    if device != "cpu":
        return size
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            size = max(size, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError, IndexError):
            continue
    return size


def measure_launch(device: str, n: int, timer: Timer) -> dict[str, float]:
    """Per-kernel overhead: n tiny kernels back to back, eager (wall clock) and in a CUDA graph."""
    import torch

    x = torch.zeros(1, device=device)

    def many():
        for _ in range(n):
            x.add_(1.0)

    if device == "cuda":
        torch.cuda.synchronize()
        many()  # warm-up
        torch.cuda.synchronize()
        walls = []
        for _ in range(5):
            t0 = time.perf_counter()
            many()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) / n)
        eager = statistics.median(walls)
        graph = timer(many, inner=n)
        return {"launch_overhead_s": eager, "graph_node_overhead_s": graph, "kernels": n}
    per_op = timer(many, inner=n)
    return {"launch_overhead_s": per_op, "graph_node_overhead_s": per_op, "kernels": n}


def measure_copy(device: str, nbytes: int, timer: Timer) -> dict[str, float]:
    import torch

    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    t = timer(lambda: y.copy_(x))
    return {"bytes": 2 * nbytes, "seconds": t, "bandwidth": 2 * nbytes / t}


def measure_square(device: str, n: int, dtype, timer: Timer) -> dict[str, float]:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = timer(lambda: torch.matmul(a, b))
    return {"n": n, "flops": 2.0 * n ** 3, "seconds": t, "flops_per_s": 2.0 * n ** 3 / t}


def measure_linear(device: str, shapes, ms, dtype, timer: Timer, l2_bytes: int, impl: str = "torch",
                   model: str | None = None) -> list[dict]:
    """Time y = x W^T for each (K, N) shape and M (records of a ``--model``'s own shapes carry
    ``"model": label``); weights rotate over copies exceeding 2 x
    ``l2_bytes`` (the GPU's L2, the CPU's last-level cache: :func:`cache_bytes`), so each call
    streams its weight from memory as a decode step does: as many copies as cover twice the
    cache, whatever the weight's size (their total stays about 2 x the cache plus one weight).
    A fixed cap would leave small weights in the cache: on CPU the calibration's own (some
    servers have hundreds of MiB of last-level cache), on CUDA a ``--model``'s (16 copies of
    specc-tiny's 1 MiB q/k/v weight fit the H200's L2 several times over). For a ``--model``'s
    own shapes the caller passes :func:`resident_cache_bytes` instead of the cache: the
    rotation then spans that model's own weight bytes where those are fewer."""
    import torch
    import torch.nn.functional as F

    fn = F.linear
    pack = None
    if impl == "specc":
        from specc.codegen.kernels.linear import linear as fn  # noqa: N813
    elif impl == "bf12":  # in the layout the pack pass gives each shape (what compiled artifacts run)
        from specc.codegen.kernels.linear_bf12 import linear_bf12 as fn  # noqa: N813
        from specc.formats.bf12 import pack_bf16_12bit
        from specc.passes.pack_weights_12bit import layout_for

        def pack_as_compiled(w):
            return pack_bf16_12bit(w, version=layout_for(tuple(w.shape)))

        pack = pack_as_compiled
    out = []
    itemsize = torch.empty((), dtype=dtype).element_size()
    for k, n in shapes:
        wbytes = k * n * itemsize
        copies = copies_past_cache(wbytes, l2_bytes)
        weights = [torch.randn(n, k, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
        if pack is not None:
            weights = [pack(w) for w in weights]
            wbytes = weights[0].nbytes
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=dtype)

            def run():
                for w in weights:
                    fn(x, w)

            t = timer(run, inner=copies)
            nbytes = wbytes + (m * k + m * n) * itemsize
            out.append({"impl": impl, "K": k, "N": n, "M": m, "seconds": t, "bytes": nbytes, "flops": 2.0 * m * k * n,
                        "copies": copies, **({"model": model} if model else {})})
        weights = []  # free before the next shape
    return out


def copies_past_cache(nbytes: int, cache_bytes: int) -> int:
    """Copies of an operand of ``nbytes`` that a timed loop rotates over so that together they
    exceed twice ``cache_bytes`` (each call then streams its operand from memory)."""
    return math.ceil(2 * cache_bytes / max(nbytes, 1)) + 1


def resident_cache_bytes(cache_bytes: int, weight_bytes: int) -> int:
    """The cache size to rotate a model's own linear samples past (:func:`copies_past_cache`
    rotates over copies exceeding twice it): the device's cache, or half the model's weight bytes
    per round of steps when those are fewer. Why: a decode step streams each weight once, but a
    model whose weights about fit the cache (specc-tiny: 52 MB of weights, the H200's 50 MB L2)
    finds much of them there at the next step, so its kernels run faster than cold samples say
    (docs/benchmarks/h200-run15.md: its steps were over-predicted by up to 21%). Rotating over
    the model's own working set lets the samples see what its steps see. ``weight_bytes`` 0:
    unknown, the device's cache."""
    if weight_bytes <= 0:
        return cache_bytes
    return max(1, min(cache_bytes, weight_bytes // 2))


def attention_copies(device: str, nbytes: int, l2_bytes: int | None) -> int:
    """Copies of an attention sample's q and cache in one timed graph: :func:`copies_past_cache`
    of the L2 (2 at least, :data:`ATTENTION_MAX_COPIES` at most) on CUDA; one on CPU."""
    if device != "cuda":
        return 1
    return max(2, min(ATTENTION_MAX_COPIES, copies_past_cache(nbytes, l2_bytes or 0)))


def measure_attention(device: str, batch: int, heads, qs, cs, dtype, timer: Timer,
                      l2_bytes: int | None = None) -> list[dict]:
    """Time one attention call per (C, Q) at ``heads`` = (Hq, Hkv, d). On CUDA one graph runs the
    kernel over rotating copies of q and the cache (enough to exceed 2 x ``l2_bytes``, 2 to
    :data:`ATTENTION_MAX_COPIES`), as the linears do: a graph of a single call adds the graph
    launch and event latency (~13 us on the H200) to every sample, which the fit then priced as
    a fixed latency of every attention node in a step (8 x 13 us of the 217 us predicted for
    specc-tiny's 132 us AR step), and a single small cache would be served from L2."""
    import torch

    hq, hkv, d = heads
    item = torch.empty((), dtype=dtype).element_size()
    out = []
    for c in cs:
        for q in qs:
            s = c + q
            nbytes = 2 * batch * hkv * s * d * item + 2 * batch * q * hq * d * item
            copies = attention_copies(device, nbytes, l2_bytes)
            sets = []
            for _ in range(copies):
                cache_k = torch.randn(batch, hkv, s, d, device=device, dtype=dtype)
                sets.append((torch.randn(batch, q, hq, d, device=device, dtype=dtype), cache_k,
                             torch.randn_like(cache_k)))
            cache_len = torch.full((batch,), c, dtype=torch.long, device=device)
            scale = 1.0 / math.sqrt(d)
            if device == "cuda":
                from specc.codegen.kernels.attention import attention as kern

                def run():
                    for qt, ck, cv in sets:
                        kern(qt, ck, cv, cache_len, q, "causal", scale)
                impl = "specc"
            else:
                from specc.models import ops

                kt = torch.randn(batch, q, hkv, d, device=device, dtype=dtype)
                vt = torch.randn_like(kt)

                def run():
                    for qt, ck, cv in sets:
                        ops.attention(qt, kt, vt, ck, cv, cache_len, "causal", scale)
                impl = "reference"
            t = timer(run, inner=copies)
            flops = 4.0 * batch * hq * q * s * d
            out.append({"impl": impl, "B": batch, "Q": q, "C": c, "seconds": t, "bytes": nbytes, "flops": flops,
                        "heads": [hq, hkv, d], "copies": copies})
            sets = []  # freed before the next sample's copies
    return out


def measure_short_kernels(device: str, widths, ms, dtype, timer: Timer) -> list[dict]:
    """specc's rms_norm kernel over ``M`` rows of each width: the kind of short kernel (norms,
    SwiGLU, residual adds) a decode or verify step launches dozens of per layer. Each moves at
    most a few MB, so its time is mostly the kernel's own minimum duration, beyond the graph node
    overhead the near-empty kernels of :func:`measure_launch` show (:func:`fit_kernel_latency`).
    Eight inputs rotate per call, as a step's activations change."""
    import torch

    from specc.codegen.kernels.rmsnorm import rms_norm

    out = []
    for h in widths:
        w = torch.ones(h, device=device, dtype=dtype)
        for m in ms:
            xs = [torch.randn(m, h, device=device, dtype=dtype) for _ in range(8)]

            def run():
                for x in xs:
                    rms_norm(x, w, 1e-6)

            t = timer(run, inner=len(xs))
            out.append({"kernel": "rms_norm", "H": h, "M": m, "seconds": t,
                        "bytes": (2 * m * h + h) * xs[0].element_size()})
    return out


# --------------------------------------------------------------------------- fitting


def _median(values, default: float | None = None) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return statistics.median(values) if values else default


def _fraction(value: float, what: str, notes: list[str] | None) -> float:
    """An efficiency at most 1, with a note when the measurement said more."""
    if value > 1.0 + 1e-9 and notes is not None:
        notes.append(f"{what}: measured {value:.3g} of the peak, clamped at 1")
    return min(1.0, value)


def raise_peaks(dep, m: dict[str, Any], device: str, overhead: float, notes: list[str] | None = None):
    """-> (deployment, raised fields): ``hbm_bandwidth`` raised to the highest rate measured
    above it (the copy, the linears at M <= 16 on the bytes the model prices, on CUDA those of at
    least :data:`PEAK_MIN_BYTES`), ``bf16_flops`` to
    the highest FLOP rate (the square matmul, any linear); each raise noted. A clamped
    efficiency would price every node below this machine's measured speed: on a 2-core CPU a
    copy past the cache measured 61 GB/s against the ``cpu`` profile's 50, and two threads'
    matmul 208 GFLOP/s against its 200 (the profile's previous 20 GB/s and 100 GFLOP/s clamped
    both efficiencies at 1 and priced its linears up to 3x too slow)."""
    lin = [r for r in m["linear"] if r["impl"] == m.get("linear_impl", "torch")] or m["linear"]
    sq = m["square"]
    seen = {
        "hbm_bandwidth": max([m["copy"]["bandwidth"]] + [
            linear_traffic(r, device) / max(r["seconds"] - overhead, 1e-12) for r in lin
            if r["M"] <= 16 and (device != "cuda" or r["bytes"] >= PEAK_MIN_BYTES)]),
        "bf16_flops": max([sq["flops"] / max(sq["seconds"] - overhead, 1e-12)]
                          + [r["flops"] / max(r["seconds"] - overhead, 1e-12) for r in lin]),
    }
    raised = {k: float(v) for k, v in seen.items() if v > getattr(dep, k)}
    for k, v in raised.items():
        if notes is not None:
            unit = "B/s" if k == "hbm_bandwidth" else "FLOP/s"
            notes.append(f"{k}: measured {v:.4g} {unit}, above the {getattr(dep, k):.4g} {unit} that {dep.name} "
                         "states; raised to the measurement (efficiencies are fractions of it)")
    return dataclasses.replace(dep, **raised), raised


def fit(dep, m: dict[str, Any], device: str, notes: list[str] | None = None):
    """-> (deployment fields, per-kind efficiencies, linear flops efficiency by M, linear
    bandwidth efficiency by M); formulas in the module docstring. The fields include
    ``hbm_bandwidth`` / ``bf16_flops`` where :func:`raise_peaks` raised them; ``notes``, when
    given, collects what was raised or clamped."""
    launch = m["launch"]
    overhead = launch["graph_node_overhead_s"] if device == "cuda" else launch["launch_overhead_s"]
    fields: dict[str, float] = {"launch_overhead_s": launch["launch_overhead_s"],
                                "graph_node_overhead_s": launch["graph_node_overhead_s"]}
    dep, raised = raise_peaks(dep, m, device, overhead, notes)
    fields.update(raised)
    sq = m["square"]
    peak_eff = _fraction(sq["flops"] / max(sq["seconds"] - overhead, 1e-12) / dep.bf16_flops, "flops_efficiency",
                         notes)
    fields["flops_efficiency"] = peak_eff
    copy_eff = m["copy"]["bandwidth"] / dep.hbm_bandwidth

    lin = [r for r in m["linear"] if r["impl"] == m.get("linear_impl", "torch")] or m["linear"]
    for r in lin:
        r["net_s"] = max(r["seconds"] - overhead, 1e-12)
        r["bw_eff"] = linear_traffic(r, device) / r["net_s"] / dep.hbm_bandwidth
        r["flops_eff"] = r["flops"] / r["net_s"] / dep.bf16_flops
    lin = reference_rows(lin, device)
    small = [r["bw_eff"] for r in lin if r["M"] <= 16] or [r["bw_eff"] for r in lin]
    lin_bw = _fraction(_median(small, dep.bandwidth_efficiency), "bandwidth_efficiency", notes)
    fields["bandwidth_efficiency"] = lin_bw
    # per M: the median over shapes of both efficiencies. At one M every weight-dominated shape
    # has about the same arithmetic intensity (~M flops per weight byte), so the roofline
    # max(bytes / bw(M), flops / peak(M)) reproduces each measurement without having to decide
    # which side limited it.
    bw_by_m: dict[int, list[float]] = {}
    fl_by_m: dict[int, list[float]] = {}
    for r in lin:
        bw_by_m.setdefault(r["M"], []).append(r["bw_eff"])
        fl_by_m.setdefault(r["M"], []).append(r["flops_eff"])
    linear_by_m = {mm: _fraction(statistics.median(v), f"linear flops efficiency at M={mm}", notes)
                   for mm, v in sorted(fl_by_m.items())}
    # not clamped at 1: past 64 rows the Triton kernel's row tiles re-read weights that partly
    # stay in L2, so on the bytes of its passes it can beat HBM (H200: 1.3 at M = 256)
    linear_bw_by_m = {mm: statistics.median(v) for mm, v in sorted(bw_by_m.items())}

    # attention: time = latency + max(bytes / (bw_eff * BW), flops / (flops_eff * peak)). The
    # latency and bandwidth are a least-squares line over the single-token (memory-bound)
    # samples across C and batch: a batch-1 call moves a few MB and is mostly fixed latency,
    # which a bare efficiency would misread as slow streaming and extrapolate 30x at batch 32.
    # The flops efficiency is the median over the samples the line underprices (many new tokens
    # over a long cache: tensor-core work of a decode-shaped kernel, far below the matmul peak).
    attn = m["attention"]
    split_kv = fit_split_kv_attention(dep, m, device, overhead)
    net = [max(r["seconds"] - attn_launch(device) * overhead, 1e-12) for r in attn]
    q_min = min((r["Q"] for r in attn), default=1)
    line = [(r["bytes"], t) for r, t in zip(attn, net) if r["Q"] == q_min]
    attn_kind: dict[str, float] = {}
    if len({x for x, _ in line}) >= 2:
        slope, intercept = statistics.linear_regression([x for x, _ in line], [t for _, t in line])
        if slope > 0:
            attn_kind["bandwidth"] = _fraction(1.0 / (slope * dep.hbm_bandwidth), "attention bandwidth", notes)
            if intercept > 0:  # a record's figures are positive: a line through 0 or below has no latency
                attn_kind["latency_s"] = intercept
    if "bandwidth" not in attn_kind:
        attn_kind["bandwidth"] = _fraction(_median([r["bytes"] / t / dep.hbm_bandwidth for r, t in zip(attn, net)],
                                                   copy_eff), "attention bandwidth", notes)
    lat = attn_kind.get("latency_s", 0.0)
    bw = attn_kind["bandwidth"] * dep.hbm_bandwidth
    heavy = [r["flops"] / (t - lat) / dep.bf16_flops for r, t in zip(attn, net)
             if t - lat > 1.2 * r["bytes"] / bw and r["flops"] > 0]
    attn_kind["flops"] = _fraction(_median(heavy, peak_eff), "attention flops", notes)
    elementwise = {"bandwidth": _fraction(copy_eff, "elementwise bandwidth", notes)}
    kernel_latency = fit_kernel_latency(dep, m, device, overhead, elementwise["bandwidth"])
    if kernel_latency:
        elementwise["kernel_latency_s"] = kernel_latency
    kinds = {
        "elementwise": elementwise,
        "linear": {"bandwidth": lin_bw, "flops": peak_eff},
        "attention": split_kv or attn_kind,
    }
    if m.get("linear_bf12"):  # 12-bit weights (pack_weights_12bit's packed_linear): bandwidth on packed bytes
        effs = [r["bytes"] / max(r["seconds"] - overhead, 1e-12) / dep.hbm_bandwidth
                for r in m["linear_bf12"] if r["M"] <= 16]
        kinds["packed_linear"] = {"bandwidth": _fraction(_median(effs, lin_bw), "packed_linear bandwidth", notes)}
    return fields, kinds, linear_by_m, linear_bw_by_m


def fit_kernel_latency(dep, m: dict[str, Any], device: str, overhead: float, elementwise_eff: float) -> float | None:
    """Seconds a short kernel takes beyond its launch (graph node) overhead and its bytes at the
    elementwise bandwidth: the median over the short-kernel samples (:func:`measure_short_kernels`)
    of ``t - launches x overhead - bytes / bandwidth``, per launch (the CPU reference of rms_norm
    is several ops). None when not measured or not positive. The cost model adds it per launch of
    every elementwise node and once for each short kernel a node runs beside what calibration
    timed (a multi-row norm_linear's norm, rope_attention's rope_and_cache, a cuBLAS linear_add's
    residual add): a near-empty kernel's graph node overhead alone underprices them."""
    rows = m.get("short_kernels") or []
    if not rows:
        return None
    launches = LAUNCHES.get(device, {}).get("rms_norm", 1)
    bw = elementwise_eff * dep.hbm_bandwidth
    latency = statistics.median((r["seconds"] - launches * overhead - r["bytes"] / bw) / launches for r in rows)
    return float(latency) if latency > 0 else None


def reference_rows(rows: list[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    """The linear measurements the per-M efficiency tables are fitted on. On CUDA, the built-in
    reference shapes only: a ``--model``'s own shapes are priced from their measured times (the
    per-shape linear table), and their small-grid efficiencies would misprice the shapes nobody
    measured. On CPU every measurement: there is no per-shape table, and a calibration for a
    model should describe that model's linears."""
    if device != "cuda":
        return rows
    return [r for r in rows if not r.get("model")] or rows


def linear_traffic(r: dict[str, Any], device: str) -> float:
    """Bytes a timed linear moved: specc's Triton linear (CUDA) reads its weight once per row
    tile (``kernels.linear.weight_passes``: 128 rows are two 64-row tiles), which the cost model
    prices the same way, so its bandwidth efficiency by M is fitted on those bytes; torch's and
    the CPU reference's move the logical bytes."""
    if r.get("impl") != "specc" or device != "cuda":
        return float(r["bytes"])
    from specc.codegen.kernels.linear import weight_passes

    m, n, k = int(r["M"]), int(r["N"]), int(r["K"])
    itemsize = r["bytes"] / (n * k + m * k + m * n)
    return float(r["bytes"]) + (weight_passes(m, n, k) - 1) * n * k * itemsize


def sample_heads(r: dict[str, Any], m: dict[str, Any]) -> tuple[int, int, int]:
    """An attention sample's head layout (Hq, Hkv, d): its own ``heads``, or on older records
    (which timed one layout) the sizes' ``attn_heads``."""
    hq, hkv, d = (int(x) for x in (r.get("heads") or m["sizes"]["attn_heads"]))
    return hq, hkv, d


def fit_split_kv_attention(dep, m: dict[str, Any], device: str, overhead: float) -> dict[str, float] | None:
    """The attention fit of the split-KV kernel (CUDA; None elsewhere or when the samples do not
    determine it): ``t = latency_s + max((bytes + partials) / bw, flops x flops_scale / peak)
    + merge programs x slots x merge_slot_s`` (specc.search.attention_traffic).

    ``latency_s``, the bandwidth and ``merge_slot_s`` are one least-squares fit over the samples
    of at most 16 new tokens (decode and verify shapes, where the K/V stream and the merge
    bind); the flops efficiency is the least-squares ratio over the samples that fit leaves
    underpriced by more than 20% (tensor-core bound: 64 new tokens over long caches). Before
    this fit the model priced only the IR's K/V bytes with one flops efficiency: on the H200
    sweep (docs/benchmarks/linears-h200.calibration.json) it missed B x Q = 256 and 512 at
    context 1024 by -34% / -35% (the merge kernel of B x Q x Hq programs it did not see) and
    overpriced Q = 64 by up to 2x; this form's largest error there is 28%."""
    if device != "cuda":
        return None
    import torch

    from specc.search.attention_traffic import split_kv_traffic

    attn = m.get("attention") or []
    samples = []
    for r in attn:
        try:  # each sample's heads (a --model's layout beside the reference one)
            hq, hkv, d = sample_heads(r, m)
        except (KeyError, TypeError, ValueError):
            return None
        tr = split_kv_traffic(r["B"], r["Q"], hq, hkv, d, r["C"] + r["Q"], dep.sm_count)
        launches = 2 if tr.merge_kernel else 1
        samples.append((r, tr, max(r["seconds"] - launches * overhead, 1e-12)))
    line = [(r, tr, t) for r, tr, t in samples if r["Q"] <= 16]
    if len(line) < 4 or len({tr.merge_work for _, tr, _ in line}) < 2:
        return None
    a = torch.tensor([[1.0, r["bytes"] + tr.extra_bytes, tr.merge_work] for r, tr, _ in line], dtype=torch.float64)
    y = torch.tensor([[t] for _, _, t in line], dtype=torch.float64)
    latency, per_byte, per_slot = (float(v) for v in torch.linalg.lstsq(a, y).solution[:, 0])
    if per_byte <= 0 or per_slot <= 0:
        return None
    latency = max(1e-9, latency)  # a record's figures are positive
    heavy = [(r["flops"] * tr.flops_scale, t - latency - per_slot * tr.merge_work) for r, tr, t in samples
             if t - latency - per_slot * tr.merge_work > 1.2 * (r["bytes"] + tr.extra_bytes) * per_byte
             and r["flops"] > 0]
    flops_eff = 1.0
    if heavy:
        per_flop = sum(f * t for f, t in heavy) / sum(f * f for f, _ in heavy)
        flops_eff = min(1.0, 1.0 / (per_flop * dep.bf16_flops))
    return {"bandwidth": min(1.0, 1.0 / (per_byte * dep.hbm_bandwidth)), "latency_s": latency,
            "flops": flops_eff, "merge_slot_s": per_slot}


def fit_attention_by_heads(dep, m: dict[str, Any], device: str, overhead: float) -> dict[str, dict[str, float]]:
    """:func:`fit_split_kv_attention` over each head layout's own samples, for every layout
    whose samples determine it (the reference layout's, and a ``--model``'s own).

    Why: the fit across layouts is one latency for all. On specc-tiny (8 / 4 heads of 64, run 16)
    its 4.8 us intercept, pulled up by the Qwen3-8B-shaped samples, priced a batch-1 attention
    call at 7.4 us where the tiny layout's own samples measure 4.1 us, and the 8 layers' excess
    was most of the model's +26% on that step (docs/benchmarks/h100-run16.md)."""
    from specc.search.attention_traffic import heads_key

    layouts: dict[str, list] = {}
    for r in m.get("attention") or []:
        try:
            layouts.setdefault(heads_key(*sample_heads(r, m)), []).append(r)
        except (KeyError, TypeError, ValueError):
            continue
    out = {}
    for key, rows in layouts.items():
        fitted = fit_split_kv_attention(dep, {**m, "attention": rows}, device, overhead)
        if fitted is not None:
            out[key] = fitted
    return out


def linear_choice_of(m: dict[str, Any], overhead_s: float) -> LinearChoice | None:
    """The per-shape Triton / cuBLAS table of a run's linear measurements: only where both
    specc's Triton linear and torch's (cuBLAS) were timed, i.e. on CUDA."""
    if m.get("linear_impl") != "specc":
        return None
    return LinearChoice.from_measurements(m["linear"], margin=LINEAR_CHOICE_MARGIN, overhead_s=overhead_s,
                                          dtype="bfloat16", source="specc calibrate")


def fit_packed_by_m(dep, m: dict, device: str) -> dict[int, float]:
    """Per M, the median over shapes of the bf12 linear's bandwidth efficiency on packed bytes
    (launch overhead removed as in :func:`fit`); empty when bf12 was not measured."""
    launch = m["launch"]
    overhead = launch["graph_node_overhead_s"] if device == "cuda" else launch["launch_overhead_s"]
    by_m: dict[int, list[float]] = {}
    for r in m.get("linear_bf12") or []:
        by_m.setdefault(r["M"], []).append(r["bytes"] / max(r["seconds"] - overhead, 1e-12) / dep.hbm_bandwidth)
    return {mm: min(1.0, statistics.median(v)) for mm, v in sorted(by_m.items())}


def attn_launch(device: str) -> int:
    """Kernels the attention microbenchmark launches per call (its launch cost is removed)."""
    return LAUNCHES.get(device, {}).get("attention", 1) if device == "cpu" else 2


def calibrate(deployment, device: str | None = None, quick: bool = False,
              progress: Callable[[str], None] | None = None, threads: int | None = None,
              models: Sequence[Any] = ()) -> tuple[Any, Calibration]:
    """Run the microbenchmarks and return (calibrated Deployment, Calibration record).

    On CPU the benchmarks run with ``threads`` intra-op threads (default 1: on a shared machine,
    several threads stall on each other and timings turn into scheduler quanta); predictions made
    with the result describe a step run with as many threads.

    ``models``: :class:`specc.search.model_shapes.ModelShapes` whose linear shapes and attention
    head layouts are timed beside the reference sizes (``specc calibrate --model``): on CUDA the
    per-shape linear table then prices those linears from their own times, and the attention fit
    sees their head layouts.
    """
    import torch

    if (device or "") == "cpu" or (device is None and getattr(deployment, "device", "") == "cpu") or \
            (device is None and deployment == "cpu"):
        before = torch.get_num_threads()
        torch.set_num_threads(threads or 1)
        try:
            return _calibrate(deployment, device, quick, progress, threads or 1, models)
        finally:
            torch.set_num_threads(before)
    return _calibrate(deployment, device, quick, progress, None, models)


def _model_linears(models, base) -> list[tuple[str, list[tuple[int, int]], int]]:
    """(label, shapes not measured yet, the model's weight elements per round of steps) per model,
    each shape once, the reference sizes first."""
    seen = {tuple(s) for s in base}
    out = []
    for ms in models:
        shapes = [tuple(s) for s in ms.linears if tuple(s) not in seen]
        seen.update(shapes)
        if shapes:
            out.append((ms.label, shapes, ms.weight_elements))
    return out


def _model_attention(models, sizes) -> list[tuple[tuple[int, int, int], list[int]]]:
    """(heads, contexts) for each model head layout other than the reference one; contexts are
    the reference ones that fit the model's positions with the largest Q (none fits: the
    longest that does)."""
    seen = {tuple(sizes["attn_heads"])}
    q_max = max(sizes["attn_q"])
    out = []
    for ms in models:
        cs = [c for c in sizes["attn_c"] if ms.positions is None or c + q_max <= ms.positions]
        for heads in ms.attention_heads:
            if tuple(heads) in seen:
                continue
            seen.add(tuple(heads))
            out.append((tuple(heads), cs or [max(1, ms.positions - q_max)]))
    return out


def _calibrate(deployment, device, quick, progress, threads, models=()) -> tuple[Any, Calibration]:
    import torch

    from specc import __version__
    from specc.search.deployments import get_deployment

    dep = get_deployment(deployment) if isinstance(deployment, str) else deployment
    device = device or dep.device
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is available (use --device cpu)")
    say = progress or (lambda msg: None)
    sizes = _sizes(device, quick)
    cache = cache_bytes(dep, device)
    if device == "cpu":  # past the last-level cache, as the linears' weights (CUDA's copy is 2 GiB)
        sizes["copy_bytes"] = max(sizes["copy_bytes"], 2 * cache)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    timer = Timer(device, reps=5 if quick else 15)
    m: dict[str, Any] = {"sizes": {k: v for k, v in sizes.items()}, "threads": threads, "cache_bytes": cache}
    say("launch and graph-replay overhead")
    m["launch"] = measure_launch(device, sizes["launches"], timer)
    say("copy bandwidth")
    m["copy"] = measure_copy(device, sizes["copy_bytes"], timer)
    say("square matmul")
    m["square"] = measure_square(device, sizes["square"], dtype, timer)
    extra = _model_linears(models, sizes["linear_shapes"])
    if models:
        m["models"] = [ms.to_json() for ms in models]
    say("linear by M and shape")
    m["linear"] = measure_linear(device, sizes["linear_shapes"], sizes["linear_m"], dtype, timer, cache, "torch")
    itemsize = torch.empty((), dtype=dtype).element_size()
    # a model's own shapes rotate over its own working set where that is smaller than the cache's
    # (resident_cache_bytes): what its steps find in the cache, its samples find too
    own = [(label, shapes, resident_cache_bytes(cache, elements * itemsize)) for label, shapes, elements in extra]
    for label, shapes, resident in own:
        say(f"linear by M at {label}'s {len(shapes)} other shapes")
        m["linear"] += measure_linear(device, shapes, sizes["linear_m"], dtype, timer, resident, "torch", label)
    m["linear_impl"] = "torch"
    if device == "cuda":
        try:
            specc_rows = measure_linear(device, sizes["linear_shapes"], sizes["linear_m"], dtype, timer,
                                        dep.l2_bytes, "specc")
            for label, shapes, resident in own:
                specc_rows += measure_linear(device, shapes, sizes["linear_m"], dtype, timer, resident, "specc",
                                             label)
            m["linear"] += specc_rows
            m["linear_impl"] = "specc"
        except Exception as exc:  # pragma: no cover - GPU only
            m["linear_specc_error"] = f"{type(exc).__name__}: {exc}"
        say("bf12 (12-bit weight) linear by M and shape")
        try:
            m["linear_bf12"] = measure_linear(device, sizes["linear_shapes"], [x for x in sizes["linear_m"] if x <= 64],
                                              dtype, timer, dep.l2_bytes, "bf12")
        except Exception as exc:  # pragma: no cover - GPU only
            m["linear_bf12_error"] = f"{type(exc).__name__}: {exc}"
    say("attention by Q and C")
    batches = sorted(set(sizes["attn_b"]) | ({dep.batch_size} if device == "cuda" else set()))
    m["attention"] = [r for b in batches for r in measure_attention(device, b, sizes["attn_heads"], sizes["attn_q"],
                                                                     sizes["attn_c"], dtype, timer, dep.l2_bytes)]
    for heads, cs in _model_attention(models, sizes):
        say(f"attention by Q and C at {heads[0]}/{heads[1]} heads of {heads[2]}")
        m["attention"] += [r for b in batches for r in measure_attention(device, b, heads, sizes["attn_q"], cs, dtype,
                                                                          timer, dep.l2_bytes)]
    if device == "cuda":
        widths = list(dict.fromkeys([sizes["short_width"]] + [w for ms in models for w in ms.norm_widths]))
        say("short kernels (rms_norm) by rows and width")
        m["short_kernels"] = measure_short_kernels(device, widths, sizes["short_m"], dtype, timer)
    notes: list[str] = []
    fields, kinds, by_m, bw_by_m = fit(dep, m, device, notes)
    new = dataclasses.replace(dep, calibrated=True, **fields)
    overhead = fields["graph_node_overhead_s"] if device == "cuda" else fields["launch_overhead_s"]
    choice = linear_choice_of(m, overhead)
    if choice is not None:
        choice = dataclasses.replace(choice, source=f"specc calibrate on {torch.cuda.get_device_name()}")
    record = Calibration(
        linear_choice=None if choice is None else choice.to_json(),
        deployment=dep.name, device=device,
        device_name=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        kind_efficiency=kinds, linear_flops_by_m=by_m, linear_bandwidth_by_m=bw_by_m,
        attention_by_heads=fit_attention_by_heads(new, m, device, overhead),
        packed_linear_bandwidth_by_m=fit_packed_by_m(new, m, device), fitted=fields, measurements=m,
        linear_tiles=True, notes=notes,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        specc_version=__version__, torch_version=torch.__version__, quick=quick)
    return new, record


def write_calibration(path, deployment, record: Calibration) -> tuple[Path, Path]:
    """Write the deployment file and its calibration record beside it."""
    path = Path(path)
    if path.suffix != ".json":
        raise UserError(f"{path}: the calibrated deployment is written as JSON (give a .json path)")
    from specc.fileio import atomic_write_text, file_lock

    if path.exists() and not path.is_file():
        raise UserError(f"{path}: exists and is not a file")
    data = deployment.to_json()
    data.pop("source", None)
    rec = record_path(path)
    # one lock for the pair: the deployment file and its record always come from the same run
    with file_lock(path):
        atomic_write_text(rec, json.dumps(record.to_json(), indent=1) + "\n")
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return path, rec
