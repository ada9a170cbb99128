"""`specc methods`: the registered speculation methods (built-in and plugins)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("methods", help="list speculation methods",
                       description="List the speculation methods specc can compile (built-in and registered "
                                   "through the specc.methods entry-point group), with the drafters each accepts.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def _rows():
    from specc.methods import available_methods

    for name, m in available_methods().items():
        yield {"name": name, "drafter_kinds": list(m.drafter_kinds), "default_for": list(m.default_for),
               "k_choices": list(m.k_choices), "description": m.description}


def run(args) -> int:
    import json

    rows = list(_rows())
    if args.json:
        print(json.dumps({"methods": rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Speculation methods")
    for col in ("name", "drafter checkpoints", "default for", "description"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["name"], ", ".join(r["drafter_kinds"]) or "(none)", ", ".join(r["default_for"]) or "-",
                      r["description"])
    Console().print(table)
    return 0
