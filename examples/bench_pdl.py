#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) on and off: linears in a stream of kernels, and whole steps.

    PYTHONPATH=. python3 examples/bench_pdl.py --out $OUT/pdl.json
    PYTHONPATH=. python3 examples/bench_pdl.py --smoke --out /tmp/pdl.json   # tiny shapes (CUDA)

Every Triton kernel of a compiled step can be launched with PDL (``SPECC_PDL``, see
``specc.codegen.kernels.pdl``): it starts while its predecessor drains, the GEMVs first
load their first weight tile, and each waits for its predecessor before touching activations.
This script measures what that buys, in one process, mode by mode (0 off, 1 wait, 2 the GEMVs'
first weight tile loaded before the wait):

1. Linears (Qwen3-8B shapes qkv / o / gate_up / down / lm_head, M = 1, 4, 16, 64): the median
   per-call time of a CUDA graph of >= 48 calls rotating over >= 320 MB of weight copies (each
   call follows another kernel, as in a step), for specc's Triton linear and the bf12 layout-1
   kernel (M = 1, 16), beside cuBLAS (``F.linear``). Fractions of the measured copy bandwidth
   and of the bf16 matrix peak measured in the same run.
2. Steps (run first): the compiled Qwen3-8B target step (random weights, context 1024), unpacked and with
   ``pack_weights_12bit`` (layout 1), at Q = 1 (AR) and Q = 16 (verify): CUDA-graph medians per
   mode, and the graph-replayed logits compared bit for bit with mode 0's (PDL changes when a
   kernel starts, never what it computes: any difference is a race).

One JSON line per measurement on stdout; the whole record in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_bf12 import clone_packed  # noqa: E402  (a copy of a packed weight, for rotation)
from bench_bf12 import graph_time_us as graph_us  # noqa: E402  (per-call median of a graph of calls)
from bench_bf12 import replay_ms  # noqa: E402  (each replay's milliseconds)

SHAPES = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 24576), ("down", 12288, 4096),
          ("lm_head", 4096, 151936)]  # (name, K, N)
ROTATE_BYTES = 320 << 20


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def parse_mode(text: str):
    """"0", "1", "2", or "2-skip:FAMILY[+FAMILY...]" (mode 2 with those kernel families launched
    plainly; ``specc.codegen.kernels.pdl.PDL_FAMILIES``)."""
    from specc.codegen.kernels import pdl

    if text.startswith("2-skip:"):
        fams = text.split(":", 1)[1].split("+")
        bad = sorted(set(fams) - set(pdl.PDL_FAMILIES))
        if bad:
            raise SystemExit(f"unknown kernel families {bad} (use {', '.join(pdl.PDL_FAMILIES)})")
        return text
    if text not in ("0", "1", "2"):
        raise SystemExit(f"unknown mode {text!r}: 0, 1, 2 or 2-skip:FAMILY[+FAMILY...]")
    return int(text)


def set_mode(mode) -> None:
    """Set the launch mode of every later launch (see :func:`parse_mode`)."""
    from specc.codegen.kernels import pdl

    skip = mode.split(":", 1)[1].split("+") if isinstance(mode, str) else ()
    pdl.PDL_SKIP = frozenset(skip)
    pdl.PDL_MODE = 2 if isinstance(mode, str) else mode


def ceilings(dev) -> dict:
    """Copy bandwidth (bytes read + written / s) and bf16 matrix rate measured here."""
    a = torch.randn(1 << 28, device=dev)  # 1 GiB of fp32
    b = torch.empty_like(a)
    t = graph_us([lambda: b.copy_(a)]) * 1e-6
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    tm = graph_us([lambda: x @ y]) * 1e-6
    return {"copy_Bps": 2 * a.numel() * a.element_size() / t, "bf16_flops": 2 * 8192 ** 3 / tm}


def linear_rows(args, dev, modes, ceil) -> list[dict]:
    from specc.codegen.kernels import linear as L
    from specc.codegen.kernels import linear_bf12 as B1
    from specc.formats import pack_bf16_12bit

    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    shapes = [(n, k // 16 if args.smoke else k, nn // 16 if args.smoke else nn) for n, k, nn in SHAPES]
    for name, k, n in shapes:
        w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).bfloat16()
        copies = max(1, math.ceil(ROTATE_BYTES / (2 * n * k)))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        packs = None
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).bfloat16()
            ref = L.linear(x, w)  # mode-0 output: every mode must match it bit for bit
            row = {"kind": "linear", "shape": name, "N": n, "K": k, "M": m,
                   "cublas_us": graph_us([lambda i=i: F.linear(x, ws[i]) for i in range(len(ws))])}
            ys = [torch.empty(m, n, device=dev, dtype=x.dtype) for _ in ws]
            for mode in modes:
                set_mode(mode)
                y = L.linear(x, w)
                row[f"triton_pdl{mode}_exact"] = bool(torch.equal(y, ref))
                row[f"triton_pdl{mode}_us"] = graph_us([lambda i=i: L.linear(x, ws[i]) for i in range(len(ws))])
            set_mode(0)
            if m in args.bf12_ms:
                if packs is None:
                    p = pack_bf16_12bit(w, version=1)
                    pc = max(1, math.ceil(ROTATE_BYTES / p.nbytes))
                    packs = [p] + [clone_packed(p) for _ in range(pc - 1)]
                bref = B1.linear_bf12(x, packs[0])
                for mode in modes:
                    set_mode(mode)
                    row[f"bf12_pdl{mode}_exact"] = bool(torch.equal(B1.linear_bf12(x, packs[0]), bref))
                    row[f"bf12_pdl{mode}_us"] = graph_us(
                        [lambda i=i: B1.linear_bf12(x, packs[i], out=ys[i % len(ys)]) for i in range(len(packs))])
                set_mode(0)
                row["bf12_bytes"] = packs[0].nbytes
            byts, flops = 2 * n * k, 2 * m * n * k
            for key in [c for c in row if c.endswith("_us")]:
                b = row.get("bf12_bytes", byts) if key.startswith("bf12") else byts
                row[key[:-3] + "_copy_frac"] = b / (row[key] * 1e-6) / ceil["copy_Bps"]
                row[key[:-3] + "_peak_frac"] = flops / (row[key] * 1e-6) / ceil["bf16_flops"]
            rows.append(row)
            emit(row)
        ws = packs = w = None
        torch.cuda.empty_cache()
    return rows


def step_rows(args, dev, modes) -> list[dict]:
    from specc.bench.shapes import QWEN3_8B, build_causal, tiny
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate

    cfg = tiny(QWEN3_8B) if args.smoke else QWEN3_8B
    context = 64 if args.smoke else 1024
    bsz = args.batch
    target = build_causal(cfg, torch.bfloat16, dev, seed=1)
    target.setup_caches(1, 16)
    packed = DEFAULT_PIPELINE.replace("dce", "pack_weights_12bit,dce")
    variants = {"unpacked": (DEFAULT_PIPELINE, {}), "packed_v1": (packed, {"pack_version": 1})}
    gen = torch.Generator(device=dev).manual_seed(5)
    ids = {q: torch.randint(0, cfg["vocab_size"], (bsz, q), device=dev, generator=gen) for q in (1, 16)}
    out = []
    for label, (pipeline, options) in variants.items():
        if label not in args.variants:
            continue
        built = build_steps(target, None, pipeline, pass_options=options)
        step = instantiate(built.emitted["target"])
        step.setup_caches(bsz, context + 128)
        for q in (1, 16):
            pos = torch.arange(context, context + q, device=dev)[None].expand(bsz, q).contiguous()
            cl = torch.full((bsz,), context, device=dev)
            ref = None
            for mode in modes:
                set_mode(mode)
                with torch.inference_mode():
                    for _ in range(2):
                        step(ids[q], pos, cl)
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        logits = step(ids[q], pos, cl)
                    g.replay()
                    torch.cuda.synchronize()
                    got = logits.clone()
                    ts = replay_ms(g, args.reps)
                    again = torch.equal(logits, got)  # a race shows as replays that disagree
                    del g
                if ref is None:
                    ref = got
                rec = {"kind": "step", "variant": label, "B": bsz, "Q": q, "context": context, "pdl": mode,
                       "ms": statistics.median(ts), "ms_min": min(ts), "replays_agree": bool(again),
                       "logits_equal_pdl0": bool(torch.equal(got, ref))}
                out.append(rec)
                emit(rec)
            set_mode(0)
        del step, built
        torch.cuda.empty_cache()
    base = {(r["variant"], r["Q"]): r["ms"] for r in out if r["pdl"] == 0}
    for r in out:
        r["over_pdl0"] = r["ms"] / base[r["variant"], r["Q"]]
        if r["variant"] != "unpacked" and ("unpacked", r["Q"]) in base:
            same = [u for u in out if u["variant"] == "unpacked" and u["Q"] == r["Q"] and u["pdl"] == r["pdl"]]
            r["over_unpacked_same_mode"] = r["ms"] / same[0]["ms"] if same else None
            r["over_unpacked_pdl0"] = r["ms"] / base["unpacked", r["Q"]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="0,1,2",
                    help="launch modes: 0, 1, 2, or 2-skip:FAMILY[+FAMILY...] (mode 2 with those kernel families "
                         "launched plainly, e.g. 2-skip:attention+linear_dot)")
    ap.add_argument("--ms", default="1,4,16,64")
    ap.add_argument("--linear-modes", default="", help="modes for the linears (default: --modes)")
    ap.add_argument("--bf12-ms", default="1,16")
    ap.add_argument("--variants", default="unpacked,packed_v1")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1, help="batch of the steps (default 1)")
    ap.add_argument("--no-linears", action="store_true")
    ap.add_argument("--no-steps", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: checks that everything runs")
    args = ap.parse_args()
    args.ms = [int(v) for v in args.ms.split(",")]
    args.bf12_ms = [int(v) for v in args.bf12_ms.split(",") if v]
    args.variants = args.variants.split(",")
    modes = [parse_mode(v) for v in args.modes.split(",")]
    args.linear_modes = [parse_mode(v) for v in args.linear_modes.split(",") if v]
    if not torch.cuda.is_available():
        sys.exit("bench_pdl.py needs a CUDA GPU (PDL is a launch attribute of Hopper and newer)")
    from specc.codegen.kernels import pdl

    dev = torch.device("cuda")
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "pdl_supported": pdl.PDL_SUPPORTED,
            "modes": {m: pdl.PDL_MODES.get(m, f"first tile, plain launches for {m}") for m in modes},
            "argv": sys.argv[1:]}
    emit(info)
    if not pdl.PDL_SUPPORTED:
        modes = [0]
    t0 = time.time()
    record = {"info": info}
    record["ceilings"] = ceil = ceilings(dev)
    emit(ceil)
    if not args.no_steps:
        record["steps"] = step_rows(args, dev, modes)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    if not args.no_linears:
        record["linears"] = linear_rows(args, dev, args.linear_modes or modes, ceil)
    record["wall_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print("\nsteps (ms, median of graph replays):")
    for r in record.get("steps", []):
        print(f"  {r['variant']:10s} Q={r['Q']:2d} pdl{r['pdl']}: {r['ms']:.3f} ms  x{r['over_pdl0']:.3f} of pdl0"
              f"  equal={r['logits_equal_pdl0']} replays_agree={r['replays_agree']}"
              + (f"  /unpacked same mode {r['over_unpacked_same_mode']:.3f}" if r.get("over_unpacked_same_mode") else ""))


if __name__ == "__main__":
    main()
