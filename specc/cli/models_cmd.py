"""`specc models`: the supported architectures and the embedded zoo."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("models", help="list supported architectures and embedded models",
                       description="List the architectures specc can load and the models shipped with it.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json

    from specc.models.loading import zoo_names
    from specc.models.registry import ARCHITECTURES

    if args.json:
        print(json.dumps({"architectures": {k: {"role": r, "detected_by": d, "description": t}
                                            for k, (r, d, t) in ARCHITECTURES.items()},
                          "zoo": zoo_names()}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Supported architectures")
    for col in ("name", "role", "detected by", "notes"):
        table.add_column(col)
    for name, (role, detected, notes) in ARCHITECTURES.items():
        table.add_row(name, role, detected, notes)
    console = Console()
    console.print(table)
    zoo = zoo_names()
    console.print("Embedded models: " + (", ".join(zoo) if zoo else "(none)"))
    return 0
