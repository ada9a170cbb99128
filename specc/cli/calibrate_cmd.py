"""`specc calibrate`: microbenchmarks -> a calibrated deployment file the cost model uses."""

from __future__ import annotations

import argparse
import json
import sys

from specc.errors import UserError
from specc.methods import method_names

EPILOG = """\
examples:
  specc calibrate --deployment h200-bs1 -o h200-bs1.json          # on the GPU (CUDA events, graphs)
  specc calibrate --deployment cpu -o cpu.json --device cpu --quick
  specc calibrate --deployment h200-bs1 --model specc-tiny --drafter specc-tiny-dflash -o h200-tiny.json
                                                                 # + the pair's own linear and attention shapes
  specc cost Qwen3-8B/config.json --deployment h200-bs1.json     # predictions with the calibration
"""


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="measure bandwidth, matmul, attention and launch costs into a deployment file",
        description="Run microbenchmarks (copy bandwidth; linear by M and shape with torch and specc's Triton linear "
                    "on CUDA; attention by Q and C; kernel launch and CUDA-graph replay overhead; a square matmul) "
                    "and write the base deployment with fitted efficiency factors (calibrated = true) to FILE, plus "
                    "the measurements, per-kind efficiencies and (on CUDA) the per-shape choice of Triton or cuBLAS "
                    "for each linear to FILE-stem.calibration.json beside it; `specc compile --deployment FILE` "
                    "lowers each linear to the faster one.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", required=True, metavar="NAME", help="base deployment (`specc deployments`) or file")
    p.add_argument("-o", "--out", required=True, metavar="FILE", help="calibrated deployment file to write (.json)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="device to measure (default: the deployment's)")
    p.add_argument("--quick", action="store_true", help="fewer, smaller measurements")
    p.add_argument("--model", metavar="MODEL",
                   help="also time this target's own linear shapes and attention heads (config.json, checkpoint, "
                        "zoo name, hub id, or a `specc bench --shapes` name): for models far from the reference "
                        "size (Qwen3-8B on CUDA), whose small kernels the reference efficiencies misprice")
    p.add_argument("--drafter", metavar="D", help="with --model: its drafter's shapes too")
    p.add_argument("--method", choices=method_names(), help="with --drafter: the method (default: the drafter's)")
    p.add_argument("--json", action="store_true", help="print the calibration record as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specc.search.calibrate import calibrate, write_calibration
    from specc.search.deployments import get_deployment

    base = get_deployment(args.deployment)
    device = args.device or base.device
    if device != base.device:
        print(f"specc: warning: measuring on {device} for a {base.device} deployment ({base.name}); the figures "
              f"describe {device}", file=sys.stderr)
    from specc.cli.progress import Progress

    # microbenchmarks default to 1 thread (specc.search.calibrate); --threads / SPECC_THREADS override
    threads = args.threads if getattr(args, "threads_given", False) else None
    if not args.model and (args.drafter or args.method):
        raise UserError("--drafter and --method describe the --model to calibrate for: give --model too")
    models = []
    with Progress.for_args(args) as progress:
        if args.model:
            from specc.search.model_shapes import model_shapes

            label = " + ".join(r for r in (args.model, args.drafter) if r)
            progress(f"tracing {label} for its shapes")
            models.append(model_shapes(_target(args.model), args.drafter, method=args.method, dtype=base.dtype,
                                       label=label))
        dep, record = calibrate(base, device=device, quick=args.quick, progress=progress, threads=threads,
                                models=models)
    path, rec = write_calibration(args.out, dep, record)
    if args.json:
        json.dump(record.to_json(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    threads = record.measurements.get("threads")
    table = Table(title=f"calibration of {base.name} on {record.device_name}"
                        + (f" ({threads} thread{'s' if threads != 1 else ''})" if threads else "")
                        + (f", with the shapes of {', '.join(record.models)}" if record.models else ""))
    for col in ("field", "before", "after"):
        table.add_column(col)
    for field in ("hbm_bandwidth", "bf16_flops", "bandwidth_efficiency", "flops_efficiency", "launch_overhead_s",
                  "graph_node_overhead_s"):
        table.add_row(field, f"{getattr(base, field):.4g}", f"{getattr(dep, field):.4g}")
    kinds = list(record.kind_efficiency.items())
    kinds += [(f"attention at {layout} heads", effs) for layout, effs in record.attention_by_heads.items()]
    for kind, effs in kinds:
        for what, value in effs.items():
            if what.endswith("_s"):  # a time (latency_s, merge_slot_s, kernel_latency_s), not a fraction
                table.add_row(f"{kind} {what[:-2].replace('_', ' ')}", "-", f"{value * 1e6:.3g} us")
            else:
                table.add_row(f"{kind} {what} efficiency", "-", f"{value:.4g}")
    for m, eff in record.linear_flops_by_m.items():
        table.add_row(f"linear flops efficiency at M={m}", "-", f"{eff:.4g}")
    console = Console()
    console.print(table)
    for note in record.notes:  # peaks raised to what was measured, efficiencies clamped at 1
        console.print(f"note: {note}", highlight=False)
    if threads:
        console.print(f"predictions with {path} describe steps run with {threads} CPU thread"
                      f"{'s' if threads != 1 else ''} (--threads / SPECC_THREADS)", highlight=False)
    choice = record.choice_table()
    if choice is not None:
        console.print(f"linear implementations (cuBLAS where it measured > {choice.margin:.0%} faster than Triton):",
                      highlight=False)
        for line in choice.summary():
            console.print(f"  {line}", highlight=False)
    console.print(f"wrote {path} and {rec}", highlight=False)
    return 0


def _target(ref: str) -> dict:
    """``--model``'s config.json: what ``read_config`` resolves, else a `specc bench --shapes`
    name's (real shapes without a checkpoint: ``qwen3-8b``, ``llama-3.1-8b``)."""
    from specc.ir.trace import read_user_config

    try:
        return read_user_config(ref)
    except UserError:
        from specc.bench.shapes import target_config, target_names

        if ref in target_names():
            return target_config(ref)
        raise

