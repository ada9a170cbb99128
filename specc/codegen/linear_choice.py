"""Which implementation runs each linear, per (M bucket, N, K): specc's Triton kernel or cuBLAS.

At large M (batched verification: B x Q rows) cuBLAS through torch beats the Triton linear by up
to ~3x on the H200 (docs/benchmarks/h200-bs1-calibration.json), while at M = 1 the Triton GEMV
wins. Rather than guess, ``specc calibrate`` times both at the model's linear shapes for M = 1 ...
2048 and writes this table into its calibration record; lowering reads it to pick the
implementation per linear node and row range (``kernel_abi.linear(..., cublas_rows=...)``), and
the cost model reads the same measured times. No table (nothing measured): the Triton kernels
everywhere, as before.

A table holds, per weight shape (N, K), the measured points ``M_1 < M_2 < ... < M_n``, each with
the implementation chosen there and the times behind the choice. Point i covers the rows
``M_{i-1} < M <= M_i`` (the first from 1, the last also every M above it), like the M buckets of
``kernels.linear``. ``from_measurements`` picks cuBLAS where it was faster by more than ``margin``
(a fraction of the Triton time: timing noise must not flip a choice); a hand-written table may
state ``impl`` without times (a forced choice, reported as such).

JSON (``to_json`` / ``from_json``, the calibration record's ``linear_choice``)::

    {"format": "specc-linear-choice/1", "margin": 0.02, "overhead_s": 1e-06, "dtype": "bfloat16",
     "source": "specc calibrate on NVIDIA H200",
     "shapes": [{"N": 4096, "K": 4096,
                 "points": [{"M": 1, "impl": "triton", "triton_s": 1.08e-05, "cublas_s": 1.38e-05}, ...]}]}

``overhead_s`` is the per-launch overhead included in each measured time (a CUDA-graph node on
the GPU); the cost model subtracts it, as calibration's fits do.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from importlib import resources
from typing import Any, Iterable, Mapping

FORMAT = "specc-linear-choice/1"
IMPLS = ("triton", "cublas")
# the IR node kinds (and their lowered kernel_abi functions) the choice applies to; 12-bit
# packed linears have no cuBLAS form
KINDS = ("linear", "norm_linear", "linear_add")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _positive(value, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number (got {value!r})")
    return float(value)


def _count(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1 (got {value!r})")
    return value


@dataclasses.dataclass(frozen=True)
class ChoicePoint:
    """One measured M of a shape: the implementation chosen and the median times (seconds)."""

    m: int
    impl: str
    triton_s: float | None = None
    cublas_s: float | None = None

    def seconds(self, impl: str | None = None) -> float | None:
        return self.cublas_s if (impl or self.impl) == "cublas" else self.triton_s

    def to_json(self) -> dict[str, Any]:
        return {"M": self.m, "impl": self.impl, "triton_s": self.triton_s, "cublas_s": self.cublas_s}


@dataclasses.dataclass(frozen=True)
class ShapeChoice:
    """The choice for one weight shape ``[N, K]``: points sorted by M."""

    n: int
    k: int
    points: tuple[ChoicePoint, ...]

    def point_at(self, rows: int) -> ChoicePoint:
        """The point whose row range holds ``rows`` (the smallest measured M >= rows; the
        largest above them all)."""
        for p in self.points:
            if rows <= p.m:
                return p
        return self.points[-1]

    def impl_at(self, rows: int) -> str:
        return self.point_at(rows).impl

    def ranges(self) -> list[dict[str, Any]]:
        """Consecutive points with one implementation merged: ``{"rows": [lo, hi], "impl",
        "points": [...]}`` with ``hi = None`` for "and above"."""
        out: list[dict[str, Any]] = []
        lo = 1
        for i, p in enumerate(self.points):
            hi = None if i == len(self.points) - 1 else p.m
            if out and out[-1]["impl"] == p.impl:
                out[-1]["rows"][1] = hi
                out[-1]["points"].append(p.to_json())
            else:
                out.append({"rows": [lo, hi], "impl": p.impl, "points": [p.to_json()]})
            lo = p.m + 1
        return out

    def cublas_rows(self) -> tuple[tuple[int, int | None], ...]:
        """The row ranges that run cuBLAS, inclusive, ``None`` = no upper bound (what lowering
        passes to ``kernel_abi.linear``)."""
        return tuple((r["rows"][0], r["rows"][1]) for r in self.ranges() if r["impl"] == "cublas")

    def seconds_at(self, rows: float) -> float | None:
        """Measured time of the implementation chosen at ``rows``: log-log interpolated between
        the measured M around it (time ~ M^a piecewise); beyond the largest measured M, along the
        line through the last two (t = a + b M: flat while the weights dominate, proportional
        once compute does), never below the last time; None when the chosen implementation was
        not timed."""
        p = self.point_at(int(math.ceil(rows)))
        t = p.seconds()
        if t is None:
            return None
        i = self.points.index(p)
        prev = self.points[i - 1].seconds(p.impl) if i else None
        if rows >= p.m:
            if rows == p.m:
                return t
            if prev is None:
                return t * rows / p.m
            slope = (t - prev) / (p.m - self.points[i - 1].m)
            return t + max(slope, 0.0) * (rows - p.m)
        if prev is None or rows <= self.points[i - 1].m:
            return t
        m0 = self.points[i - 1].m
        w = (math.log(rows) - math.log(m0)) / (math.log(p.m) - math.log(m0))
        return math.exp(math.log(prev) + w * (math.log(t) - math.log(prev)))

    def to_json(self) -> dict[str, Any]:
        return {"N": self.n, "K": self.k, "points": [p.to_json() for p in self.points]}


@dataclasses.dataclass(frozen=True)
class LinearChoice:
    """Per-shape implementation choices (see the module docstring)."""

    shapes: Mapping[tuple[int, int], ShapeChoice]
    margin: float = 0.0
    overhead_s: float = 0.0
    dtype: str = "bfloat16"
    source: str = ""

    def shape(self, n: int, k: int) -> ShapeChoice | None:
        return self.shapes.get((int(n), int(k)))

    def impl_at(self, rows: int, n: int, k: int) -> str:
        """The implementation for an ``[rows, k] x [n, k]^T`` product (Triton when unmeasured)."""
        s = self.shape(n, k)
        return "triton" if s is None else s.impl_at(rows)

    def cublas_rows(self, n: int, k: int) -> tuple[tuple[int, int | None], ...]:
        s = self.shape(n, k)
        return () if s is None else s.cublas_rows()

    @property
    def uses_cublas(self) -> bool:
        return any(s.cublas_rows() for s in self.shapes.values())

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    # ------------------------------------------------------------ construction

    @classmethod
    def from_measurements(cls, rows: Iterable[Mapping[str, Any]], *, margin: float = 0.02, overhead_s: float = 0.0,
                          dtype: str = "bfloat16", source: str = "") -> "LinearChoice":
        """From calibration's linear measurements (``{"impl": "specc" | "torch", "N", "K", "M",
        "seconds"}``): cuBLAS (torch) where it beat the Triton linear (specc) by more than
        ``margin`` of the Triton time. Shapes and M timed by only one of them are left out."""
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1) (got {margin!r})")
        times: dict[tuple[int, int], dict[int, dict[str, float]]] = {}
        for r in rows:
            impl = {"specc": "triton", "torch": "cublas"}.get(r.get("impl"))
            if impl is not None:
                times.setdefault((int(r["N"]), int(r["K"])), {}).setdefault(int(r["M"]), {})[impl] = float(r["seconds"])
        shapes = {}
        for (n, k), by_m in times.items():
            points = tuple(
                ChoicePoint(m, "cublas" if t["cublas"] < t["triton"] * (1 - margin) else "triton",
                            t["triton"], t["cublas"])
                for m, t in sorted(by_m.items()) if set(t) == set(IMPLS))
            if points:
                shapes[(n, k)] = ShapeChoice(n, k, points)
        return cls(shapes, margin, overhead_s, dtype, source)

    @classmethod
    def forced(cls, shapes: Iterable[tuple[int, int]], rows: tuple[int, int | None], *, source: str = "forced") \
            -> "LinearChoice":
        """cuBLAS for ``rows = (lo, hi)`` (hi None: and above) at the given (N, K), Triton
        elsewhere, with no times: a hand-made choice (tests, experiments)."""
        lo, hi = rows
        if lo < 1 or (hi is not None and hi < lo):
            raise ValueError(f"rows must be (lo >= 1, hi >= lo or None), got {rows!r}")
        table = {}
        for n, k in shapes:
            points = ([ChoicePoint(lo - 1, "triton")] if lo > 1 else []) + [ChoicePoint(hi or lo, "cublas")]
            if hi is not None:
                points.append(ChoicePoint(hi + 1, "triton"))
            table[(int(n), int(k))] = ShapeChoice(int(n), int(k), tuple(points))
        return cls(table, source=source)

    def with_impl(self, impl: str) -> "LinearChoice":
        """The same measurements with ``impl`` chosen everywhere (what the other choice would
        cost: benchmarks price the Triton-only step with it)."""
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)} (got {impl!r})")
        shapes = {key: dataclasses.replace(s, points=tuple(dataclasses.replace(p, impl=impl) for p in s.points))
                  for key, s in self.shapes.items()}
        return dataclasses.replace(self, shapes=shapes, source=f"{self.source} ({impl} everywhere)".strip())

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "margin": self.margin, "overhead_s": self.overhead_s, "dtype": self.dtype,
                "source": self.source, "shapes": [s.to_json() for _, s in sorted(self.shapes.items())]}

    @classmethod
    def from_json(cls, data: Any) -> "LinearChoice":
        """Parse and check a table (ValueError with what is wrong)."""
        if not isinstance(data, dict):
            raise ValueError("a linear choice table is one JSON object")
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"unknown linear choice format {data.get('format')!r} (expected {FORMAT!r})")
        margin = data.get("margin", 0.0)
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin < 1:
            raise ValueError(f"margin must be a number in [0, 1) (got {margin!r})")
        overhead = data.get("overhead_s", 0.0)
        if not isinstance(overhead, (int, float)) or isinstance(overhead, bool) or not 0 <= overhead < 1:
            raise ValueError(f"overhead_s must be a number of seconds >= 0 (got {overhead!r})")
        dtype = data.get("dtype", "bfloat16")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)} (got {dtype!r})")
        source = data.get("source", "")
        if not isinstance(source, str):
            raise ValueError("source must be a string")
        entries = data.get("shapes")
        if not isinstance(entries, list):
            raise ValueError("shapes must be a list of {N, K, points}")
        shapes: dict[tuple[int, int], ShapeChoice] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"shapes[{i}] must be an object with N, K and points")
            n, k = _count(entry.get("N"), f"shapes[{i}].N"), _count(entry.get("K"), f"shapes[{i}].K")
            if (n, k) in shapes:
                raise ValueError(f"shapes[{i}]: shape N={n}, K={k} is listed twice")
            raw = entry.get("points")
            if not isinstance(raw, list) or not raw:
                raise ValueError(f"shapes[{i}] (N={n}, K={k}): points must be a non-empty list")
            points = []
            for j, p in enumerate(raw):
                where = f"shapes[{i}].points[{j}]"
                if not isinstance(p, dict):
                    raise ValueError(f"{where} must be an object with M and impl")
                m = _count(p.get("M"), f"{where}.M")
                if points and m <= points[-1].m:
                    raise ValueError(f"{where}: M must increase (M={m} after M={points[-1].m})")
                impl = p.get("impl")
                if impl not in IMPLS:
                    raise ValueError(f"{where}: impl must be one of {', '.join(IMPLS)} (got {impl!r})")
                ts = {key: None if p.get(key) is None else _positive(p.get(key), f"{where}.{key}")
                      for key in ("triton_s", "cublas_s")}
                points.append(ChoicePoint(m, impl, ts["triton_s"], ts["cublas_s"]))
            shapes[(n, k)] = ShapeChoice(n, k, tuple(points))
        if "cublas_from_rows" in data:  # a RowRule's table
            rows = _count(data["cublas_from_rows"], "cublas_from_rows")
            return RowRule(shapes, float(margin), float(overhead), dtype, source, cublas_from_rows=rows)
        return cls(shapes, float(margin), float(overhead), dtype, source)

    # ------------------------------------------------------------ reporting

    def summary(self) -> list[str]:
        """One line per shape: where cuBLAS runs."""
        lines = []
        for (n, k), s in sorted(self.shapes.items()):
            rows = s.cublas_rows()
            where = ", ".join(f"M {lo}+" if hi is None else f"M {lo}..{hi}" for lo, hi in rows) if rows else "nowhere"
            lines.append(f"N={n} K={k}: cuBLAS at {where}")
        return lines


@dataclasses.dataclass(frozen=True)
class RowRule(LinearChoice):
    """cuBLAS from ``cublas_from_rows`` rows up at every weight shape, Triton below: a choice
    stated for a GPU, for deployments without a measured table (``BUILTIN_RULES``). The shapes
    it carries hold cuBLAS times measured on that GPU (Qwen3-8B's linears at 128+ rows); the cost
    model prices those rows from them and every other linear as it prices unmeasured ones."""

    cublas_from_rows: int = 128

    def shape(self, n: int, k: int) -> ShapeChoice | None:
        """Triton below ``cublas_from_rows``, cuBLAS from there; where the rule carries cuBLAS
        times for this shape (``shapes``: the GPU's measured record, ``BUILTIN_RULES``), its
        points at or above the switch keep them, so the cost model prices those rows from the
        measurement instead of the roofline."""
        lo = self.cublas_from_rows
        below = (ChoicePoint(lo - 1, "triton"),) if lo > 1 else ()
        timed = self.shapes.get((int(n), int(k)))
        above = tuple(dataclasses.replace(p, impl="cublas") for p in timed.points if p.m >= lo) if timed else ()
        return ShapeChoice(int(n), int(k), below + (above or (ChoicePoint(lo, "cublas"),)))

    @property
    def uses_cublas(self) -> bool:
        return True

    def with_impl(self, impl: str) -> LinearChoice:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)} (got {impl!r})")
        return dataclasses.replace(self, cublas_from_rows=1) if impl == "cublas" else \
            LinearChoice({}, source=f"{self.source} (triton everywhere)".strip())

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "cublas_from_rows": self.cublas_from_rows}

    def summary(self) -> list[str]:
        return [f"every shape: cuBLAS at M {self.cublas_from_rows}+ ({self.source})"]


# Deployments' GPUs with a stated rule, used when no measured table exists (a built-in deployment
# has no calibration record): GPU -> (cuBLAS from this many rows, where it was measured).
# Both switch at 65 rows: the Triton linear computes in 64-row tiles and reads the weight once per
# tile, so from 65 rows it streams the weight twice or more where cuBLAS streams it once.
# NVIDIA H200, run 8 (docs/benchmarks/h200-run8.md, bench_linears): cuBLAS was faster than the
# Triton linear at every measured Qwen3-8B shape from M = 128 (by 1.3-1.9x at 128, 1.6-2.9x at
# 256 and above) and slower or even at M = 1-32; at M = 64 it won two shapes of five. A B = 16,
# Q = 16 verify step: 13.76 ms Triton-only, 8.11 ms with the choice. Rows 65-127 were not measured
# there; the rule began at 128 until run 22, which left them (a two-level step's first level, a
# 64-node tree's 65 rows) on two Triton passes.
# NVIDIA H100 SXM, run 22 (docs/benchmarks/run22.md, `specc calibrate --deployment h100-bs16`):
# cuBLAS 1.25-1.6x faster at M = 128 on every shape, within 1% at M = 64 (Triton on four shapes
# of five) and slower at M = 1-16, and its table switches at 65 rows; the batched speculative step
# at B = 16 (256 verify rows) took 21.8 ms with Triton linears and 11.1 ms with the measured choice.
# Each rule also names a packaged record of cuBLAS times at Qwen3-8B's five linear shapes for
# 128-2048 rows (H100: run 25, with the DFlash-b16 drafter's two own shapes from run 26; H200:
# run 8, with the drafter's shapes from run 32): at 256 rows cuBLAS reaches only 0.43-0.64
# of the H100's bf16 peak on the N = 4096-6144 shapes, which the roofline with one efficiency
# priced 20-30% fast (the B = 16 speculative step was predicted at 8.98 ms and measured 10.94).
BUILTIN_RULES: dict[str, tuple[int, str, str]] = {
    "NVIDIA H200": (65, "docs/benchmarks/h200-run8.md, run22.md", "cublas-times-h200.json"),
    "NVIDIA H100 SXM": (65, "docs/benchmarks/run22.md", "cublas-times-h100.json"),
}


@functools.cache
def builtin_times(record: str) -> LinearChoice:
    """A packaged record of measured cuBLAS times (``specc/data``; a linear-choice table), read
    once per process (every cost model of a built-in deployment asks for it)."""
    return LinearChoice.from_json(json.loads(resources.files("specc").joinpath("data", record).read_text()))


def builtin_choice(gpu: str, times: bool = True) -> LinearChoice | None:
    """The stated rule for a deployment's GPU (``BUILTIN_RULES``), with its measured cuBLAS times
    unless ``times`` is False, or None (Triton everywhere)."""
    rule = BUILTIN_RULES.get(gpu)
    if rule is None:
        return None
    rows, where, record = rule
    source = f"built-in rule for {gpu}: cuBLAS from {rows} rows ({where})"
    if not times:
        return RowRule({}, source=source, cublas_from_rows=rows)
    measured = builtin_times(record)
    return RowRule(measured.shapes, overhead_s=measured.overhead_s, source=f"{source}; cuBLAS times: {record}",
                   cublas_from_rows=rows)


def in_rows(rows: int, ranges: Iterable[tuple[int, int | None]]) -> bool:
    """Whether ``rows`` lies in one of the inclusive ranges (hi None: no upper bound)."""
    return any(lo <= rows and (hi is None or rows <= hi) for lo, hi in ranges)
