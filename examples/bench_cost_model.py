"""Cost-model accuracy: predicted vs measured step times of compiled target steps.

Qwen3-8B shapes with random bf16 weights (timings do not depend on the values), compiled in
memory with the default pass pipeline (specc.codegen.build.build_steps + instantiate). For every batch
size B and new-token count Q (AR is Q = 1, verification Q > 1) at context C, the compiled step is
timed (CUDA: median of CUDA-graph replays with CUDA events, warm-up excluded; CPU: median of
perf_counter) and predicted by the cost model from the same post-pass IR on the deployment
(optionally calibrated first, in the same run). Prints the error table and writes JSON.

    PYTHONPATH=. python3 examples/bench_cost_model.py --calibrate --out $OUT/cost_model.json
    PYTHONPATH=. python3 examples/bench_cost_model.py --deployment h200-cal.json --out cost_model.json
    PYTHONPATH=. python3 examples/bench_cost_model.py --device cpu --tiny --calibrate --quick   # smoke run
    PYTHONPATH=. python3 examples/bench_cost_model.py --config specc-tiny --calibrate --model-shapes --batches 1,8 \
        --qs 1,16 --context 512 --out cm-tiny.json    # calibrated on the target's own shapes too
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

QWEN3_8B = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                max_position_embeddings=40960, tie_word_embeddings=False, eos_token_id=151645)
TINY = dict(QWEN3_8B, vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_hidden_layers=4, eos_token_id=511)
QWEN3_0_6B = dict(QWEN3_8B, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, tie_word_embeddings=True)
# specc-tiny v1's shapes (8.4M parameters; the zoo now ships v2, whose config --config specc-tiny reads)
SPECC_TINY_V1 = dict(QWEN3_8B, vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=1e4, tie_word_embeddings=True,
                     eos_token_id=0)
CONFIGS = {"qwen3-8b": QWEN3_8B, "qwen3-0.6b": QWEN3_0_6B, "specc-tiny-v1": SPECC_TINY_V1, "tiny": TINY}


def target_shapes(name: str) -> dict:
    """A named config (CONFIGS) or the config.json of a checkpoint (zoo name, directory, hub id)."""
    if name in CONFIGS:
        return CONFIGS[name]
    from specc.models.loading import load_config, resolve_checkpoint

    return dict(load_config(resolve_checkpoint(name)))


def build_target(cfg: dict, dtype, device, seed: int = 1):
    """A specc CausalLM with random N(0, 0.02) weights in real shapes (no checkpoint needed)."""
    from specc.models import CausalLM, model_config_from_hf

    mc = model_config_from_hf(cfg)
    with torch.device("meta"):
        model = CausalLM(mc)
    model = model.to_empty(device=device).to(dtype)
    g = torch.Generator(device=device).manual_seed(seed)  # on the GPU: seconds, not minutes
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_((torch.randn(p.shape, generator=g, device=device) * 0.02).to(p.dtype))
    model.inv_freq = mc.rope.inv_freq(mc.head_dim).to(device)
    return model.eval()


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke run; = --config tiny)")
    ap.add_argument("--config", default="qwen3-8b", help=f"target shapes: {', '.join(CONFIGS)} or a checkpoint "
                    "(zoo name, directory) whose config.json is read (default qwen3-8b)")
    ap.add_argument("--nodes", action="store_true", help="also write every node's predicted terms per row")
    ap.add_argument("--deployment", help="deployment name or calibrated file (default: h200-bs1, or cpu on CPU)")
    ap.add_argument("--calibrate", action="store_true", help="calibrate the deployment first, in this run")
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    ap.add_argument("--model-shapes", action="store_true",
                    help="with --calibrate: also time the target's own linear shapes and attention heads "
                         "(`specc calibrate --model`)")
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--qs", default="1,2,4,8,16,32,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--passes", default=None, help="pass pipeline (default: the compile default)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="cost_model.json")
    args = ap.parse_args(argv)

    from specc.codegen.build import build_steps

    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.search.calibrate import Timer, calibrate, write_calibration
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment

    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)  # as calibration does: stable timings on a shared machine
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: use --device cpu --tiny")
    dep = get_deployment(args.deployment or ("h200-bs1" if dev.type == "cuda" else "cpu"))
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                    "shapes": f"{'tiny' if args.tiny else args.config} (random weights)",
                    "context": args.context}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        pass
    calibration = None
    cfg = TINY if args.tiny else target_shapes(args.config)
    if args.model_shapes and not args.calibrate:
        raise SystemExit("--model-shapes needs --calibrate")
    if args.calibrate:
        from specc.search.model_shapes import model_shapes

        t0 = time.time()
        models = [model_shapes(cfg, label="tiny" if args.tiny else args.config)] if args.model_shapes else []
        dep, calibration = calibrate(dep, device=args.device, quick=args.quick, models=models,
                                     progress=lambda m: print(f"[calibrate] {m}", flush=True))
        cal_path = args.out.rsplit(".", 1)[0] + ".deployment.json"
        write_calibration(cal_path, dep, calibration)
        dep = get_deployment(cal_path)
        result["calibration_seconds"] = round(time.time() - t0, 1)
        result["calibration_file"] = cal_path
        result["calibrated_for"] = calibration.models
    result["deployment"] = dep.to_json()
    model = CostModel(dep, graphs=dev.type == "cuda")
    result["graphs"] = model.graphs
    result["linear_choice"] = None if model.linear_choice is None else model.linear_choice.summary()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    target = build_target(cfg, dtype, dev)
    target.setup_caches(1, 16)
    pipeline = DEFAULT_PIPELINE if args.passes is None else args.passes
    built = build_steps(target, None, pipeline, linear_choice=model.linear_choice)  # what compile would lower
    ir = built.irs["target"]
    step = instantiate(built.emitted["target"])
    timer = Timer(args.device, reps=args.reps)
    batches, qs, c = parse_ints(args.batches), parse_ints(args.qs), args.context
    rows = []
    print(f"{'B':>3} {'Q':>3} {'predicted ms':>13} {'measured ms':>12} {'error':>8}  bound (predicted)", flush=True)
    for b in batches:
        step.setup_caches(b, c + max(qs) + 8)
        for q in qs:
            ids = torch.randint(0, cfg["vocab_size"], (b, q), device=dev)
            pos = torch.arange(c, c + q, device=dev)[None].expand(b, -1).contiguous()
            lens = torch.full((b,), c, dtype=torch.long, device=dev)
            with torch.inference_mode():
                measured = timer(lambda: step(ids, pos, lens))
            pred = model.step(ir, {"B": b, "Q": q, "C": c}, sync=False)
            comp = sum(n.work_time for n in pred.nodes if n.t_compute > n.t_memory)
            bound = "compute-heavy" if comp > 0.5 * (pred.time - pred.launch_time) else "memory-bound"
            err = pred.time / measured - 1
            rows.append({"B": b, "Q": q, "C": c, "predicted_s": pred.time, "measured_s": measured, "error": err,
                         "floor_s": pred.floor, "launch_s": pred.launch_time, "launches": pred.launches,
                         "bytes": pred.bytes, "flops": pred.flops, "bound": bound})
            if args.nodes:  # what a refit of the per-node terms needs: kind, launches, memory / compute / launch time
                rows[-1]["nodes"] = [[n.kind, n.launches, n.t_memory, n.t_compute, n.t_launch] for n in pred.nodes]
            print(f"{b:>3} {q:>3} {pred.time * 1e3:13.3f} {measured * 1e3:12.3f} {err:+8.1%}  {bound}", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    errs = [abs(r["error"]) for r in rows]
    result["rows"] = rows
    result["summary"] = {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                         "geomean_ratio": math.exp(statistics.mean(math.log(r["predicted_s"] / r["measured_s"])
                                                                   for r in rows))}
    print(f"median |error| {result['summary']['median_abs_error']:.1%}, max {result['summary']['max_abs_error']:.1%}, "
          f"geomean predicted/measured {result['summary']['geomean_ratio']:.3f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
