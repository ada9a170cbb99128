"""Warm start at real size: the one-time work of the first and the second load of an artifact.

Writes a random-weight HF checkpoint of a named shape (``specc.bench.shapes``: qwen3-8b by
default, bf16, N(0, 0.02) drawn on the device), compiles it with ``specc compile`` (AR, the
deployment's pipeline, token forcing on id prompts), then loads the artifact in two fresh
processes with an empty kernel cache before the first (``SPECC_KERNEL_CACHE`` points at a new
directory): the first load compiles every kernel and captures every graph, the second finds the
kernels in the cache keyed by the artifact. Each load reports ``engine.load_stats`` (seconds per
phase: read, kernels, graphs, total) and one short timed generation.

    PYTHONPATH=. python3 examples/bench_load.py --out $OUT/load.json            # H200, qwen3-8b
    PYTHONPATH=. python3 examples/bench_load.py --shape tiny-qwen3 --device cpu   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

LOAD = r"""
import json, sys, time, torch
t0 = time.perf_counter()
import specc
t_import = time.perf_counter() - t0
engine = specc.load(sys.argv[1], device=sys.argv[2])
t_load = time.perf_counter() - t0
res = engine.generate([1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=32, eos_token_id=())
print(json.dumps({"import_s": t_import, "load_wall_s": t_load, "load_stats": engine.load_stats,
                  "decode_tokens_per_s": engine.last_stats.get("decode_tokens_per_s"),
                  "tokens": len(res.tokens)}, default=str))
"""


def write_checkpoint(shape: str, path: pathlib.Path, device: str) -> float:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specc.bench.shapes import target_config

    t0 = time.perf_counter()
    cfg = dict(target_config(shape))
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.save_pretrained(path, max_shard_size="50GB")
    del model
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deployment", default=None, help="default: h200-bs1 on cuda, cpu on cpu")
    ap.add_argument("--work", default=None, help="directory for the checkpoint and artifact (default: a temp dir)")
    ap.add_argument("--out", default="load.json")
    args = ap.parse_args()
    deployment = args.deployment or ("h200-bs1" if args.device == "cuda" else "cpu")
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="specc-load-"))
    ckpt, art = work / "ckpt", work / "model.specc"
    report = {"shape": args.shape, "device": args.device, "deployment": deployment}
    report["checkpoint_write_s"] = write_checkpoint(args.shape, ckpt, args.device)
    print(f"[load] checkpoint written in {report['checkpoint_write_s']:.1f} s", flush=True)
    prompts = work / "prompts.json"
    prompts.write_text(json.dumps([list(range(10, 42))]))
    env = dict(os.environ, SPECC_KERNEL_CACHE=str(work / "kernels"))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specc", "compile", str(ckpt), "--deployment", deployment, "-o", str(art),
                    "--prompts", str(prompts), "--verify-tokens", "8"], check=True, env=env)
    report["compile_s"] = time.perf_counter() - t0
    print(f"[load] compiled in {report['compile_s']:.1f} s", flush=True)
    report["artifact_bytes"] = sum(f.stat().st_size for f in art.rglob("*") if f.is_file())
    env["SPECC_KERNEL_CACHE"] = str(work / "kernels-fresh")  # the first load starts with no kernels
    for name in ("first_load", "second_load"):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", LOAD, str(art), args.device], check=True, env=env,
                             capture_output=True, text=True)
        report[name] = json.loads(out.stdout.strip().splitlines()[-1])
        report[name]["process_s"] = time.perf_counter() - t0
        st = report[name]["load_stats"]
        print(f"[load] {name}: process {report[name]['process_s']:.1f} s, load {report[name]['load_wall_s']:.1f} s "
              f"(read {st.get('read', 0):.1f} = verify {st.get('verify', 0):.1f} + weights {st.get('weights', 0):.1f} + rest, "
              f"kernels {st.get('kernels', 0):.1f}, graphs {st.get('graphs', 0):.1f}), "
              f"decode {report[name]['decode_tokens_per_s']:.0f} tok/s", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
