"""Linears at M = 1 ... 2048 (Triton vs cuBLAS) and whole verify steps with the linear choice on and
off, in one GPU run (issue #21: where batched verification spends its time).

1. ``specc calibrate`` of the deployment, in this run (specc.search.calibrate.calibrate): it times
   specc's Triton linear and torch's ``F.linear`` (cuBLAS) at the Qwen3-8B linear shapes for
   M = 1, 2, 4, ..., 2048 (CUDA-event-timed graph replays, warm-up excluded, median, weights
   rotated past L2) and writes the per-shape choice (``specc.codegen.linear_choice``). One JSON
   line per (shape, M): both times, TFLOP/s and TB/s of each, fractions of the bf16 peak and of
   HBM, the winner and the choice (cuBLAS only when faster by more than the margin).
   References: bf16 peak 767 TFLOP/s (8192^3 matmul measured on this H200, DESIGN.md), HBM
   4.8 TB/s nominal (measured here: 4.26 TB/s device-to-device copy, DESIGN.md; 4.22-4.24 TB/s
   streaming read, docs/benchmarks/steps-h200.md and architecture-h200.md); the in-run copy
   bandwidth and square-matmul rate are printed beside them.
2. A Qwen3-8B-shaped target (random bf16 weights; timings do not depend on values), default pass
   pipeline, traced once and emitted twice: Triton linears everywhere ("off") and with the
   calibrated choice ("on"). Compiled step times (CUDA graphs, events, median) for AR (Q = 1) and
   verify Q = 4, 8, 16 at B = 8, 16, 32, context 1024, each beside the cost model's prediction
   from the same calibration (off: priced with Triton's measured times, on: with the choice's),
   and the issue's goals: verify(B=16, Q=16) / AR(B=16) <= 1.6, verify(B=32, Q=16) / AR(B=32) <= 2.5.
3. ``--forcing``: bf16 token forcing of Qwen3-8B + DFlash-b16 shapes against HF stock with cuBLAS
   forced for every multi-row linear of the calibrated shapes (examples/bench_steps.forcing_case).

    PYTHONPATH=. python3 examples/bench_linears.py --out $OUT/linears.json              # ~3-4 min
    PYTHONPATH=. python3 examples/bench_linears.py --forcing --out $OUT/linears.json    # + forcing
    PYTHONPATH=. python3 examples/bench_linears.py --device cpu --tiny --out l.json      # CPU smoke

On CPU (smoke) only torch's linear is timed (the Triton kernels are what CUDA runs), so the "on"
steps use a forced choice (cuBLAS from 2 rows up) instead of a measured one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time

import torch

from examples.bench_cost_model import QWEN3_8B, TINY, build_target, parse_ints

PEAK_BF16 = 767e12  # measured: bf16 8192^3 matmul on the H200 (DESIGN.md)
HBM_NOMINAL = 4.8e12  # H200 datasheet; measured copy 4.26 TB/s, streaming read 4.22-4.24 TB/s
SHAPE_NAMES = {(6144, 4096): "qkv", (4096, 4096): "o", (24576, 4096): "gate_up", (4096, 12288): "down",
               (151936, 4096): "lm_head"}


def linear_lines(record, table) -> list[dict]:
    """One row per (shape, M) timed by both implementations in the calibration's measurements."""
    by_key: dict[tuple, dict] = {}
    for r in record.measurements.get("linear", []):
        by_key.setdefault((r["N"], r["K"], r["M"]), {})[r["impl"]] = r
    out = []
    for (n, k, m), impls in sorted(by_key.items()):
        row = {"M": m, "N": n, "K": k, "shape": SHAPE_NAMES.get((n, k), f"{n}x{k}")}
        for impl, label in (("specc", "triton"), ("torch", "cublas")):
            r = impls.get(impl)
            if r is None:
                continue
            row[f"{label}_ms"] = r["seconds"] * 1e3
            row[f"{label}_tflops"] = r["flops"] / r["seconds"] / 1e12
            row[f"{label}_tbps"] = r["bytes"] / r["seconds"] / 1e12
            row[f"{label}_peak_frac"] = r["flops"] / r["seconds"] / PEAK_BF16
            row[f"{label}_hbm_frac"] = r["bytes"] / r["seconds"] / HBM_NOMINAL
        if "triton_ms" in row and "cublas_ms" in row:
            row["winner"] = "cublas" if row["cublas_ms"] < row["triton_ms"] else "triton"
            row["cublas_speedup"] = row["triton_ms"] / row["cublas_ms"]
        if table is not None:
            row["chosen"] = table.impl_at(m, n, k)
        out.append(row)
    return out


def linear_shapes(ir) -> list[tuple[int, int]]:
    from specc.codegen.linear_choice import KINDS

    shapes = set()
    for node in ir.graph.nodes:
        if node.op == "call_function" and ir.meta(node).kind in KINDS:
            attrs = ir.meta(node).attrs
            shapes.add((int(attrs["out_features"]), int(attrs["in_features"])))
    return sorted(shapes)


class Bs1AttentionPlan:
    """A step whose attention calls plan with the bs1 rule at every batch (the rule before the
    batched sweep): ``--bs1-attention-plan`` times it beside the default in the same run. A CUDA
    graph freezes the plan it captured, so the rule is switched around every call, capture too."""

    def __init__(self, step):
        self.step = step

    def setup_caches(self, *args, **kwargs):
        return self.step.setup_caches(*args, **kwargs)

    def __call__(self, *args):
        from specc.codegen.kernels.attention import bs1_plan_rule

        with bs1_plan_rule():
            return self.step(*args)


def time_steps(steps: dict, model_for: dict, ir, cfg, dev, batches, qs, context, reps) -> list[dict]:
    """Median step times of each variant at every (B, Q), beside its prediction."""
    from specc.codegen.kernels.attention import bs1_plan_rule
    from specc.search.calibrate import Timer

    timer = Timer(dev.type, reps=reps)
    rows = []
    for b in batches:
        for label, step in steps.items():
            step.setup_caches(b, context + max(qs) + 8)
            for q in qs:
                ids = torch.randint(0, cfg["vocab_size"], (b, q), device=dev)
                pos = torch.arange(context, context + q, device=dev)[None].expand(b, -1).contiguous()
                lens = torch.full((b,), context, dtype=torch.long, device=dev)
                with torch.inference_mode():
                    measured = timer(lambda: step(ids, pos, lens))
                with bs1_plan_rule() if isinstance(step, Bs1AttentionPlan) else contextlib.nullcontext():
                    pred = model_for[label].step(ir, {"B": b, "Q": q, "C": context}, sync=False)
                row = {"B": b, "Q": q, "C": context, "linear_choice": label, "measured_ms": measured * 1e3,
                       "predicted_ms": pred.time * 1e3, "error": pred.time / measured - 1}
                rows.append(row)
                print(json.dumps({"step": row}), flush=True)
            step.setup_caches(1, 16)  # free the batch's caches before the next variant
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return rows


LINEAR_KERNELS = ("gemm", "gemv", "xmma", "cutlass", "nvjet", "cublas", "sm90_")


def kernel_category(name: str) -> str:
    """linear / attention / other, from a profiled kernel's name (Triton's or cuBLAS's)."""
    low = name.lower()
    if "attn" in low:
        return "attention"
    return "linear" if any(k in low for k in LINEAR_KERNELS) else "other"


def node_category(kind: str) -> str:
    return "attention" if "attention" in kind else "linear" if "linear" in kind else "other"


def profile_steps(step, model, ir, cfg, dev, points, context) -> list[dict]:
    """Where the cost model's error at large B x Q lies: per (B, Q), the profiled device time of
    the step's linears / attention / other kernels beside the cost model's time for the same
    nodes (launch overhead apart), and the idle time between kernels."""
    from examples.profile_step import kernel_profile

    out = []
    for b, q in points:
        step.setup_caches(b, context + q + 8)
        ids = torch.randint(0, cfg["vocab_size"], (b, q), device=dev)
        pos = torch.arange(context, context + q, device=dev)[None].expand(b, -1).contiguous()
        lens = torch.full((b,), context, dtype=torch.long, device=dev)
        prof = kernel_profile(step, (ids, pos, lens))
        measured: dict = {"linear": 0.0, "attention": 0.0, "other": 0.0}
        for k in prof["kernels"]:
            measured[kernel_category(k["kernel"])] += k["us_per_step"]
        pred = model.step(ir, {"B": b, "Q": q, "C": context}, sync=False)
        predicted: dict = {"linear": 0.0, "attention": 0.0, "other": 0.0}
        for n in pred.nodes:  # a node's time less its launches: work, fitted latency, kernel terms
            predicted[node_category(n.kind)] += (n.time - n.launches * model.overhead) * 1e6
        row = {"B": b, "Q": q, "measured_us": measured, "predicted_us": predicted,
               "predicted_launch_us": pred.launches * model.overhead * 1e6, "kernel_us": prof["kernel_us_per_step"],
               "span_us": prof["span_us_per_step"], "launches": prof["launches_per_step"],
               "top_kernels": prof["kernels"][:12]}
        out.append(row)
        print("[profile] B=%d Q=%d " % (b, q) + ", ".join(
            f"{c} {measured[c]:.0f} us (model {predicted[c]:.0f})" for c in measured)
            + f", span {row['span_us']:.0f} us, launches {row['launches']:.0f}", flush=True)
        step.setup_caches(1, 16)
        torch.cuda.empty_cache()
    return out


def goals(rows: list[dict]) -> dict:
    """The issue's ratios: verify(B, Q=16) / AR(B) per variant and batch."""
    t = {(r["linear_choice"], r["B"], r["Q"]): r["measured_ms"] for r in rows}
    out = {}
    for (label, b, q), ms in t.items():
        if q != 1 and (label, b, 1) in t:
            out[f"{label}: verify B={b} Q={q} / AR B={b}"] = ms / t[(label, b, 1)]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke run)")
    ap.add_argument("--deployment", default=None, help="base deployment (default: h200-bs16; cpu on CPU)")
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--qs", default="1,4,8,16", help="new tokens per step (1 = the AR step)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--forcing", action="store_true", help="also bf16 token forcing with cuBLAS forced (GPU)")
    ap.add_argument("--profile", default="16:16,32:8",
                    help="B:Q steps (choice on) to profile by kernel category against the cost model (CUDA only; '' none)")
    ap.add_argument("--bs1-attention-plan", action="store_true",
                    help="also time the choice-on steps with the attention kernel's bs1 plan rule at every batch "
                         "(variant 'on-bs1-attention', priced under the same rule)")
    ap.add_argument("--out", default="linears.json")
    args = ap.parse_args(argv)

    from specc.codegen.build import build_steps, emit_ir
    from specc.codegen.linear_choice import LinearChoice
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.search.calibrate import calibrate, write_calibration
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: use --device cpu --tiny")
    if dev.type == "cpu":
        torch.set_num_threads(1)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                    "shapes": "tiny qwen3" if args.tiny else "Qwen3-8B (random bf16 weights)",
                    "peak_bf16_reference": PEAK_BF16, "hbm_reference": HBM_NOMINAL}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        pass

    # 1. calibration: both linears at every shape and M, the choice table
    t0 = time.time()
    base = get_deployment(args.deployment or ("h200-bs16" if dev.type == "cuda" else "cpu"))
    dep, record = calibrate(base, device=args.device, quick=args.tiny,
                            progress=lambda m: print(f"[calibrate] {m}", flush=True))
    cal_path = args.out.rsplit(".", 1)[0] + ".deployment.json"
    write_calibration(cal_path, dep, record)
    result.update(calibration_seconds=round(time.time() - t0, 1), calibration_file=cal_path,
                  copy_bandwidth_Bps=record.measurements["copy"]["bandwidth"],
                  square_matmul_flops_per_s=record.measurements["square"]["flops_per_s"])
    table = record.choice_table()
    result["linears"] = linear_lines(record, table)
    for row in result["linears"]:
        print(json.dumps({"linear": row}), flush=True)
    print(f"[linears] in-run copy {result['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, square matmul "
          f"{result['square_matmul_flops_per_s'] / 1e12:.0f} TFLOP/s", flush=True)

    # 2. whole steps, one IR emitted with and without the choice
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = TINY if args.tiny else QWEN3_8B
    target = build_target(cfg, dtype, dev)
    target.setup_caches(1, 16)
    built = build_steps(target, None, DEFAULT_PIPELINE)
    ir = built.irs["target"]
    if table is None:  # CPU: nothing measured for Triton; force cuBLAS from 2 rows to exercise the path
        table = LinearChoice.forced(linear_shapes(ir), rows=(2, None), source="forced (no Triton timings on CPU)")
    result["linear_choice"] = table.to_json()
    for line in table.summary():
        print(f"[choice] {line}", flush=True)
    on_emitted, on_lowering = emit_ir(ir, "target", 0, table)
    result["lowering_on"] = on_lowering.get("linear_impl")
    steps = {"off": instantiate(built.emitted["target"]), "on": instantiate(on_emitted)}
    cal_dep = get_deployment(cal_path)
    # "off" is priced with Triton's measured times at every measured shape, "on" with the choice's
    model_for = {"off": CostModel(cal_dep, graphs=dev.type == "cuda",
                                  calibration=dataclasses.replace(record, linear_choice=table.with_impl("triton").to_json())),
                 "on": CostModel(cal_dep, graphs=dev.type == "cuda",
                                 calibration=dataclasses.replace(record, linear_choice=table.to_json()))}
    if args.bs1_attention_plan:  # its own model: a model caches the attention plans it priced
        steps["on-bs1-attention"] = Bs1AttentionPlan(steps["on"])
        model_for["on-bs1-attention"] = CostModel(cal_dep, graphs=dev.type == "cuda",
                                                  calibration=dataclasses.replace(record, linear_choice=table.to_json()))
    result["steps"] = time_steps(steps, model_for, ir, cfg, dev, parse_ints(args.batches), parse_ints(args.qs),
                                 args.context, args.reps)
    result["goals"] = goals(result["steps"])
    for key, value in result["goals"].items():
        print(f"[goal] {key} = {value:.2f}", flush=True)
    points = [tuple(int(v) for v in p.split(":")) for p in args.profile.split(",") if p.strip()]
    if dev.type == "cuda" and points:
        result["profiles"] = profile_steps(steps["on"], model_for["on"], ir, cfg, dev, points, args.context)
    del steps, built, target
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # 3. optional: token forcing with cuBLAS at every multi-row linear of the measured shapes
    if args.forcing:
        from examples.bench_steps import forcing_case
        from specc.bench.shapes import QWEN3_8B as Q8, tiny

        tcfg = tiny(Q8) if args.tiny else Q8
        forced = LinearChoice.forced(sorted(table.shapes), rows=(2, None), source="forced for forcing")
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(10, tcfg["vocab_size"] - 10, (24,), generator=gen).tolist() for _ in range(2)]
        tol = 0.25 if dtype == torch.bfloat16 else 1e-3
        result["forcing"] = forcing_case("qwen3-8b + dflash-b16 (cuBLAS from 2 rows)", tcfg, None, "dflash", dtype,
                                         dev, prompts, 32, tol, graphs=dev.type == "cuda", small=args.tiny,
                                         linear_choice=forced)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
