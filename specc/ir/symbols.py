"""The symbolic dimensions of step functions, and helpers to evaluate and print expressions.

Every shape, byte count and FLOP count in the IR is a sympy expression in these symbols, so one
trace serves every batch size and context length: the cost model substitutes a deployment's
values, the search differentiates sizes without retracing.

- ``B``: batch rows.
- ``Q``: new tokens per row in this step (prompt length for prefill, 1 for AR, k + 1 for chain
  verification, block size for DFlash, committed + mask tokens for PARD).
- ``C``: tokens already in this model's KV cache (per row; rows are padded to the same C).
- ``N``: DFlash only: target tokens whose hidden states are injected as context this step
  (their K/V are written to the drafter's cache before the block's).
- ``T``, ``R``: ragged (packed) verify steps only: T tokens of R rows back to back in one token
  axis, each row with its own token count (T / R on average) and cache length (C on average).
"""

from __future__ import annotations

from typing import Any, Mapping

import sympy

B = sympy.Symbol("B", integer=True, positive=True)
Q = sympy.Symbol("Q", integer=True, positive=True)
C = sympy.Symbol("C", integer=True, nonnegative=True)
N = sympy.Symbol("N", integer=True, positive=True)
T = sympy.Symbol("T", integer=True, positive=True)
R = sympy.Symbol("R", integer=True, positive=True)

SYMBOLS = {"B": B, "Q": Q, "C": C, "N": N, "T": T, "R": R}
SYMBOL_DOC = {
    "B": "batch rows",
    "Q": "new tokens per row",
    "C": "tokens already in the KV cache",
    "N": "target tokens injected as DFlash context",
    "T": "packed tokens of a ragged step (all rows)",
    "R": "rows of a ragged step",
}

Expr = sympy.Expr
ZERO = sympy.Integer(0)


def sym(value: Any) -> sympy.Expr:
    """A sympy expression for an int, a sympy expression or a symbol name."""
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, bool):
        raise TypeError("bool is not a dimension")
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, str) and value in SYMBOLS:
        return SYMBOLS[value]
    raise TypeError(f"not a dimension: {value!r}")


def same(a: Any, b: Any) -> bool:
    """Symbolic equality of two dimensions/expressions (polynomial identity)."""
    try:
        return sympy.expand(sym(a) - sym(b)) == 0
    except TypeError:
        return a == b


def bind(values: Mapping[Any, int] | None) -> dict[sympy.Symbol, sympy.Integer]:
    """Normalise {'B': 1, Q: 4, ...} to a substitution dict keyed by symbols."""
    out: dict[sympy.Symbol, sympy.Integer] = {}
    for key, value in (values or {}).items():
        s = SYMBOLS[key] if isinstance(key, str) else key
        out[s] = sympy.Integer(int(value))
    return out


def evaluate(expr: Any, values: Mapping[Any, int] | None = None):
    """Substitute symbol values; returns an int when every symbol is bound, else the expression."""
    e = sym(expr) if not isinstance(expr, sympy.Basic) else expr
    e = e.xreplace(bind(values))
    if e.is_Integer:
        return int(e)
    if e.is_number:
        return float(e)
    return e


def fmt_expr(expr: Any) -> str:
    """Compact text of an expression: expanded polynomial, highest-order terms first."""
    e = sympy.expand(sym(expr)) if not isinstance(expr, (int,)) else sympy.Integer(expr)
    return sympy.sstr(e, order="grlex").replace("**", "^")


def fmt_shape(shape) -> str:
    return "[" + ", ".join(sympy.sstr(d) for d in shape) + "]"


_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def _prefixed(n: float) -> tuple[float, str]:
    """(n / scale, decimal prefix) for the largest prefix not above ``|n|`` (T at most)."""
    for prefix, scale in _PREFIXES:
        if abs(n) >= scale:
            return n / scale, prefix
    return n, ""


def fmt_bytes(n: float | int) -> str:
    """Decimal units (GB = 1e9 bytes), as bandwidth figures are quoted."""
    value, prefix = _prefixed(float(n))
    return f"{value:.2f} {prefix}B" if prefix else f"{int(n)} B"


def fmt_flops(n: float | int) -> str:
    value, prefix = _prefixed(float(n))
    return f"{value:.2f} {prefix}FLOP" if prefix else f"{int(n)} FLOP"


def fmt_rate(per_second: float, unit: str) -> str:
    """A rate in the decimal prefix that fits its magnitude, to three significant digits:
    ``fmt_rate(4.8e12, "B")`` is "4.80 TB/s", ``fmt_rate(50e9, "B")`` "50.0 GB/s",
    ``fmt_rate(200e9, "FLOP")`` "200 GFLOP/s" (past 999 T the figure grows: "1980 TFLOP/s")."""
    value, prefix = _prefixed(float(f"{float(per_second):.3g}"))  # round first: 999.6e9 is 1.00 T
    digits = 0 if value == 0 or abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {prefix}{unit}/s"
