"""`specc deployments`: the built-in deployment profiles.

Names are never truncated: on a terminal the table keeps the name column whole (other columns
fold), and when stdout is not a terminal it prints plain whitespace-separated columns, one
deployment per line, that scripts can read (`specc deployments | awk '{print $1}'`).
`specc deployments NAME` prints every field of one deployment.
"""

from __future__ import annotations

import sys

COLUMNS = ("name", "gpu", "batch", "dtype", "HBM", "peak", "SMs", "launch us", "link", "calibrated")


def register(sub) -> None:
    p = sub.add_parser("deployments", help="list deployment profiles (GPU x batch size)",
                       description="List built-in deployments, or show every field of one (a name or a "
                       ".toml/.json file).")
    p.add_argument("name", nargs="?", help="show this deployment's fields")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def _row(d) -> list[str]:
    from specc.ir import fmt_rate

    return [d.name, d.gpu, str(d.batch_size), d.dtype, fmt_rate(d.hbm_bandwidth, "B"), fmt_rate(d.bf16_flops, "FLOP"),
            str(d.sm_count), f"{d.launch_overhead_s * 1e6:.1f}",
            fmt_rate(d.link_bandwidth, "B") if d.link_bandwidth else "-", "yes" if d.calibrated else "no"]


def _plain(rows: list[list[str]]) -> str:
    """Aligned columns separated by two spaces; cells with spaces (GPU names) stay one column
    because no cell holds two consecutive spaces."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run(args) -> int:
    import json

    from specc.search.deployments import BUILTIN, get_deployment

    if args.name:
        dep = get_deployment(args.name)
        if args.json:
            print(json.dumps(dep.to_json(), indent=2))
            return 0
        fields = dep.to_json()
        if not sys.stdout.isatty():
            print(_plain([[k, json.dumps(v) if not isinstance(v, str) else v] for k, v in fields.items()]))
            return 0
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"Deployment {dep.name}")
        table.add_column("field", no_wrap=True)
        table.add_column("value", overflow="fold")
        for k, v in fields.items():
            table.add_row(k, v if isinstance(v, str) else json.dumps(v))
        Console().print(table)
        return 0
    deps = list(BUILTIN.values())
    if args.json:
        print(json.dumps([d.to_json() for d in deps]))
        return 0
    rows = [_row(d) for d in deps]
    plain = _plain([list(COLUMNS)] + rows)
    from rich.console import Console

    console = Console()
    # A table needs ~3 columns of border per cell; a terminal narrower than that gets the plain
    # columns (the terminal wraps long lines; nothing is cut).
    if not sys.stdout.isatty() or console.width < max(map(len, plain.splitlines())) + 3 * len(COLUMNS) + 1:
        print(plain)
        return 0
    from rich.table import Table

    table = Table(title="Deployments")
    for col in COLUMNS:
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(*r)
    console.print(table)
    print("`specc deployments NAME` shows every field of one deployment.")
    return 0
