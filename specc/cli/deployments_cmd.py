"""`specc deployments`: the built-in deployment profiles."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("deployments", help="list deployment profiles (GPU x batch size)",
                       description="List built-in deployments, or show one (a name or a .toml/.json file).")
    p.add_argument("name", nargs="?", help="show this deployment's fields")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json

    from specc.search.deployments import BUILTIN, get_deployment

    deps = [get_deployment(args.name)] if args.name else list(BUILTIN.values())
    if args.json:
        print(json.dumps([d.to_json() for d in deps], indent=2 if args.name else None))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Deployments")
    for col in ("name", "gpu", "batch", "dtype", "HBM TB/s", "bf16 TFLOP/s", "SMs", "launch us", "link GB/s", "calibrated"):
        table.add_column(col)
    for d in deps:
        table.add_row(d.name, d.gpu, str(d.batch_size), d.dtype, f"{d.hbm_bandwidth / 1e12:.2f}",
                      f"{d.bf16_flops / 1e12:.0f}", str(d.sm_count), f"{d.launch_overhead_s * 1e6:.1f}",
                      f"{d.link_bandwidth / 1e9:.0f}" if d.link_bandwidth else "-", "yes" if d.calibrated else "no")
    Console().print(table)
    return 0
