"""Running a pipeline of passes: ordering, checking, timing, dumping, fixed points.

    pm = PassManager(["fuse_qkv", "fuse_gate_up", "fuse_norm_linear"], check=True, dump_ir="dumps/")
    report = pm.run(ir)          # rewrites ir in place
    report.stats("fuse_qkv")     # {"groups": 4, "linears": 12}
    print(report)                # one line per pass application with time and stats

Order: the given order, except where passes' ``after``/``before`` constraints say otherwise
(a stable topological sort; ``report.order`` is what ran). With ``fixed_point=True`` the whole
pipeline repeats until no pass changes the IR (at most ``max_iterations`` rounds).
With ``check=True`` the IR is linted before the first pass and after every pass, and each
pass's ``ensures`` is verified; a failure raises :class:`PassError` naming the pass.
With ``dump_ir=DIR`` the IR text is written before the first pass (``000-input.txt``) and
after every application (``001-fuse_qkv.txt``...), ready to diff.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterable

from specc.ir.errors import IRError
from specc.passes.base import Pass, PassContext, PassError, PassResult
from specc.passes.registry import PipelineError, as_pass


@dataclasses.dataclass
class PassRecord:
    """One application of one pass."""

    index: int
    name: str
    iteration: int
    changed: bool
    stats: dict[str, Any]
    seconds: float
    skipped: str | None = None

    def line(self) -> str:
        if self.skipped:
            return f"{self.index:3d}  {self.name:<24} skipped: {self.skipped}"
        stats = ", ".join(f"{k}={v}" for k, v in self.stats.items())
        state = "changed" if self.changed else "no change"
        it = f" (round {self.iteration})" if self.iteration > 1 else ""
        return f"{self.index:3d}  {self.name:<24} {state:<9} {self.seconds * 1000:8.1f} ms  {stats}{it}"


@dataclasses.dataclass
class PipelineReport:
    records: list[PassRecord]
    order: list[str]
    reordered: bool
    iterations: int
    converged: bool
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.records)

    def stats(self, name: str) -> dict[str, Any]:
        """Stats of every application of pass ``name`` summed (numbers) or last-wins."""
        merged: dict[str, Any] = {}
        for r in self.records:
            if r.name != name:
                continue
            for k, v in r.stats.items():
                if isinstance(v, (int, float)) and isinstance(merged.get(k, 0), (int, float)):
                    merged[k] = merged.get(k, 0) + v
                else:
                    merged[k] = v
        return merged

    def __str__(self) -> str:
        lines = [r.line() for r in self.records]
        if self.reordered:
            lines.insert(0, f"note: order changed by pass constraints: {', '.join(self.order)}")
        if not self.converged:
            lines.append(f"warning: no fixed point after {self.iterations} rounds")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def order_passes(entries: list[tuple[Pass, tuple[str, ...], tuple[str, ...]]]) -> list[Pass]:
    """Stable topological order honouring after/before constraints between passes present."""
    n = len(entries)
    names = [p.name for p, _, _ in entries]
    edges: dict[int, set[int]] = {i: set() for i in range(n)}  # i -> j: i runs before j
    for j, (p, after, before) in enumerate(entries):
        for i, name in enumerate(names):
            if i == j:
                continue
            if name in (tuple(p.after) + tuple(after)):
                edges[i].add(j)
            if name in (tuple(p.before) + tuple(before)):
                edges[j].add(i)
    indeg = {i: 0 for i in range(n)}
    for i in edges:
        for j in edges[i]:
            indeg[j] += 1
    ready = sorted(i for i in range(n) if indeg[i] == 0)
    out: list[int] = []
    while ready:
        i = ready.pop(0)
        out.append(i)
        for j in sorted(edges[i]):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
        ready.sort()
    if len(out) != n:
        stuck = [names[i] for i in range(n) if i not in out]
        raise PipelineError(f"pass ordering constraints form a cycle between: {', '.join(stuck)}")
    return [entries[i][0] for i in out]


class PassManager:
    """Runs passes over an IR (see the module docstring)."""

    def __init__(self, passes: Iterable[Any] | str = (), *, check: bool = True, fixed_point: bool = False,
                 max_iterations: int = 8, dump_ir: str | Path | None = None, options: dict[str, Any] | None = None):
        self.check, self.fixed_point, self.max_iterations = check, fixed_point, max_iterations
        self.dump_ir = Path(dump_ir) if dump_ir else None
        self.options = dict(options or {})
        self._entries: list[tuple[Pass, tuple[str, ...], tuple[str, ...]]] = []
        if isinstance(passes, str):
            passes = [s for s in passes.split(",") if s.strip()]
        for p in passes:
            self.add(p)

    def add(self, p: Any, *, after: Iterable[str] = (), before: Iterable[str] = ()) -> "PassManager":
        """Append a pass (instance, class, name or ``+module:Class``) with extra constraints."""
        self._entries.append((as_pass(p), tuple(after), tuple(before)))
        return self

    @property
    def passes(self) -> list[Pass]:
        return order_passes(self._entries)

    def _dump(self, ir, index: int, name: str) -> None:
        if self.dump_ir is None:
            return
        self.dump_ir.mkdir(parents=True, exist_ok=True)
        (self.dump_ir / f"{index:03d}-{name}.txt").write_text(ir.text())

    def _check(self, ir, p: Pass | None) -> None:
        where = f"after pass {p.name}" if p else "before the first pass"
        try:
            ir.lint()
        except IRError as exc:
            raise PassError(f"{where}: {exc}", p.name if p else None) from exc
        if p is None:
            return
        ok = p.ensures(ir)
        if ok is False or isinstance(ok, str):
            reason = ok if isinstance(ok, str) else "ensures() returned False"
            raise PassError(f"pass {p.name} did not establish its postcondition: {reason}", p.name)

    def run(self, ir) -> PipelineReport:
        """Apply the pipeline to ``ir`` in place; returns a :class:`PipelineReport`."""
        order = self.passes
        given = [p.name for p, _, _ in self._entries]
        ctx = PassContext(check=self.check, options=self.options)
        records: list[PassRecord] = []
        self._dump(ir, 0, "input")
        if self.check:
            self._check(ir, None)
        index, iteration, converged = 0, 0, True
        while True:
            iteration += 1
            changed_round = False
            for p in order:
                index += 1
                req = p.requires(ir)
                if req is not True:
                    reason = req if isinstance(req, str) else "requires() returned False"
                    records.append(PassRecord(index, p.name, iteration, False, {}, 0.0, skipped=reason))
                    continue
                start = time.perf_counter()
                try:
                    result = p.run(ir, ctx)
                except PassError:
                    raise
                except Exception as exc:
                    raise PassError(f"pass {p.name} failed: {type(exc).__name__}: {exc}", p.name) from exc
                seconds = time.perf_counter() - start
                if not isinstance(result, PassResult):
                    raise PassError(f"pass {p.name}: run() must return a PassResult, got {type(result).__name__}", p.name)
                if result.changed:
                    ir.recompile()
                if self.check:
                    self._check(ir, p)
                records.append(PassRecord(index, p.name, iteration, bool(result.changed), dict(result.stats), seconds))
                self._dump(ir, index, p.name)
                changed_round |= bool(result.changed)
            if not self.fixed_point or not changed_round:
                break
            if iteration >= self.max_iterations:
                converged = False
                break
        return PipelineReport(records, [p.name for p in order], [p.name for p in order] != given, iteration,
                              converged, list(ctx.notes))


def run_pipeline(ir, pipeline: Iterable[Any] | str, **kwargs) -> PipelineReport:
    """Shorthand for ``PassManager(pipeline, **kwargs).run(ir)``."""
    return PassManager(pipeline, **kwargs).run(ir)
