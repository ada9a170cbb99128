"""Errors raised by the IR. Messages name the node (``%name``) so a failing pass is easy to find."""

from __future__ import annotations


class IRError(Exception):
    """Something about an IR is wrong or unsupported."""


class ShapeError(IRError):
    """An op rule found inputs that do not fit together (shapes, dtypes, missing facts)."""


class LintError(IRError):
    """``IR.lint()`` found problems; ``problems`` lists each one (node name first)."""

    def __init__(self, problems: list[str], title: str = "IR lint failed"):
        self.problems = list(problems)
        shown = self.problems[:12]
        more = len(self.problems) - len(shown)
        text = f"{title}: {len(self.problems)} problem(s)\n  " + "\n  ".join(shown)
        if more:
            text += f"\n  ... and {more} more"
        super().__init__(text)
