"""The analytic cost model: step times, tokens/s and a gap report from IR metadata alone.

Every number is a formula over node metadata (docs/ir.md) and deployment fields
(specc.search.deployments), nothing is measured here:

    time(node)  = max(bytes / (hbm_bandwidth * eff_bw(kind, M)),  flops / (bf16_flops * eff_flops(kind, M)))
                  + launches(kind) * overhead + latency(kind)
    floor(node) = max(bytes / hbm_bandwidth, flops / bf16_flops)           (datasheet, no launch)
    step time   = sum over the step's compute nodes of time(node)

- ``bytes`` = bytes_read + bytes_written of the node (weights, KV cache, activations);
- ``eff_bw`` / ``eff_flops``: the deployment's ``bandwidth_efficiency`` / ``flops_efficiency``,
  unless a calibration record (specc.search.calibrate) gives a per-kind value ("linear",
  "attention", "elementwise") or, for linears, efficiencies by the GEMM's M (rows);
- linears whose weight shape the calibration's linear choice measured (``Calibration.choice_table``:
  Triton and cuBLAS timed at that (N, K) for M = 1 ... 2048) take their efficiencies from the
  chosen implementation's own time at that M (log-log interpolated between measured M), so the
  roofline reproduces the measurement; a cuBLAS-lowered node launches its separate norm /
  residual-add ops too (:data:`specc.codegen.launches.CUBLAS_LAUNCHES`), and the residual add's
  bytes are priced at the elementwise bandwidth, added like a latency;
- what the kernels do beyond the IR's formulas (:meth:`CostModel.kernel_terms`): the Triton
  linear reads its weight once per row tile (``kernels.linear.weight_passes``: 65 rows = two
  64-row tiles), the split-KV attention kernel writes and merges fp32 partials, computes on
  padded row tiles and runs ``B x Q x Hq`` merge programs (specc.search.attention_traffic,
  with the calibrated ``merge_slot_s``), and a multi-row norm_linear runs its rms_norm kernel
  apart (its bytes at the elementwise bandwidth);
- ``latency``: a calibrated fixed time per call (attention's fitted intercept; attention's
  latency, bandwidth, flops and ``merge_slot_s`` come from the fit of the node's own head layout
  where the calibration measured it, ``Calibration.attention_by_heads``), else 0; for
  elementwise nodes also the short kernels' latency per launch (``kernel_latency_s``: what an
  rms_norm of a few rows takes beyond a near-empty kernel's graph node, fitted by calibration
  on CUDA), which each other short kernel beside a timed one pays too (a multi-row
  norm_linear's norm, rope_attention's rope_and_cache, a cuBLAS linear_add's residual add);
- ``overhead``: ``graph_node_overhead_s`` when the step is CUDA-graphed (the default on CUDA
  deployments), ``launch_overhead_s`` otherwise; ``launches(kind)`` is how many kernels the kind
  lowers to (:data:`LAUNCHES`, default 1); structural nodes (views, weights, sizes) cost nothing.

A speculative step is ``[draft forwards] + verify`` plus a greedy-acceptance pseudo node per
forward whose logits are read on the host (argmax over the logits + one host sync, priced as
``logits bytes / bandwidth + launch_overhead_s``). With E the expected tokens committed per step
(specc.search.acceptance, formula (1)) and B the deployment's batch size:

    tokens/s = B * E / step time,   AR tokens/s = B / AR step time,   speedup = ratio.

The AR step is the target's own step at Q = 1 with the same passes (the compiled AR baseline).
:meth:`SystemPrediction.gap_report` ranks the components (target linear weights, target attention
KV read, target launch overhead, drafter step, ...) by the gap between predicted time and floor.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections import defaultdict
from typing import Any, Iterable, Mapping

import sympy

from specc.codegen.launches import CUBLAS_LAUNCHES, LAUNCHES, register_launches  # noqa: F401  (published by codegen)
from specc.codegen.linear_choice import KINDS as CHOICE_KINDS
from specc.ir import STRUCTURAL_KINDS, evaluate
from specc.ir.meta import TensorMeta, tensors_in
from specc.search.attention_traffic import PRICED_KINDS as ATTENTION_PRICED
from specc.search.attention_traffic import heads_key, split_kv_traffic
from specc.search.calibrate import interpolate_log

DEFAULT_CONTEXT = 1024

LINEAR_LIKE_ATTR = "out_features"
FREE_KINDS = frozenset(STRUCTURAL_KINDS)


def component_of(meta, name: str) -> str:
    """The gap-report component a node belongs to (grouped by op kind and role in the step)."""
    kind = meta.kind
    if meta.group == "dflash_context":
        return "context injection (fc + norm)"
    if name == "lm_head" or meta.scope.startswith("lm_head"):
        return "LM head"
    if kind in ("attention", "rope_attention", "ragged_attention"):
        return "attention KV read"
    if kind == "all_reduce":
        return "all-reduce (GPU link)"
    if LINEAR_LIKE_ATTR in meta.attrs or "linear" in kind:
        return "linear weights"
    if kind == "embedding":
        return "embedding"
    if kind == "rms_norm":
        return "norms"
    if kind in ("rope", "rope_tables"):
        return "rope"
    if kind in ("add", "mul", "silu_mul", "cat"):
        return "elementwise"
    return kind


def efficiency_class(meta) -> str:
    """Which calibrated efficiency applies: "linear", "attention" or "elementwise"."""
    if meta.kind in ("attention", "rope_attention", "ragged_attention"):
        return "attention"
    if LINEAR_LIKE_ATTR in meta.attrs or "linear" in meta.kind:
        return "linear"
    return "elementwise"


def packed_weight_passes(m: int, n: int, k: int, version: int = 2) -> int:
    """How many times a packed (bf12) linear of ``m`` rows reads its ``[n, k]`` planes: once per
    launch of the tensor-core kernel (layouts 2 and 3: one launch up to 32 rows,
    ``linear_bf12_mma.launches_for``), else once per row tile
    of the Triton kernel's config for that M (64-row tiles above 64 rows), counted by
    :func:`specc.codegen.kernels.linear.weight_passes` as for bf16 weights. Without that factor a
    verify of 512 rows priced its packed weights read once against the bf16 weights' 8 passes,
    and packing looked 1.5x faster where its kernel is slower."""
    from specc.codegen.kernels.linear import weight_passes  # imports triton: linears only

    from specc.formats.bf12 import WIDE_LAYOUTS

    if version in WIDE_LAYOUTS:  # layout 3: layout 2's bytes in tiles, read by the same kernels
        from specc.codegen.kernels.linear_bf12_mma import launches_for
        from specc.codegen.kernels.linear_bf12_v2 import get_config

        launches = launches_for(m)
        if launches:
            return launches
    else:
        from specc.codegen.kernels.linear_bf12 import get_config
    return max(1, int(weight_passes(m, n, k, config=get_config(m, n, k))))


from specc.search.predictions import (  # noqa: E402,F401  (the records this model fills)
    Component,
    GapReport,
    NodeCost,
    StepPrediction,
    SystemPrediction,
    _fmt,
    _ms,
)


# --------------------------------------------------------------------------- the model


class CostModel:
    """Prices IR nodes for one deployment (see the module docstring for the formulas).

    graphs: price launches as CUDA-graph node replays (default: True on CUDA deployments).
    calibration: a :class:`specc.search.calibrate.Calibration` (default: the record written
      next to a calibrated deployment file, if any).
    """

    def __init__(self, deployment, *, graphs: bool | None = None, calibration=None):
        from specc.search.calibrate import calibration_for, choice_of
        from specc.search.deployments import Deployment, get_deployment

        self.deployment: Deployment = get_deployment(deployment) if isinstance(deployment, str) else deployment
        dep = self.deployment
        self.graphs = dep.device == "cuda" if graphs is None else bool(graphs)
        self.calibration = calibration if calibration is not None else calibration_for(dep)
        self.overhead = dep.graph_node_overhead_s if self.graphs else dep.launch_overhead_s
        self.linear_choice = choice_of(self.calibration, dep)  # what specc compile lowers
        self._eval_cache: dict[tuple, float] = {}

    def choice_shape(self, meta, rows: float | None):
        """The linear choice's entry (``ShapeChoice``) for a linear node at ``rows`` rows, or None
        (no choice, no row count, not a linear, or a shape the choice does not cover)."""
        table = self.linear_choice
        if table is None or rows is None or meta.kind not in CHOICE_KINDS:
            return None
        try:
            n, k = int(meta.attrs["out_features"]), int(meta.attrs["in_features"])
        except (KeyError, TypeError):
            return None
        return table.shape(n, k)

    def runs_cublas(self, meta, rows: float | None) -> bool:
        """Whether the linear choice (a calibration's table or the GPU's stated rule) lowers this
        linear node to cuBLAS at ``rows`` rows."""
        shape = self.choice_shape(meta, rows)
        return shape is not None and shape.impl_at(int(math.ceil(rows))) == "cublas"

    def residual_norm_pair(self, ir, node, rows: float | None) -> str | None:
        """Which side of a residual-norm pair lowering makes of ``node`` at ``rows`` rows
        (``codegen/residual_norm.py``: a linear_add feeding a norm_linear, both cuBLAS): "add"
        (its residual add runs inside the norm's kernel), "norm" (its rms_norm kernel also adds
        the residual and writes the sum), or None."""
        kind = ir.meta(node).kind
        if rows is None or kind not in ("linear_add", "norm_linear") or self.linear_choice is None:
            return None
        from specc.codegen import residual_norm

        pair = residual_norm.pair_of(node) if residual_norm.enabled() else None
        if pair is None or not all(self.runs_cublas(ir.meta(n), rows) for n in pair):
            return None
        return "add" if node is pair[0] else "norm"

    def measured_linear(self, meta, rows: float | None, nbytes: float, flops: float, paired: str | None = None):
        """For a linear node whose shape the linear choice measured: (bandwidth efficiency,
        flops efficiency, launches, extra seconds) such that the node's ``nbytes`` and ``flops``
        take exactly the chosen implementation's measured time at ``rows`` (less the launch the
        timing included); None otherwise (the per-M / per-kind efficiencies apply). ``paired``:
        :meth:`residual_norm_pair`'s answer (an "add" side has no add kernel of its own)."""
        shape = self.choice_shape(meta, rows)
        if shape is None:
            return None
        table = self.linear_choice
        triton = shape.impl_at(int(math.ceil(rows))) != "cublas"
        if triton:  # interpolate the time of one pass over the weight, then pay this M's passes
            passes = self.weight_passes(meta, rows)
            per_pass = dataclasses.replace(shape, points=tuple(
                dataclasses.replace(p, triton_s=None if p.triton_s is None else
                                    max(p.triton_s - table.overhead_s, 1e-12) / self.weight_passes(meta, p.m))
                for p in shape.points))
            t = per_pass.seconds_at(rows)
            if t is None:
                return None
            net = max(t * passes, 1e-12)
        else:
            t = shape.seconds_at(rows)
            if t is None:
                return None
            net = max(t - table.overhead_s, 1e-12)
        dep = self.deployment
        bw_eff = max(nbytes, 1.0) / net / dep.hbm_bandwidth
        fl_eff = max(flops, 1.0) / net / dep.bf16_flops
        if triton:
            return bw_eff, fl_eff, self.launches(meta, rows), 0.0
        extra = 0.0
        launches = CUBLAS_LAUNCHES.get(dep.device, {}).get(meta.kind, 1)
        if meta.kind == "linear_add" and paired == "add":  # the add runs in the norm's kernel
            launches -= 1
        elif meta.kind == "linear_add":  # residual + product as a second op: read 2, write 1, a short kernel
            extra = 3 * rows * shape.n * table.itemsize / (dep.hbm_bandwidth * self.bandwidth_efficiency("elementwise")) \
                + self.kernel_latency()
        return bw_eff, fl_eff, int(launches), extra

    def _prices(self, meta, eclass: str, rows: float | None, nbytes: float, flops: float, paired: str | None = None):
        """(bandwidth, peak, launches, extra seconds, measured) of a node: from the linear
        choice's measured time when it covers the node (measured True), else from the
        calibrated efficiencies."""
        measured = self.measured_linear(meta, rows, nbytes, flops, paired)
        dep = self.deployment
        if measured is not None:
            bw_eff, fl_eff, n_launch, extra = measured
            return dep.hbm_bandwidth * bw_eff, dep.bf16_flops * fl_eff, n_launch, extra, True
        own = self.attention_fit(meta) if eclass == "attention" else None
        if own is not None:
            return (dep.hbm_bandwidth * own["bandwidth"], dep.bf16_flops * own["flops"], self.launches(meta, rows), 0.0,
                    False)
        return (dep.hbm_bandwidth * self.bandwidth_efficiency(eclass, meta.kind, rows),
                dep.bf16_flops * self.flops_efficiency(eclass, rows, meta.kind), self.launches(meta, rows), 0.0,
                False)

    # ------------------------------------------------------------ efficiencies

    def bandwidth_efficiency(self, eclass: str, kind: str | None = None, rows: float | None = None) -> float:
        """Calibrated efficiency of the node kind, else (linears) of its row count M, else of its
        class, else the deployment's."""
        cal = self.calibration
        if cal is not None:
            if kind == "packed_linear" and rows is not None and getattr(cal, "packed_linear_bandwidth_by_m", None):
                return cal.packed_linear_bandwidth_at(rows)
            eff = cal.kind_efficiency.get(kind, {}).get("bandwidth") if kind and kind != eclass else None
            if eff:
                return float(eff)
            if eclass == "linear" and rows is not None and getattr(cal, "linear_bandwidth_by_m", None):
                return cal.linear_bandwidth_at(rows)
            eff = cal.kind_efficiency.get(eclass, {}).get("bandwidth")
            if eff:
                return float(eff)
        if kind == "packed_linear" and rows is not None and self.deployment.packed_linear_bandwidth_by_m:
            return interpolate_log(dict(self.deployment.packed_linear_bandwidth_by_m), rows, "packed bandwidth")
        return self.deployment.bandwidth_efficiency

    def flops_efficiency(self, eclass: str, rows: float | None = None, kind: str | None = None) -> float:
        cal = self.calibration
        if cal is not None:
            eff = cal.kind_efficiency.get(kind, {}).get("flops") if kind and kind != eclass else None
            if eff:
                return float(eff)
            if eclass == "linear" and rows is not None and cal.linear_flops_by_m:
                return cal.linear_flops_at(rows)
            eff = cal.kind_efficiency.get(eclass, {}).get("flops")
            if eff:
                return float(eff)
        return self.deployment.flops_efficiency

    def attention_fit(self, meta) -> dict[str, float] | None:
        """The calibration's attention fit of the node's own head layout
        (``Calibration.attention_by_heads``: measured on that layout, e.g. by ``calibrate
        --model``), else None (the fit across layouts in ``kind_efficiency`` applies)."""
        cal = self.calibration
        by_heads = getattr(cal, "attention_by_heads", None) if cal is not None else None
        if not by_heads or efficiency_class(meta) != "attention":
            return None
        try:
            key = heads_key(meta.attrs["num_heads"], meta.attrs["num_kv_heads"], meta.attrs["head_dim"])
        except (KeyError, TypeError, ValueError):
            return None
        return by_heads.get(key)

    def latency(self, eclass: str, kind: str | None = None, launches: int = 1, meta=None) -> float:
        """Calibrated fixed time of a node: per call of the kind (attention's fitted intercept:
        of the node's head layout where ``meta`` has one measured, :meth:`attention_fit`), plus
        the short kernels' latency (:meth:`kernel_latency`) for each launch of an elementwise
        node and for rope_attention's rope_and_cache kernel; 0 without a calibration."""
        cal = self.calibration
        if cal is None:
            return 0.0
        # elementwise nodes are short kernels; rope_attention runs one (rope_and_cache) beside the
        # attention kernels the calibration timed
        short = launches * self.kernel_latency() if eclass == "elementwise" else \
            self.kernel_latency() if kind == "rope_attention" else 0.0
        own = self.attention_fit(meta) if meta is not None and eclass == "attention" else None
        if own is not None:
            return float(own["latency_s"]) + short
        for key in (kind, eclass):
            value = cal.kind_efficiency.get(key, {}).get("latency_s") if key else None
            if value:
                return float(value) + short
        return short

    def kernel_latency(self) -> float:
        """Seconds a short kernel takes beyond its graph node overhead and its bytes
        (``calibrate.fit_kernel_latency``: rms_norm timed at a few rows), else 0."""
        cal = self.calibration
        if cal is None:
            return 0.0
        return float(cal.kind_efficiency.get("elementwise", {}).get("kernel_latency_s") or 0.0)

    def weight_passes(self, meta, rows: float | None) -> int:
        """How many times the Triton linear of a linear node reads its weight at ``rows`` = M:
        one pass per row tile of the kernel's config for that M
        (:func:`specc.codegen.kernels.linear.weight_passes`; 65 rows = two 64-row tiles = the
        weight read twice). A packed (bf12) linear the same way, by its kernels' row tiles
        (:func:`packed_weight_passes`). 1 for other nodes, for CPU deployments (the reference runs
        torch's linear) and without a row count."""
        packed = meta.kind == "packed_linear"
        if rows is None or not (packed or meta.kind in CHOICE_KINDS) or self.deployment.device != "cuda":
            return 1
        try:
            n, k = int(meta.attrs["out_features"]), int(meta.attrs["in_features"])
        except (KeyError, TypeError, ValueError):
            return 1
        m = max(1, int(math.ceil(rows - 1e-9)))
        version = int(meta.attrs.get("format_version", 2)) if packed else None
        key = ("passes", m, n, k, version)
        hit = self._eval_cache.get(key)
        if hit is None:
            if packed:
                hit = packed_weight_passes(m, n, k, version)
            else:
                from specc.codegen.kernels.linear import weight_passes  # imports triton: only for linears

                hit = max(1, int(weight_passes(m, n, k)))
            self._eval_cache[key] = hit
        return hit

    def attention_traffic(self, meta, values: Mapping[str, int]):
        """(AttentionTraffic, seconds per merge slot) of an attention node that runs the split-KV
        kernel, when the calibration fitted that kernel's form (``merge_slot_s``); else None
        (the node is priced by the IR's bytes, as before that fit)."""
        if meta.kind not in ATTENTION_PRICED or self.deployment.device != "cuda" or self.calibration is None:
            return None
        own = self.attention_fit(meta)
        slot_s = (own or self.calibration.kind_efficiency.get("attention", {})).get("merge_slot_s")
        out = meta.out
        if not slot_s or not isinstance(out, TensorMeta) or out.ndim != 3:
            return None
        try:
            heads, kv_heads, head_dim = (int(meta.attrs[k]) for k in ("num_heads", "num_kv_heads", "head_dim"))
            kv_len = self._num(meta.attrs["kv_len"], values)
        except (KeyError, TypeError, ValueError):
            return None
        batch, num_q = self._num(out.shape[0], values), self._num(out.shape[1], values)
        key = ("attention", batch, num_q, heads, kv_heads, head_dim, kv_len)
        traffic = self._eval_cache.get(key)
        if traffic is None:
            traffic = split_kv_traffic(int(batch), int(num_q), heads, kv_heads, head_dim, int(kv_len),
                                       self.deployment.sm_count)
            self._eval_cache[key] = traffic
        return traffic, float(slot_s)

    def norm_kernel_seconds(self, meta, rows: float | None, launches: int, paired: str | None = None) -> float:
        """A norm_linear that launches its rms_norm kernel apart (more than one row: the GEMM
        kernels take normalised rows; cuBLAS always) also reads x and writes the normalised rows:
        ``2 x M x K x itemsize`` bytes at the elementwise bandwidth, beyond the IR's bytes (which
        count the fused form); the "norm" side of a residual-norm pair (:meth:`residual_norm_pair`)
        also reads the residual and writes the sum: 4. At M = 1 the GEMV computes the statistics
        itself: nothing."""
        if meta.kind != "norm_linear" or rows is None or rows <= 1 or launches < 2:
            return 0.0
        try:
            k = int(meta.attrs["in_features"])
        except (KeyError, TypeError, ValueError):
            return 0.0
        itemsize = meta.out.itemsize if isinstance(meta.out, TensorMeta) else 2
        bw = self.deployment.hbm_bandwidth * self.bandwidth_efficiency("elementwise")
        passes = 4.0 if paired == "norm" else 2.0
        return passes * rows * k * itemsize / bw + self.kernel_latency()  # a short kernel of its own

    def launches(self, meta, rows: float | None = None) -> int:
        """Kernels a node lowers to on this deployment's device (:data:`LAUNCHES`, default 1);
        ``rows``: the M of a linear-like node, for counts that depend on it."""
        n = LAUNCHES.get(self.deployment.device, {}).get(meta.kind, 1)
        if not callable(n):
            return int(n)
        takes_rows = "rows" in inspect.signature(n).parameters
        return int(n(meta, rows=rows)) if takes_rows else int(n(meta))

    # ------------------------------------------------------------ evaluation

    def _num(self, expr, values: Mapping[str, int]) -> float:
        key = (expr, tuple(sorted(values.items())))
        hit = self._eval_cache.get(key)
        if hit is None:
            v = evaluate(expr, values)
            if isinstance(v, sympy.Basic):
                missing = sorted(str(s) for s in v.free_symbols)
                raise ValueError(f"cannot evaluate {expr} without values for {', '.join(missing)}")
            hit = float(v)
            self._eval_cache[key] = hit
        return hit

    def node_cost(self, ir, node, values: Mapping[str, int]) -> NodeCost | None:
        """The cost of one node at ``values`` (None for structural nodes, which cost nothing)."""
        meta = ir.meta(node)
        if meta.kind in FREE_KINDS:
            return None
        dep = self.deployment
        nbytes = self._num(meta.bytes_read + meta.bytes_written, values)
        flops = self._num(meta.flops, values)
        if nbytes == 0 and flops == 0:
            return None  # an alias the lowering emits no kernel for
        eclass = efficiency_class(meta)
        rows = None
        if eclass == "linear" and isinstance(meta.out, TensorMeta) and meta.out.ndim >= 1:
            rows = self._num(sympy.Mul(*meta.out.shape[:-1]), values) if meta.out.ndim > 1 else 1.0
        paired = self.residual_norm_pair(ir, node, rows) if eclass == "linear" else None
        bw, peak, n_launch, extra, measured = self._prices(meta, eclass, rows, nbytes, flops, paired)
        if meta.kind == "all_reduce" and dep.link_bandwidth > 0:
            # A ring all-reduce is bound by the GPU-to-GPU link, not HBM (specc.ir.collectives).
            from specc.ir.collectives import all_reduce_time

            message = self._num(meta.attrs["message_bytes"], values)
            t_link = float(all_reduce_time(message, meta.attrs["world_size"], dep.link_bandwidth, dep.link_latency_s))
            floor = float(all_reduce_time(message, meta.attrs["world_size"], dep.link_bandwidth, 0.0))
            return NodeCost(
                node=node.name, kind=meta.kind, component=component_of(meta, node.name), bytes=nbytes, flops=flops,
                weight_bytes=0.0, cache_bytes=0.0, launches=n_launch, t_memory=t_link, t_compute=0.0,
                t_launch=n_launch * self.overhead, floor=floor, bandwidth=dep.link_bandwidth, peak=peak,
                bytes_expr=meta.bytes_read + meta.bytes_written, flops_expr=meta.flops)
        more_bytes, flops_scale, more_s = self.kernel_terms(meta, values, eclass, rows, n_launch, measured, paired)
        moved, work_flops, extra = nbytes + more_bytes, flops * flops_scale, extra + more_s
        return NodeCost(
            node=node.name, kind=meta.kind, component=component_of(meta, node.name), bytes=nbytes, flops=flops,
            weight_bytes=self._num(meta.weight_bytes, values),
            cache_bytes=self._num(meta.cache_read + meta.cache_written, values), launches=n_launch,
            t_memory=moved / bw, t_compute=work_flops / peak,
            t_launch=n_launch * self.overhead + self.latency(eclass, meta.kind, n_launch, meta) + extra,
            floor=max(nbytes / dep.hbm_bandwidth, flops / dep.bf16_flops), bandwidth=bw, peak=peak,
            bytes_expr=meta.bytes_read + meta.bytes_written, flops_expr=meta.flops)

    def kernel_terms(self, meta, values: Mapping[str, int], eclass: str, rows: float | None, launches: int,
                     measured: bool, paired: str | None = None) -> tuple[float, float, float]:
        """What the kernels of a node do beyond its IR formulas: (extra HBM bytes, factor on its
        FLOPs, extra seconds added like a latency).

        - a linear priced by efficiencies reads its weight once per row tile of the Triton kernel
          (:meth:`weight_passes`; a measured linear's time already holds its passes, a
          record fitted before the tiles were priced has them in its efficiencies, and one the
          linear choice sends to cuBLAS, e.g. a built-in GPU deployment's stated rule from 65
          rows, streams its weight once);
        - a multi-row norm_linear runs its rms_norm kernel apart (:meth:`norm_kernel_seconds`);
        - attention that runs the split-KV kernel writes and merges fp32 partials, computes on
          padded row tiles and runs the merge kernel (:meth:`attention_traffic`)."""
        more_bytes, flops_scale, more_s = 0.0, 1.0, 0.0
        if (eclass == "linear" and not measured and (self.calibration is None or self.calibration.linear_tiles)
                and not self.runs_cublas(meta, rows)):
            passes = self.weight_passes(meta, rows)
            if passes > 1:
                more_bytes += (passes - 1) * self._num(meta.weight_bytes, values)
        more_s += self.norm_kernel_seconds(meta, rows, launches, paired)
        attn = self.attention_traffic(meta, values) if eclass == "attention" else None
        if attn is not None:
            traffic, slot_s = attn
            more_bytes += traffic.extra_bytes
            flops_scale = traffic.flops_scale
            more_s += traffic.merge_work * slot_s
        return more_bytes, flops_scale, more_s

    def sync_cost(self, ir, values: Mapping[str, int], rows: int | None = None, host: bool = True) -> NodeCost:
        """Greedy acceptance of one forward: argmax over the logits, then one host sync. A
        batched verify (more than one row, some row verifying drafts) also waits for the host's
        per-step work beyond an AR step's (``Deployment.spec_host_s``; ``host``: False for a
        drafter's forward, whose drafts stay on the device). ``rows``: the forward's rows when
        ``values`` are a packed step's (B = 1, Q = all tokens)."""
        out = ir.meta(next(n for n in ir.graph.nodes if n.op == "output")).out
        logits = tensors_in(out)[0]
        expr = logits.nbytes
        nbytes = self._num(expr, values)
        dep = self.deployment
        bw = dep.hbm_bandwidth * self.bandwidth_efficiency("elementwise")
        batch = int(rows if rows is not None else values.get("B", 1))
        tokens = int(values.get("B", 1)) * int(values.get("Q", 1))
        host_s = dep.spec_host_s if host and batch > 1 and tokens > batch else 0.0
        return NodeCost("acceptance", "argmax+sync", "acceptance + host sync", nbytes, 0.0, 0.0, 0.0, 1,
                        nbytes / bw + host_s, 0.0, dep.launch_overhead_s, nbytes / dep.hbm_bandwidth,
                        bw, dep.bf16_flops, bytes_expr=expr, flops_expr=0)

    def step(self, ir, values: Mapping[str, int], *, step: str | None = None, role: str = "target",
             sync: bool = True, formula: bool = False) -> StepPrediction:
        """Predict one forward of ``ir`` at ``values`` ({"B": 1, "Q": 16, "C": 1024, "N": 4})."""
        vals = {k: int(v) for k, v in values.items() if k in {str(s) for s in ir.symbols}}
        nodes = [c for c in (self.node_cost(ir, n, vals) for n in ir.graph.nodes) if c is not None]
        pred = StepPrediction(step or ir.step, role, vals, nodes, self.deployment.name, self.graphs, ir.title,
                              self.sync_cost(ir, vals, host=role == "target") if sync else None)
        if formula:
            pred._formula = self.step_formula(ir, vals)
        return pred

    def step_formula(self, ir, values: Mapping[str, int] | None = None) -> sympy.Expr:
        """sum over nodes of Max(bytes / bw_eff, flops / peak_eff) + launches * overhead, symbolic in
        the step's sizes; identical node formulas are merged (36 layers -> 36 * Max(...)).
        Per-M linear efficiencies are taken at ``values`` (they are a measured table, not a formula)."""
        terms: dict[tuple, int] = defaultdict(int)
        for node in ir.graph.nodes:
            meta = ir.meta(node)
            if meta.kind in FREE_KINDS:
                continue
            eclass = efficiency_class(meta)
            rows = None
            if values is not None and eclass == "linear" and isinstance(meta.out, TensorMeta) and meta.out.ndim > 1:
                rows = self._num(sympy.Mul(*meta.out.shape[:-1]), values)
            measured = rows is not None and self.linear_choice is not None
            paired = self.residual_norm_pair(ir, node, rows) if eclass == "linear" else None
            bw, peak, n_launch, extra, measured = self._prices(
                meta, eclass, rows, self._num(meta.bytes_read + meta.bytes_written, values) if measured else 0.0,
                self._num(meta.flops, values) if measured else 0.0, paired)
            more_bytes, flops_scale, more_s = (0.0, 1.0, 0.0) if values is None else \
                self.kernel_terms(meta, values, eclass, rows, n_launch, measured, paired)
            nbytes, nflops = meta.bytes_read + meta.bytes_written, meta.flops
            if more_bytes:
                nbytes = nbytes + sympy.Float(more_bytes, 15)
            if flops_scale != 1.0:
                nflops = nflops * sympy.Float(flops_scale, 15)
            key = (sympy.expand(nbytes), sympy.expand(nflops), bw, peak, n_launch,
                   self.latency(eclass, meta.kind, n_launch, meta) + extra + more_s)
            if key[0] == 0 and key[1] == 0:
                continue
            terms[key] += 1
        total = sympy.Integer(0)
        for (nbytes, flops, bw, peak, n_launch, latency), count in terms.items():
            work = sympy.Max(nbytes / sympy.Float(bw, 6), flops / sympy.Float(peak, 6)) if flops != 0 else \
                nbytes / sympy.Float(bw, 6)
            total += count * (work + n_launch * sympy.Float(self.overhead, 4) + sympy.Float(latency, 4))
        return total

    # ------------------------------------------------------------ systems

    def predict(self, target_ir, draft_ir=None, *, method: str = "ar", num_draft: int = 0, acceptance=None,
                context: int | None = None, batch_size: int | None = None, formula: bool = False) -> SystemPrediction:
        """Predict a whole system: AR, or draft + verify with ``acceptance`` (an AcceptanceModel).

        target_ir: the target's verify IR (it also serves AR at Q = 1); draft_ir: the drafter's draft
        IR (DFlash: bound to the target's embedding and LM head).
        """
        from specc.methods import get_method
        from specc.search.acceptance import AcceptanceModel

        dep = self.deployment
        b = int(batch_size or dep.batch_size)
        c = int(context if context is not None else default_context(dep))
        ar = self.step(target_ir, {"B": b, "Q": 1, "C": c}, step="ar", formula=formula)
        impl = get_method(method)  # the drafter forwards a step makes are the method's
        if not impl.uses_drafter or draft_ir is None or num_draft < 1:
            return SystemPrediction("ar", 0, dep.name, b, c, ar, None, [], 1.0, AcceptanceModel.none())
        acceptance = acceptance or AcceptanceModel.none()
        k = int(num_draft)
        e = acceptance.expected_tokens(k)
        verify = self.step(target_ir, {"B": b, "Q": k + 1, "C": c}, step="verify", formula=formula)
        committed = max(1, int(round(acceptance.expected_max_tokens(k, b))))  # b rows: the longest row's
        drafts = [(self.step(draft_ir, {"B": b, "C": c, **shape.values}, step="draft", role="drafter",
                             formula=formula), shape.count)
                  for shape in impl.draft_shapes(k, committed)]
        return SystemPrediction(method, k, dep.name, b, c, ar, verify, drafts, e, acceptance)


def positions_of(raw: Mapping[str, Any] | None) -> int | None:
    """A config.json's max_position_embeddings (a multimodal qwen3_5's from its text_config), if
    it gives one."""
    from specc.models.config import ConfigError
    from specc.models.hybrid_config import text_config_view

    if not isinstance(raw, Mapping):
        return None
    try:
        positions = text_config_view(dict(raw)).get("max_position_embeddings")
    except ConfigError:  # reported where the config is traced
        return None
    return positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0 else None


def default_context(deployment, *configs: Mapping[str, Any] | None) -> int:
    """The KV-cache length priced when none is given: DEFAULT_CONTEXT within the deployment's
    context range, and at most the positions of each of ``configs`` (config.json dicts; None
    and configs without max_position_embeddings are skipped)."""
    context = min(max(DEFAULT_CONTEXT, deployment.context_min), deployment.context_max)
    return min([context, *(n for n in map(positions_of, configs) if n is not None)])


def predict_ar_step(ir, deployment, values: Mapping[str, int] | None = None, **kwargs) -> StepPrediction:
    """Shorthand: the AR step (Q = 1) of a target IR on a deployment."""
    model = CostModel(deployment, **kwargs)
    vals = {"B": model.deployment.batch_size, "C": DEFAULT_CONTEXT, **(values or {}), "Q": 1}
    return model.step(ir, vals, step="ar")


def speedup_table(model: CostModel, target_ir, draft_ir, method: str, acceptance, ks: Iterable[int],
                  context: int | None = None) -> list[dict[str, Any]]:
    """Predicted tokens/s and speedup at each k (for `specc cost --sweep` and the search)."""
    rows = []
    for k in ks:
        p = model.predict(target_ir, draft_ir, method=method, num_draft=k, acceptance=acceptance, context=context)
        rows.append({"num_draft": k, "expected_tokens": p.expected_tokens, "step_s": p.step_time,
                     "tokens_per_s": p.tokens_per_s, "speedup": p.speedup})
    return rows


def fmt_seconds(seconds: float) -> str:
    return _ms(seconds)
