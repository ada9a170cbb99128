"""The pass interface.

A pass is a class with a ``name``, a one-line ``doc`` and three methods:

- ``requires(ir) -> bool | str``: can the pass run on this IR? False or a reason string skips it
  (the pass manager records the reason); the default is True.
- ``run(ir, ctx) -> PassResult``: rewrite ``ir`` in place; say whether anything changed and give
  counts in ``stats`` (tests assert on them to prove the pass fired). After rewriting, call
  ``ir.refresh()`` so metadata is derived again for the new nodes.
- ``ensures(ir) -> bool | str``: the postcondition, checked (with ``ir.lint()``) after every run
  when checking is on; False or a message fails the pipeline.

Ordering constraints are class attributes: ``after = ("fuse_qkv",)`` means "if fuse_qkv is in
the same pipeline, run me after it"; ``before`` is the converse. Register a pass with
``@specc.passes.register_pass`` (or the ``specc.passes`` entry-point group for plugins).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from specc.ir import IR


class PassError(Exception):
    """A pass failed, broke an invariant or its postcondition. ``pass_name`` says which."""

    def __init__(self, message: str, pass_name: str | None = None):
        super().__init__(message)
        self.pass_name = pass_name


@dataclasses.dataclass
class PassResult:
    """What ``Pass.run`` returns: whether the IR changed, and counts of what was done."""

    changed: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PassContext:
    """Shared state for one pipeline run.

    check:   lint after every pass (and verify ``ensures``).
    options: free-form per-pipeline options (``{"fuse_qkv.min_group": 3}``); passes read theirs.
    notes:   messages passes want shown to the user (``ctx.note(...)``).
    """

    check: bool = True
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class Pass:
    """Base class of IR passes (see the module docstring for the contract)."""

    name: ClassVar[str] = ""
    doc: ClassVar[str] = ""
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = _snake(cls.__name__)
        if not cls.__dict__.get("doc"):
            cls.doc = ((cls.__doc__ or "").strip().splitlines() or [""])[0]

    def requires(self, ir: "IR") -> bool | str:
        return True

    def run(self, ir: "IR", ctx: PassContext) -> PassResult:
        raise NotImplementedError(f"pass {self.name} does not implement run()")

    def ensures(self, ir: "IR") -> bool | str | None:
        return True

    def __repr__(self) -> str:
        return f"<pass {self.name}>"
