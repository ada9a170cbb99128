"""One IR node as text and JSON pieces (what ``IR.text`` / ``IR.to_dict`` and the printer show)."""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

from specc.ir.meta import TensorMeta, dtype_name, value_str
from specc.ir.rules import STRUCTURAL_KINDS
from specc.ir.symbols import fmt_expr


def _target_name(node: torch.fx.Node) -> str:
    if node.op in ("call_function",):
        mod = getattr(node.target, "__module__", "") or ""
        name = getattr(node.target, "__qualname__", None) or getattr(node.target, "__name__", str(node.target))
        return f"{mod}.{name}" if mod and mod not in ("_operator", "builtins") else name
    return str(node.target)


def _arg_str(a: Any) -> str:
    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_str(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    if isinstance(a, slice):
        parts = ["" if v is None else _arg_str(v) for v in (a.start, a.stop)]
        return ":".join(parts) + ("" if a.step is None else f":{_arg_str(a.step)}")
    if a is Ellipsis:
        return "..."
    return repr(a)


def _json_value(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, sympy.Basic):
        return int(v) if v.is_Integer else (float(v) if v.is_number else fmt_expr(v))
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return str(v)


def _out_json(out: Any) -> Any:
    if isinstance(out, TensorMeta):
        d = {"shape": [str(x) for x in out.shape], "dtype": dtype_name(out.dtype)}
        if out.value is not None:
            d["value"] = str(out.value)
        return d
    if isinstance(out, (tuple, list)):
        return [_out_json(o) for o in out]
    return _json_value(out)


def node_line(ir, node: torch.fx.Node) -> str:
    """(``ir``: the ``specc.ir.IR`` holding ``node``) ``%name = kind target(args) : out  | costs`` (formulas), one line."""
    m = ir.meta(node)
    if node.op == "placeholder":
        head = f"%{node.name} = input"
    elif node.op == "get_attr":
        head = f"%{node.name} = {m.kind} {node.target}"
    elif node.op == "output":
        return f"return {_arg_str(node.args[0])} : {value_str(m.out)}"
    else:
        args = ", ".join([_arg_str(a) for a in node.args] + [f"{k}={_arg_str(v)}" for k, v in node.kwargs.items()])
        target = node.target if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))
        head = f"%{node.name} = {m.kind}" + (f"[{target}]" if target != m.kind else "") + f"({args})"
    line = f"{head} : {value_str(m.out)}"
    if m.group:
        line += f"  #{m.group}"
    if m.kind not in STRUCTURAL_KINDS:
        costs = [f"read={fmt_expr(m.bytes_read)}", f"write={fmt_expr(m.bytes_written)}", f"flops={fmt_expr(m.flops)}"]
        if m.weights:
            costs.append("weights=" + ",".join(m.weights))
        line += "  | " + " ".join(costs)
    return line


