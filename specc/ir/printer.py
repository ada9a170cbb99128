"""Human-readable rendering of an IR with rich: one row per node, then per-step totals.

Per-node costs are shown evaluated at the chosen B, Q, C (N) (``formulas=True`` adds the
formula); totals are shown both as formulas and evaluated, because the formula is what the cost
model uses and the number is what a newcomer can sanity-check (e.g. ~15.1 GB of weights per
Qwen3-8B step).
"""

from __future__ import annotations

import collections
from typing import Any, Mapping

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specc.ir.ir import IR
from specc.ir.meta import dtype_name, value_str
from specc.ir.rules import STRUCTURAL_KINDS
from specc.ir.symbols import evaluate, fmt_bytes, fmt_expr, fmt_flops, fmt_shape

KIND_STYLE = {
    "linear": "bold cyan", "norm_linear": "bold cyan", "linear_add": "bold cyan", "attention": "bold magenta", "embedding": "cyan",
    "rms_norm": "green", "rope": "yellow", "rope_tables": "yellow", "silu_mul": "green", "input": "bold",
    "output": "bold",
}


def _out_text(out: Any) -> str:
    from specc.ir.meta import TensorMeta

    if isinstance(out, TensorMeta):
        return f"{fmt_shape(out.shape)} {dtype_name(out.dtype)}"
    return value_str(out)


def values_line(ir: IR, values: Mapping) -> str:
    return ", ".join(f"{s}={int(v)}" for s, v in ir.values(values).items())


def node_table(ir: IR, values: Mapping | None = None, *, brief: bool = False, formulas: bool = False) -> Table:
    vals = ir.values(values)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_lines=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("node", overflow="fold")
    table.add_column("kind", overflow="fold")
    table.add_column("output", overflow="fold")
    table.add_column("read", justify="right")
    table.add_column("written", justify="right")
    table.add_column("FLOPs", justify="right")
    table.add_column("weights read", overflow="fold")
    for i, node in enumerate(ir.gm.graph.nodes):
        m = ir.meta(node)
        structural = m.kind in STRUCTURAL_KINDS
        if brief and structural and m.kind not in ("input", "output"):
            continue
        kind = m.kind + (f" [{m.group}]" if m.group else "")
        if structural:
            cells = ["", "", ""]
        else:
            cells = []
            for expr, fmt in ((m.bytes_read, fmt_bytes), (m.bytes_written, fmt_bytes), (m.flops, fmt_flops)):
                v = evaluate(expr, vals)
                text = fmt(v) if isinstance(v, (int, float)) else fmt_expr(v)
                if formulas:
                    text += f"\n= {fmt_expr(expr)}"
                cells.append(text)
        extra = ", ".join(m.weights)
        style = "dim" if structural and m.kind not in ("input", "output") else KIND_STYLE.get(m.kind, "")
        table.add_row(str(i), Text(node.name, style=style), Text(kind, style=style), _out_text(m.out), *cells,
                      Text(extra, style="dim"))
    return table


def totals_table(ir: IR, values: Mapping | None = None) -> Table:
    vals = ir.values(values)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=None)
    table.add_column("per step", style="bold")
    table.add_column("formula", overflow="fold")
    table.add_column(f"at {values_line(ir, values) or 'no symbols'}", justify="right")
    t = ir.totals()
    for key, label, expr in t.items():
        v = evaluate(expr, vals)
        fmt = fmt_flops if key == "flops" else fmt_bytes
        table.add_row(label, fmt_expr(expr), fmt(v) if isinstance(v, (int, float)) else fmt_expr(v))
    total_bytes = evaluate(t.bytes, vals)
    flops = evaluate(t.flops, vals)
    if isinstance(total_bytes, (int, float)) and total_bytes:
        table.add_row("FLOPs per byte", "", f"{flops / total_bytes:.2f}")
    return table


def kind_summary(ir: IR) -> str:
    counts = collections.Counter(ir.meta(n).kind for n in ir.gm.graph.nodes)
    main = [(k, c) for k, c in counts.items() if k not in STRUCTURAL_KINDS]
    main.sort(key=lambda kc: -kc[1])
    return ", ".join(f"{c} {k}" for k, c in main) + f"; {sum(counts.values())} nodes in all"


def make_console(file=None) -> Console:
    """A console at least 160 columns wide: IR tables are wide, and piped output defaults to 80."""
    probe = Console(file=file)
    return Console(file=file, width=max(probe.width, 160) if not probe.is_terminal else max(probe.width, 120))


def render(ir: IR, values: Mapping | None = None, *, console: Console | None = None, brief: bool = False,
           formulas: bool = False, show_nodes: bool = True) -> None:
    """Print the node table and totals of ``ir`` to ``console`` (stdout by default)."""
    console = console or make_console()
    console.print(Text(f"specc IR: {ir.header()}", style="bold"))
    for spec in ir.inputs:
        extra = f" = {spec.meta.value}" if spec.meta.value is not None else ""
        console.print(Text(f"  input {spec.name}: {fmt_shape(spec.meta.shape)} {dtype_name(spec.meta.dtype)}{extra}  ({spec.doc})"))
    if show_nodes:
        console.print(node_table(ir, values, brief=brief, formulas=formulas))
    console.print(Text(f"ops: {kind_summary(ir)}", style="dim"))
    if show_nodes:
        console.print(Text(f"per-node costs evaluated at {values_line(ir, values) or '-'}", style="dim"))
    console.print(totals_table(ir, values))
