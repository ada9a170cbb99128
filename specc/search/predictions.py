"""What the cost model returns: per-node costs, step and system predictions, the gap report.

Plain records with their formatting; the arithmetic that fills them is ``cost_model.CostModel``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import sympy

from specc.ir import fmt_expr



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


