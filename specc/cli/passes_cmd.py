"""`specc passes`: every registered IR pass with its one-line doc and ordering constraints."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("passes", help="list the IR passes (built-in and plugins)",
                       description="List every registered IR pass: built-in ones, and plugins installed under the "
                                   "'specc.passes' entry-point group. Use them with `specc ir --after PASS,...`; "
                                   "a user's pass not installed as a plugin is given as +module:Class.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specc.passes import available_passes, load_plugins

    passes = available_passes()
    errors = load_plugins()
    if args.json:
        json.dump({"passes": [{"name": i.name, "doc": i.doc, "after": list(i.after), "before": list(i.before),
                               "origin": i.origin} for i in passes.values()], "plugin_errors": errors},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table
    from rich.text import Text

    from specc.ir.printer import make_console

    table = Table(title="IR passes")
    for col in ("name", "what it does", "ordering", "from"):
        table.add_column(col, overflow="fold")
    for info in passes.values():
        order = "; ".join(x for x in (("after " + ", ".join(info.after)) if info.after else "",
                                      ("before " + ", ".join(info.before)) if info.before else "") if x)
        table.add_row(Text(info.name, style="bold"), Text(info.doc), Text(order), Text(info.origin))
    console = make_console()
    console.print(table)
    console.print(Text("use: specc ir MODEL --step ar --after fuse_qkv,fuse_gate_up,fuse_norm_linear,dce --check"
                       "   (+module:Class adds a pass of your own)", style="dim"))
    for err in errors:
        console.print(Text(f"warning: plugin failed to load: {err}", style="yellow"))
    return 0
