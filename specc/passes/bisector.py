"""Finding the pass application that breaks a check.

    report = bisect(lambda: trace(model, "verify"), "fuse_qkv,fuse_gate_up,fuse_norm_linear",
                    outputs_match(inputs, expected))
    print(report)   # first bad application: #2 fuse_gate_up -- check failed: max |diff| 0.31 ...

The pipeline is expanded into its sequence of pass applications (fixed-point rounds included) by
running it once; if the full pipeline passes the check there is nothing to find. Otherwise a
binary search over prefix lengths applies the first k applications to a fresh IR from
``ir_factory`` and runs ``check`` on it (log2(n) checks; the check is usually the expensive
part: running the model). A pass that raises, or leaves an IR that does not lint, counts as a
failure at that application. The report carries the IR text just before and after the bad
application and their diff.

``check(ir)`` returns True / None (ok), False (failed), a ``(ok, message)`` tuple, or raises.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Iterable

import torch

from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.manager import order_passes
from specc.passes.registry import as_pass


@dataclasses.dataclass
class BisectReport:
    """Outcome of :func:`bisect`. ``first_bad`` is 1-based into ``applications``, or None."""

    applications: list[str]
    first_bad: int | None
    message: str
    checks_run: int
    before_text: str = ""
    after_text: str = ""

    @property
    def found(self) -> bool:
        return self.first_bad is not None and self.first_bad > 0

    @property
    def pass_name(self) -> str | None:
        return self.applications[self.first_bad - 1] if self.found else None

    @property
    def diff(self) -> str:
        return "".join(difflib.unified_diff(self.before_text.splitlines(True), self.after_text.splitlines(True),
                                            "before", "after", n=1))

    def __str__(self) -> str:
        apps = ", ".join(f"#{i + 1} {a}" for i, a in enumerate(self.applications))
        if self.first_bad is None:
            return f"bisect: the check passes after the whole pipeline ({apps}); {self.checks_run} checks run"
        if self.first_bad == 0:
            return f"bisect: the check already fails before any pass: {self.message}"
        return (f"bisect: first bad pass application #{self.first_bad} {self.pass_name} "
                f"(pipeline: {apps}): {self.message}; {self.checks_run} checks run")


def _run_check(check: Callable, ir) -> tuple[bool, str]:
    try:
        out = check(ir)
    except Exception as exc:
        return False, f"check raised {type(exc).__name__}: {exc}"
    if out is None or out is True:
        return True, ""
    if out is False:
        return False, "check failed"
    if isinstance(out, tuple) and len(out) == 2:
        return bool(out[0]), str(out[1])
    raise TypeError(f"check must return bool, None or (ok, message), got {out!r}")


def _apply(ir, p: Pass, lint: bool) -> tuple[bool, str, bool]:
    """Apply one pass: (ok, message, changed); not ok means the pass raised or broke the IR."""
    try:
        if p.requires(ir) is not True:
            return True, "", False
        result = p.run(ir, PassContext(check=lint))
        if not isinstance(result, PassResult):
            return False, f"{p.name}: run() returned {type(result).__name__}, not PassResult", False
        if result.changed:
            ir.recompile()
        if lint:
            ir.lint()
        return True, "", bool(result.changed)
    except Exception as exc:
        return False, f"{p.name} raised or broke the IR: {type(exc).__name__}: {str(exc).splitlines()[0]}", True


def bisect(ir_factory: Callable[[], Any], pipeline: Iterable[Any] | str, check: Callable[[Any], Any], *,
           lint: bool = True, fixed_point: bool = False, max_iterations: int = 8) -> BisectReport:
    """Find the first pass application after which ``check`` fails (see the module docstring)."""
    if isinstance(pipeline, str):
        pipeline = [s for s in pipeline.split(",") if s.strip()]
    passes = order_passes([(as_pass(p), (), ()) for p in pipeline])
    checks = 0

    ir = ir_factory()
    ok, msg = _run_check(check, ir)
    checks += 1
    if not ok:
        return BisectReport([], 0, msg, checks)

    # Expand the pipeline into its applications, stopping at a pass that breaks outright.
    applications: list[Pass] = []
    broke_at: int | None = None
    for _ in range(max_iterations if fixed_point else 1):
        changed = False
        for p in passes:
            applications.append(p)
            good, why, did = _apply(ir, p, lint)
            if not good:
                broke_at, msg = len(applications), why
                break
            changed |= did
        if broke_at or not fixed_point or not changed:
            break
    names = [p.name for p in applications]
    if broke_at is None:
        ok, msg = _run_check(check, ir)
        checks += 1
        if ok:
            return BisectReport(names, None, "", checks)

    def prefix(k: int) -> tuple[Any, bool, str]:
        fresh = ir_factory()
        for p in applications[:k]:
            good, why, _ = _apply(fresh, p, lint)
            if not good:
                return fresh, False, why
        return fresh, True, ""

    # Invariant: the check passes after `lo` applications and fails after `hi` (with message msg).
    lo, hi = 0, broke_at or len(applications)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fresh, good, why = prefix(mid)
        if good:
            good, why = _run_check(check, fresh)
            checks += 1
        if good:
            lo = mid
        else:
            hi, msg = mid, why
    before, _, _ = prefix(hi - 1)
    before_text = before.text()
    _apply(before, applications[hi - 1], lint)
    try:
        after_text = before.text()
    except Exception as exc:  # a broken pass may leave nodes without metadata
        after_text = f"(IR text unavailable: {type(exc).__name__}: {exc})\n"
    return BisectReport(names, hi, msg, checks, before_text, after_text)


def outputs_match(inputs: tuple, expected: Any, *, atol: float = 0.0) -> Callable[[Any], tuple[bool, str]]:
    """A check for :func:`bisect` / tests: run the IR on ``inputs`` (caches zeroed first) and
    compare with ``expected`` exactly (``atol=0``) or within ``atol``."""

    def check(ir) -> tuple[bool, str]:
        ir.reset_caches()
        with torch.no_grad():
            got = ir(*inputs)
        exp = expected if isinstance(expected, (tuple, list)) else (expected,)
        out = got if isinstance(got, (tuple, list)) else (got,)
        for i, (g, e) in enumerate(zip(out, exp)):
            if g.shape != e.shape:
                return False, f"output {i}: shape {tuple(g.shape)} != expected {tuple(e.shape)}"
            diff = (g.float() - e.float()).abs().max().item() if g.numel() else 0.0
            if diff > atol:
                return False, f"output {i}: max |diff| {diff:.3g} > {atol}"
        return True, ""

    return check
