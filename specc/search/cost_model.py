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
- ``latency``: a calibrated fixed time per call (attention's fitted intercept), else 0;
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
from collections import defaultdict
from typing import Any, Iterable, Mapping

import sympy

from specc.codegen.launches import LAUNCHES, register_launches  # noqa: F401  (published by codegen)
from specc.ir import STRUCTURAL_KINDS, evaluate, fmt_expr
from specc.ir.meta import TensorMeta, tensors_in

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
    if kind in ("attention", "rope_attention"):
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
    if meta.kind in ("attention", "rope_attention"):
        return "attention"
    if LINEAR_LIKE_ATTR in meta.attrs or "linear" in meta.kind:
        return "linear"
    return "elementwise"


# --------------------------------------------------------------------------- results


@dataclasses.dataclass
class NodeCost:
    """One compute node at concrete sizes: what it moves, does and costs, and the formulas."""

    node: str
    kind: str
    component: str
    bytes: float
    flops: float
    weight_bytes: float
    cache_bytes: float
    launches: int
    t_memory: float
    t_compute: float
    t_launch: float
    floor: float
    bandwidth: float  # effective bytes/s used
    peak: float  # effective FLOP/s used
    bytes_expr: Any = 0  # sympy: bytes_read + bytes_written in B, Q, C, N (from the node's metadata)
    flops_expr: Any = 0

    @property
    def bytes_formula(self) -> str:
        return _fmt(self.bytes_expr)

    @property
    def flops_formula(self) -> str:
        return _fmt(self.flops_expr)

    @property
    def time(self) -> float:
        return max(self.t_memory, self.t_compute) + self.t_launch

    @property
    def work_time(self) -> float:
        return max(self.t_memory, self.t_compute)

    @property
    def bound(self) -> str:
        if self.t_launch >= max(self.t_memory, self.t_compute):
            return "launch"
        return "memory" if self.t_memory >= self.t_compute else "compute"

    def formula(self) -> str:
        return (f"max(({self.bytes_formula}) B / {self.bandwidth:.4g} B/s, ({self.flops_formula}) FLOP / "
                f"{self.peak:.4g} FLOP/s) + {self.launches} x {self.t_launch / max(self.launches, 1):.3g} s")

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.endswith("_expr")}
        out.update(time=self.time, bound=self.bound, bytes_formula=self.bytes_formula,
                   flops_formula=self.flops_formula)
        return out


_FMT_CACHE: dict[Any, str] = {}


def _fmt(expr) -> str:
    text = _FMT_CACHE.get(expr)
    if text is None:
        text = _FMT_CACHE[expr] = fmt_expr(expr)
    return text


@dataclasses.dataclass
class Component:
    name: str
    time: float
    floor: float
    nodes: int = 0
    bytes: float = 0.0
    flops: float = 0.0
    launches: int = 0
    bound: str = ""
    detail: list["Component"] = dataclasses.field(default_factory=list)

    @property
    def gap(self) -> float:
        return self.time - self.floor

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "time_s": self.time, "floor_s": self.floor, "gap_s": self.gap, "nodes": self.nodes,
               "bytes": self.bytes, "flops": self.flops, "launches": self.launches, "bound": self.bound}
        if self.detail:
            out["detail"] = [c.to_json() for c in self.detail]
        return out


@dataclasses.dataclass
class StepPrediction:
    """One forward (AR, verify or draft) at concrete B, Q, C (N): per-node costs and their sum."""

    step: str  # "ar" | "verify" | "draft"
    role: str  # "target" | "drafter"
    values: dict[str, int]
    nodes: list[NodeCost]
    deployment: str
    graphs: bool
    title: str = ""
    sync: NodeCost | None = None  # the greedy-acceptance pseudo node (argmax on the host)
    _formula: Any = dataclasses.field(default=None, repr=False)

    @property
    def time(self) -> float:
        return sum(n.time for n in self.nodes) + (self.sync.time if self.sync else 0.0)

    @property
    def floor(self) -> float:
        return sum(n.floor for n in self.nodes) + (self.sync.floor if self.sync else 0.0)

    @property
    def launch_time(self) -> float:
        return sum(n.t_launch for n in self.nodes)

    @property
    def launches(self) -> int:
        return sum(n.launches for n in self.nodes)

    @property
    def bytes(self) -> float:
        return sum(n.bytes for n in self.nodes)

    @property
    def weight_bytes(self) -> float:
        return sum(n.weight_bytes for n in self.nodes)

    @property
    def flops(self) -> float:
        return sum(n.flops for n in self.nodes)

    def components(self, prefix: str = "") -> list[Component]:
        """Node groups by component, plus launch overhead and host sync, largest gap first."""
        groups: dict[str, Component] = {}
        bounds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for n in self.nodes:
            c = groups.setdefault(n.component, Component(prefix + n.component, 0.0, 0.0))
            c.time += n.work_time
            c.floor += n.floor
            c.nodes += 1
            c.bytes += n.bytes
            c.flops += n.flops
            bounds[n.component]["memory" if n.t_memory >= n.t_compute else "compute"] += n.work_time
        for key, c in groups.items():
            b = bounds[key]
            c.bound = max(b, key=b.get) if b else ""
        out = list(groups.values())
        out.append(Component(prefix + "launch overhead", self.launch_time, 0.0, nodes=len(self.nodes),
                             launches=self.launches, bound="launch"))
        if self.sync is not None:
            out.append(Component(prefix + "acceptance + host sync", self.sync.time, self.sync.floor, nodes=1,
                                 bytes=self.sync.bytes, launches=1, bound="launch"))
        return sorted(out, key=lambda c: c.gap, reverse=True)

    def formula(self) -> sympy.Expr:
        """The step time as one expression in B, Q, C (N), efficiencies at these sizes."""
        return self._formula

    def to_json(self, nodes: bool = False) -> dict[str, Any]:
        out = {"step": self.step, "role": self.role, "values": self.values, "time_s": self.time, "floor_s": self.floor,
               "launch_s": self.launch_time, "launches": self.launches, "bytes": self.bytes,
               "weight_bytes": self.weight_bytes, "flops": self.flops, "graphs": self.graphs,
               "components": [c.to_json() for c in self.components()]}
        if self._formula is not None:
            out["formula"] = fmt_expr(self._formula)
        if nodes:
            out["nodes"] = [n.to_json() for n in self.nodes]
        return out


@dataclasses.dataclass
class GapReport:
    title: str
    rows: list[Component]
    total_time: float
    total_floor: float
    unit: str = "per step"

    def text(self, limit: int | None = None) -> str:
        lines = [self.title, f"{'component':<36} {'predicted':>11} {'floor':>11} {'gap':>11} {'share':>6}  bound"]
        for c in self.rows[:limit]:
            share = c.time / self.total_time if self.total_time else 0.0
            lines.append(f"{c.name:<36} {_ms(c.time):>11} {_ms(c.floor):>11} {_ms(c.gap):>11} {share:6.1%}  {c.bound}")
        lines.append(f"{'total':<36} {_ms(self.total_time):>11} {_ms(self.total_floor):>11} "
                     f"{_ms(self.total_time - self.total_floor):>11}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "unit": self.unit, "total_s": self.total_time, "floor_s": self.total_floor,
                "rows": [c.to_json() for c in self.rows]}

    def top(self) -> Component | None:
        return self.rows[0] if self.rows else None


def _ms(seconds: float) -> str:
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclasses.dataclass
class SystemPrediction:
    """A speculative (or AR) system on a deployment: steps, acceptance, tokens/s, speedup."""

    method: str
    num_draft: int
    deployment: str
    batch_size: int
    context: int
    ar: StepPrediction
    verify: StepPrediction | None
    drafts: list[tuple[StepPrediction, int]]  # (draft forward, how many per step)
    expected_tokens: float
    acceptance: Any = None

    @property
    def draft_time(self) -> float:
        return sum(p.time * n for p, n in self.drafts)

    @property
    def step_time(self) -> float:
        if self.verify is None:
            return self.ar.time
        return self.draft_time + self.verify.time

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * self.expected_tokens / self.step_time

    @property
    def ar_tokens_per_s(self) -> float:
        return self.batch_size / self.ar.time

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.ar_tokens_per_s

    def gap_report(self) -> GapReport:
        main = self.verify or self.ar
        rows = main.components(prefix="target ")
        if self.drafts:
            detail: list[Component] = []
            time = floor = 0.0
            for p, n in self.drafts:
                time += p.time * n
                floor += p.floor * n
                for c in p.components():
                    detail.append(dataclasses.replace(c, time=c.time * n, floor=c.floor * n))
            merged: dict[str, Component] = {}
            for c in detail:
                m = merged.setdefault(c.name, Component(c.name, 0.0, 0.0, bound=c.bound))
                m.time += c.time
                m.floor += c.floor
                m.nodes += c.nodes
                m.bytes += c.bytes
                m.flops += c.flops
                m.launches += c.launches
            drafter = Component("drafter step" + (f" ({sum(n for _, n in self.drafts)} forwards)"
                                                  if sum(n for _, n in self.drafts) > 1 else ""), time, floor,
                                nodes=sum(len(p.nodes) * n for p, n in self.drafts),
                                bytes=sum(p.bytes * n for p, n in self.drafts),
                                flops=sum(p.flops * n for p, n in self.drafts),
                                launches=sum(p.launches * n for p, n in self.drafts),
                                bound=max(merged.values(), key=lambda c: c.time).bound if merged else "",
                                detail=sorted(merged.values(), key=lambda c: c.gap, reverse=True))
            rows.append(drafter)
        rows.sort(key=lambda c: c.gap, reverse=True)
        title = (f"gap report: {self.method}" + (f" k={self.num_draft}" if self.num_draft else "")
                 + f" on {self.deployment} (B={self.batch_size}, C={self.context}); per step, "
                 f"E={self.expected_tokens:.2f} tokens/step")
        return GapReport(title, rows, self.step_time, sum(c.floor for c in rows))

    def summary(self) -> str:
        parts = [f"{self.method}" + (f" k={self.num_draft}" if self.num_draft else ""),
                 f"step {_ms(self.step_time)}"]
        if self.drafts:
            parts.append(f"(draft {_ms(self.draft_time)} + verify {_ms(self.verify.time)})")
        parts += [f"E {self.expected_tokens:.2f} tok/step", f"{self.tokens_per_s:,.1f} tok/s",
                  f"AR {_ms(self.ar.time)} = {self.ar_tokens_per_s:,.1f} tok/s", f"speedup {self.speedup:.2f}x"]
        return ", ".join(parts)

    def to_json(self, nodes: bool = False) -> dict[str, Any]:
        return {
            "method": self.method, "num_draft": self.num_draft, "deployment": self.deployment,
            "batch_size": self.batch_size, "context": self.context, "expected_tokens_per_step": self.expected_tokens,
            "step_s": self.step_time, "draft_s": self.draft_time, "tokens_per_s": self.tokens_per_s,
            "ar_step_s": self.ar.time, "ar_tokens_per_s": self.ar_tokens_per_s, "speedup": self.speedup,
            "ar": self.ar.to_json(nodes), "verify": self.verify.to_json(nodes) if self.verify else None,
            "drafts": [{"count": n, **p.to_json(nodes)} for p, n in self.drafts],
            "acceptance": self.acceptance.to_json() if hasattr(self.acceptance, "to_json") else self.acceptance,
            "gap_report": self.gap_report().to_json(),
        }


# --------------------------------------------------------------------------- the model


class CostModel:
    """Prices IR nodes for one deployment (see the module docstring for the formulas).

    graphs: price launches as CUDA-graph node replays (default: True on CUDA deployments).
    calibration: a :class:`specc.search.calibrate.Calibration` (default: the record written
      next to a calibrated deployment file, if any).
    """

    def __init__(self, deployment, *, graphs: bool | None = None, calibration=None):
        from specc.search.calibrate import calibration_for
        from specc.search.deployments import Deployment, get_deployment

        self.deployment: Deployment = get_deployment(deployment) if isinstance(deployment, str) else deployment
        dep = self.deployment
        self.graphs = dep.device == "cuda" if graphs is None else bool(graphs)
        self.calibration = calibration if calibration is not None else calibration_for(dep)
        self.overhead = dep.graph_node_overhead_s if self.graphs else dep.launch_overhead_s
        self._eval_cache: dict[tuple, float] = {}

    # ------------------------------------------------------------ efficiencies

    def bandwidth_efficiency(self, eclass: str, kind: str | None = None, rows: float | None = None) -> float:
        """Calibrated efficiency of the node kind, else (linears) of its row count M, else of its
        class, else the deployment's."""
        cal = self.calibration
        if cal is not None:
            eff = cal.kind_efficiency.get(kind, {}).get("bandwidth") if kind and kind != eclass else None
            if eff:
                return float(eff)
            if eclass == "linear" and rows is not None and getattr(cal, "linear_bandwidth_by_m", None):
                return cal.linear_bandwidth_at(rows)
            eff = cal.kind_efficiency.get(eclass, {}).get("bandwidth")
            if eff:
                return float(eff)
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

    def latency(self, eclass: str, kind: str | None = None) -> float:
        """Calibrated fixed time per call of the kind (attention's fitted intercept), else 0."""
        cal = self.calibration
        if cal is None:
            return 0.0
        for key in (kind, eclass):
            value = cal.kind_efficiency.get(key, {}).get("latency_s") if key else None
            if value:
                return float(value)
        return 0.0

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
        bw = dep.hbm_bandwidth * self.bandwidth_efficiency(eclass, meta.kind, rows)
        peak = dep.bf16_flops * self.flops_efficiency(eclass, rows, meta.kind)
        n_launch = self.launches(meta, rows)
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
        return NodeCost(
            node=node.name, kind=meta.kind, component=component_of(meta, node.name), bytes=nbytes, flops=flops,
            weight_bytes=self._num(meta.weight_bytes, values),
            cache_bytes=self._num(meta.cache_read + meta.cache_written, values), launches=n_launch,
            t_memory=nbytes / bw, t_compute=flops / peak,
            t_launch=n_launch * self.overhead + self.latency(eclass, meta.kind),
            floor=max(nbytes / dep.hbm_bandwidth, flops / dep.bf16_flops), bandwidth=bw, peak=peak,
            bytes_expr=meta.bytes_read + meta.bytes_written, flops_expr=meta.flops)

    def sync_cost(self, ir, values: Mapping[str, int]) -> NodeCost:
        """Greedy acceptance of one forward: argmax over the logits, then one host sync."""
        out = ir.meta(next(n for n in ir.graph.nodes if n.op == "output")).out
        logits = tensors_in(out)[0]
        expr = logits.nbytes
        nbytes = self._num(expr, values)
        bw = self.deployment.hbm_bandwidth * self.bandwidth_efficiency("elementwise")
        return NodeCost("acceptance", "argmax+sync", "acceptance + host sync", nbytes, 0.0, 0.0, 0.0, 1,
                        nbytes / bw, 0.0, self.deployment.launch_overhead_s, nbytes / self.deployment.hbm_bandwidth,
                        bw, self.deployment.bf16_flops, bytes_expr=expr, flops_expr=0)

    def step(self, ir, values: Mapping[str, int], *, step: str | None = None, role: str = "target",
             sync: bool = True, formula: bool = False) -> StepPrediction:
        """Predict one forward of ``ir`` at ``values`` ({"B": 1, "Q": 16, "C": 1024, "N": 4})."""
        vals = {k: int(v) for k, v in values.items() if k in {str(s) for s in ir.symbols}}
        nodes = [c for c in (self.node_cost(ir, n, vals) for n in ir.graph.nodes) if c is not None]
        pred = StepPrediction(step or ir.step, role, vals, nodes, self.deployment.name, self.graphs, ir.title,
                              self.sync_cost(ir, vals) if sync else None)
        if formula:
            pred._formula = self.step_formula(ir, vals)
        return pred

    def step_formula(self, ir, values: Mapping[str, int] | None = None) -> sympy.Expr:
        """sum over nodes of Max(bytes / bw_eff, flops / peak_eff) + launches * overhead, symbolic in
        the step's sizes; identical node formulas are merged (36 layers -> 36 * Max(...)).
        Per-M linear efficiencies are taken at ``values`` (they are a measured table, not a formula)."""
        dep = self.deployment
        terms: dict[tuple, int] = defaultdict(int)
        for node in ir.graph.nodes:
            meta = ir.meta(node)
            if meta.kind in FREE_KINDS:
                continue
            eclass = efficiency_class(meta)
            rows = None
            if values is not None and eclass == "linear" and isinstance(meta.out, TensorMeta) and meta.out.ndim > 1:
                rows = self._num(sympy.Mul(*meta.out.shape[:-1]), values)
            bw = dep.hbm_bandwidth * self.bandwidth_efficiency(eclass, meta.kind, rows)
            peak = dep.bf16_flops * self.flops_efficiency(eclass, rows, meta.kind)
            key = (sympy.expand(meta.bytes_read + meta.bytes_written), sympy.expand(meta.flops), bw, peak,
                   self.launches(meta, rows), self.latency(eclass, meta.kind))
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
        c = int(context if context is not None else min(max(DEFAULT_CONTEXT, dep.context_min), dep.context_max))
        ar = self.step(target_ir, {"B": b, "Q": 1, "C": c}, step="ar", formula=formula)
        impl = get_method(method)  # the drafter forwards a step makes are the method's
        if not impl.uses_drafter or draft_ir is None or num_draft < 1:
            return SystemPrediction("ar", 0, dep.name, b, c, ar, None, [], 1.0, AcceptanceModel.none())
        acceptance = acceptance or AcceptanceModel.none()
        k = int(num_draft)
        e = acceptance.expected_tokens(k)
        verify = self.step(target_ir, {"B": b, "Q": k + 1, "C": c}, step="verify", formula=formula)
        committed = max(1, int(round(e)))
        drafts = [(self.step(draft_ir, {"B": b, "C": c, **shape.values}, step="draft", role="drafter",
                             formula=formula), shape.count)
                  for shape in impl.draft_shapes(k, committed)]
        return SystemPrediction(method, k, dep.name, b, c, ar, verify, drafts, e, acceptance)


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
