#!/usr/bin/env python3
"""bf12 (lossless 12-bit weights) against bf16 on Qwen3-8B shapes: kernels and steps, one GPU run.

    PYTHONPATH=. python3 examples/bench_bf12.py --out $OUT/bf12.json
    PYTHONPATH=. python3 examples/bench_bf12.py --tiny --out /tmp/bf12.json   # CPU smoke run

1. Per linear shape (qkv 4096->6144, o 4096->4096, gate_up 4096->24576, down 12288->4096,
   lm_head 4096->151936) and M (default 1, 4, 16, 64): cuBLAS bf16 (``F.linear``), the layout-1
   kernel with its shipped config table (``--sweep-v1`` sweeps it instead), the layout-2
   Triton kernel (``specc.codegen.kernels.linear_bf12_v2``) with a sweep of configs, and the
   layout-2 tensor-core kernel (``mma``: ``specc.codegen.kernels.linear_bf12_mma``, 1 .. 32 rows, a launch per
   16-rows tile; ``mma3`` / ``v2t``: layout 3). ``--shapes dflash_kv`` adds the DFlash-b16 drafter's K/V
   projection (4096 -> 2048). Each config is
   checked in bf16 against ``x.float() @ W.float().T`` into a NaN-poisoned output (relative
   error beside cuBLAS's own) and timed as the median of CUDA-graph replays, each graph a
   sequence of calls rotating over enough weight copies that the 50 MB L2 cannot serve them.
   One JSON line per (shape, M) on stdout (``"kind": "linear"``): microseconds and the
   fraction of the deployment's HBM bandwidth each one streams (bytes read / time / HBM B/s;
   bf16 bytes for cuBLAS, packed bytes -- planes, bases, escape table -- for bf12).
2. ``--steps`` (on by default on CUDA): the compiled Qwen3-8B target step (random weights,
   context 1024) with the default pipeline and with ``pack_weights_12bit`` (layout 1 when
   ``--layouts`` names v1; layout 2 as engines run it, with every tensor-core launch
   prefetching, with the norm unfused at one row, and on the Triton kernels alone), at Q = 1
   (the AR step) and Q = 16 (the verify step), CUDA-graph medians in the same run, the greedy
   logits compared (max difference; each flipped greedy token with its top-2 margin: a tie or a defect), and the cost model's prediction for both (the choice it would
   make) beside the measured winner -- with the deployment's calibration, and with the packed
   linears priced by this run's layout-2 efficiency per M: ``"kind": "step"`` JSON lines.

Random N(0, 0.02) weights: a realistic exponent spread (escape rate ~7.5e-5); timings do not
depend on the values. Kernels are compiled first in parallel worker processes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 24576), ("down", 12288, 4096),
          ("lm_head", 4096, 151936)]  # (name, K, N)
LAYER = ("qkv", "o", "gate_up", "down")
# timed only when named in --shapes: the DFlash-b16 drafter's K/V projection (context + block rows)
EXTRA_SHAPES = [("dflash_kv", 4096, 2048)]
# mma / mma3: layout-2 / layout-3 (16 x 64 tiles) weights through the tensor-core kernel
LAYOUT_VERSION = {"v1": 1, "v2": 2, "v2t": 3, "mma": 2, "mma3": 3}  # v2t: the Triton kernels on layout 3
MS = (1, 4, 16, 64)
ROTATE_BYTES = 320 << 20  # weight bytes per rotation, >> 50 MB of L2 (also for the packed copies)
MIN_CALLS = 48  # kernel calls per graph replay
REPLAYS = 15


def candidates(m: int, quick: bool = False):
    from specc.codegen.kernels.linear_bf12 import Bf12Config as C

    def fma(bm, bn, bj, split=1, warps=4, asm=True, pf=True):
        return C("fma", block_m=bm, block_n=bn, block_j=bj, split_k=split, num_warps=warps,
                 num_stages=1, use_asm=asm, prefetch=pf)

    def dot(bm, bn, bj, split=1, warps=4, stages=3, swap=False):
        return C("dot", block_m=bm, block_n=bn, block_j=bj, split_k=split, num_warps=warps,
                 num_stages=stages, swap_ab=swap)

    if m == 1:
        c = [fma(1, 16, 64), fma(1, 16, 32), fma(1, 32, 32), fma(1, 8, 64), fma(1, 16, 128, warps=8),
             fma(1, 32, 64, warps=8), fma(1, 16, 64, pf=False),
             fma(1, 16, 64, split=2), fma(1, 32, 32, split=2), fma(1, 16, 64, asm=False), fma(1, 8, 32),
             fma(1, 32, 16)]
    elif m in (2, 4):
        c = [fma(m, 16, 64), fma(m, 16, 32), fma(m, 8, 64), dot(16, 32, 4), dot(16, 64, 4), dot(16, 64, 8)]
    elif m in (8, 16):
        c = [dot(16, 32, 4), dot(16, 64, 4), dot(16, 64, 8), dot(16, 128, 4, warps=8), dot(16, 64, 4, swap=True),
             dot(16, 32, 8), dot(16, 64, 4, split=2), dot(16, 64, 4, stages=4), dot(16, 128, 8, warps=8, swap=True),
             dot(16, 16, 8), dot(16, 32, 4, split=2)]
    else:
        c = [dot(m, 32, 4), dot(m, 64, 4), dot(m, 64, 8, warps=8), dot(m, 64, 4, swap=True),
             dot(m, 64, 4, split=2), dot(m, 32, 8)]
        if m == 32:
            c += [dot(m, 128, 4, warps=8), dot(m, 128, 4, warps=8, swap=True)]
        else:
            c += [dot(m, 64, 8, warps=8, swap=True)]
    return c[:3] if quick else c


def candidates_v2(m: int, quick: bool = False):
    """Layout-2 configs worth timing at M rows (16-byte loads per plane per thread need
    block_n * block_k / 2 = 16 * 32 * num_warps)."""
    from specc.codegen.kernels.linear_bf12_v2 import Bf12v2Config as C

    def fma(bm, bn, bk, split=1, warps=4, asm=True):
        return C("fma", block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=warps, num_stages=1,
                 use_asm=asm)

    def dot(bm, bn, bk, split=1, warps=4, stages=3, swap=False, asm=True):
        return C("dot", block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=warps, num_stages=stages,
                 swap_ab=swap, use_asm=asm)

    if m == 1:
        c = [fma(1, 16, 256), fma(1, 16, 256, split=2), fma(1, 32, 256, warps=8), fma(1, 16, 512, warps=8),
             fma(1, 32, 128), fma(1, 8, 512), fma(1, 32, 256, split=2, warps=8), fma(1, 16, 256, asm=False)]
    elif m <= 4:
        c = [fma(m, 16, 256), fma(m, 16, 256, split=2), fma(m, 32, 128), dot(16, 64, 64), dot(16, 64, 128),
             dot(16, 128, 64, warps=8), dot(16, 64, 64, asm=False)]
    elif m <= 16:
        c = [dot(16, 64, 64), dot(16, 64, 128), dot(16, 128, 64, warps=8), dot(16, 64, 64, swap=True),
             dot(16, 32, 128), dot(16, 64, 64, split=2), dot(16, 128, 128, warps=8, swap=True),
             dot(16, 64, 64, asm=False)]
    else:  # row tiles are powers of two: 24 rows run a 32-row tile
        t = 1 << (m - 1).bit_length()
        c = [dot(t, 64, 64), dot(t, 64, 128, warps=8), dot(t, 128, 64, warps=8, swap=True), dot(t, 32, 128),
             dot(t, 64, 64, split=2), dot(t, 64, 64, asm=False)]
    return c[:2] + c[-1:] if quick else c  # (the last one decodes without the inline asm)


def candidates_mma(m: int, quick: bool = False):
    """Configs of the tensor-core kernel (layouts 2 and 3, 1 .. 32 rows in one launch; none
    above): its default first."""
    from specc.codegen.kernels.linear_bf12_mma import MAX_ROWS
    from specc.codegen.kernels.linear_bf12_mma import Bf12MmaConfig as C

    if m > MAX_ROWS:
        return []
    c = [C(), C(prefetch=True), C(unroll=2, prefetch=True), C(unroll=2), C(warps=4, unroll=2, prefetch=True),
         C(warps=4, prefetch=True), C(splits=2), C(splits=2, prefetch=True)]
    return c[:2] if quick else c


def configs_for(layout: str, m: int, quick: bool, sweep_v1: bool, shape: tuple[int, int] | None = None,
                sms: int = 0):
    """The configs a layout is timed with: v2 (the Triton kernels) and mma (the tensor-core
    kernel on layout-2 weights) always swept, mma's shipped launch for the ``(n, k)`` shape on
    ``sms`` SMs first where a shape is given; v1 its shipped table (None) unless ``sweep_v1``."""
    if layout in ("v2", "v2t"):
        return candidates_v2(m, quick)
    if layout in ("mma", "mma3"):
        swept = candidates_mma(m, quick)
        if shape is None or not swept:
            return swept
        from specc.codegen.kernels.linear_bf12_mma import get_config

        shipped = get_config(m, shape[0], shape[1], sms)
        return [shipped] + [c for c in swept if c != shipped]
    return candidates(m, quick) if sweep_v1 else [None]


def _compile_worker(jobs):
    """Compile (and run once, small) each (layout, m, k, config): fills Triton's on-disk cache."""
    import torch

    from specc.codegen.kernels.linear_bf12 import linear_bf12
    from specc.formats import pack_bf16_12bit

    torch.cuda.init()
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = {}
    for layout, m, k, cfg in jobs:
        if (layout, k) not in cache:
            w = (torch.randn(256, k, device="cuda", generator=g) * 0.02).bfloat16()
            cache[layout, k] = pack_bf16_12bit(w, version=LAYOUT_VERSION[layout])
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        try:
            linear_bf12(x, cache[layout, k], config=cfg)
        except Exception as e:  # reported again (with traceback) by the main process
            print(f"compile failed: {layout} m={m} {cfg}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    torch.cuda.synchronize()
    return len(jobs)


def precompile(layouts, ms, ks, quick, sweep_v1, workers):
    jobs = [(lay, m, k, c) for lay in layouts for m in ms for k in sorted(set(ks))
            for c in configs_for(lay, m, quick, sweep_v1) if not lay.startswith("mma")]  # (one extension, built once)
    # K only matters through divisibility (all Qwen3-8B K are multiples of 256): one K suffices,
    # except that split-K's effective split depends on K; compile for each distinct K anyway.
    workers = max(1, min(workers, len(jobs)))
    chunks = [jobs[i::workers] for i in range(workers)]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        n = sum(pool.map(_compile_worker, chunks))
    print(f"precompiled {n} kernel variants in {time.time() - t0:.1f} s with {workers} processes",
          flush=True)


def graph_time_us(calls) -> float:
    """Median time of one call (us) over CUDA-graph replays of ``calls`` repeated."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    reps = max(1, math.ceil(MIN_CALLS / len(calls)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for c in calls:
                c()
    g.replay()
    torch.cuda.synchronize()
    ts = replay_ms(g, REPLAYS)
    del g
    return statistics.median(ts) * 1e3 / (reps * len(calls))


def replay_ms(g, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` replays of a captured graph (CUDA events)."""
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def wall_time_us(calls) -> float:
    t0 = time.perf_counter()
    for c in calls:
        c()
    return (time.perf_counter() - t0) * 1e6 / len(calls)


def rel_err(y, ref) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


def cfg_str(c) -> str:
    if c is None:
        return "table"
    if not hasattr(c, "kind"):  # a Bf12MmaConfig
        return f"mma u{c.unroll} w{c.warps}" + (f" sk{c.splits}" if c.splits > 1 else "") + (" pf" if c.prefetch else "")
    s = f"{c.kind} m{c.block_m} n{c.block_n} " + (f"j{c.block_j}" if hasattr(c, "block_j") else f"k{c.block_k}")
    if c.split_k > 1:
        s += f" sk{c.split_k}"
    s += f" w{c.num_warps} s{c.num_stages}"
    if c.swap_ab:
        s += " swap"
    if not c.use_asm:
        s += " noasm"
    if c.kind == "fma" and getattr(c, "prefetch", True) is False:
        s += " nopf"
    return s


def clone_packed(p):
    from specc.formats import Packed12

    return Packed12(sm=p.sm.clone(), ex=p.ex.clone(), base=p.base.clone(), esc_idx=p.esc_idx.clone(),
                    esc_val=p.esc_val.clone(), shape=p.shape, base_mode=p.base_mode, version=p.version)


def emit(record: dict) -> None:
    """One JSON line on stdout (the run's machine-readable log)."""
    print(json.dumps(record), flush=True)


def time_configs(L, x, p, ps, ys, ref, e_cub, cfgs, timer, smoke) -> list[dict]:
    """Check (poisoned output, relative error vs cuBLAS's) and time each config on ``p``."""
    m, n = x.shape[0], p.shape[0]
    out_recs = []
    for cfg in cfgs:
        rec = {"config": cfg_str(cfg), "params": None if cfg is None else cfg.__dict__.copy()}
        try:
            out = torch.full((m, n), float("nan"), device=x.device, dtype=x.dtype)
            L.linear_bf12(x, p, config=cfg, out=out)  # poisoned output: all must be written
            err = rel_err(out, ref)
            rec["rel_err"] = err
            rec["ok"] = math.isfinite(err) and err < max(4 * e_cub, 1e-2 if not smoke else 1e-5)
            if rec["ok"]:
                rec["us"] = timer([lambda i=i: L.linear_bf12(x, ps[i], config=cfg, out=ys[i])
                                   for i in range(len(ps))])
        except Exception as e:  # noqa: BLE001 - report and go on with the sweep
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        out_recs.append(rec)
    return out_recs


def linear_rows(args, shapes, ms, layouts, dev, act, timer, sync, hbm, smoke, sms: int = 0) -> list[dict]:
    from specc.codegen.kernels import linear_bf12 as L
    from specc.formats import pack_bf16_12bit

    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, k, n in shapes:
        w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).bfloat16()
        packs = {}
        for lay in layouts:
            t0 = time.time()
            p = pack_bf16_12bit(w, version=LAYOUT_VERSION[lay])
            sync()
            assert torch.equal(p.unpack().view(torch.int16), w.view(torch.int16)), f"{lay} unpack not bit-exact"
            copies = max(1, math.ceil(ROTATE_BYTES / p.nbytes))
            packs[lay] = (p, [p] + [clone_packed(p) for _ in range(copies - 1)], time.time() - t0)
        copies = max(1, math.ceil(ROTATE_BYTES / (2 * n * k)))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        wf = w.float()
        p0 = next(iter(packs.values()))[0]
        print(f"\n{name}: [{n}, {k}] escape rate {p0.escape_rate:.2e}, "
              + ", ".join(f"{lay} {pk[0].nbytes / 1e6:.1f} MB ({pk[0].bits_per_weight:.3f} bits/w, pack "
                          f"{pk[2]:.2f} s)" for lay, pk in packs.items()), flush=True)
        for m in ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(act)
            ref = x.float() @ wf.T
            e_cub = rel_err(F.linear(x, w.to(act)), ref)
            t_cub = timer([lambda i=i: F.linear(x, ws[i].to(act)) for i in range(len(ws))])
            row = {"kind": "linear", "shape": name, "N": n, "K": k, "M": m, "bf16_us": t_cub,
                   "bf16_rel_err": e_cub, "bf16_hbm_frac": 2 * n * k / (t_cub * 1e-6) / hbm}
            for lay, (p, ps, _) in packs.items():
                ys = [torch.empty(m, n, device=dev, dtype=act) for _ in ps]
                recs = time_configs(L, x, p, ps, ys, ref, e_cub,
                                    configs_for(lay, m, args.quick, args.sweep_v1, (n, k), sms), timer, smoke)
                good = [c for c in recs if c.get("ok")]
                row[f"{lay}_bytes"] = p.nbytes
                row[f"{lay}_configs"] = recs
                if good:
                    b = min(good, key=lambda c: c["us"])
                    row.update({f"{lay}_us": b["us"], f"{lay}_config": b["config"], f"{lay}_params": b["params"],
                                f"{lay}_rel_err": b["rel_err"], f"{lay}_speedup": t_cub / b["us"],
                                f"{lay}_hbm_frac": p.nbytes / (b["us"] * 1e-6) / hbm})
                else:
                    row[f"{lay}_error"] = "; ".join(c.get("error", f"rel_err {c.get('rel_err')}") for c in recs)[:800]
            rows.append(row)
            emit({k_: v for k_, v in row.items() if not k_.endswith("_configs")})
        ws = packs = w = wf = None  # free this shape's copies
        if not smoke:
            torch.cuda.empty_cache()
    return rows


def logit_agreement(unpacked: torch.Tensor, packed: torch.Tensor, tolerance: float = 0.25) -> dict:
    """Packed weights are the unpacked ones bit for bit, but the kernels sum in another order, so
    logits may differ by rounding: the max difference, and for each position whose greedy token
    differs, the unpacked logits' top-2 margin (a tie when within ``tolerance``, else a defect)."""
    from specc.verify.forcing import top2_margins

    u, p = unpacked.reshape(-1, unpacked.shape[-1]), packed.reshape(-1, packed.shape[-1])
    flips = (u.argmax(-1) != p.argmax(-1)).nonzero().flatten().tolist()
    margins = top2_margins(u[flips].float()) if flips else []
    return {"same_greedy_tokens": not flips, "max_abs_logit_diff": float((u - p).abs().max()),
            "flipped_positions": flips, "flip_margins": margins,
            "flips_are_ties": all(m <= tolerance for m in margins)}


# step variants built only when --step-variants names them (run 29's launch experiments)
STEP_EXPERIMENTS = ("packed_v3_norm_fused", "packed_v3_mid_u1w8", "packed_v3_mid16_u1w8")


def step_rows(args, dev, dtype, smoke, packed_by_m: dict[int, float]) -> list[dict]:
    """Compiled Qwen3-8B target step, default pipeline vs + pack_weights_12bit (layouts 1 and 2), with
    the cost model's predictions: the deployment's own, and the same with this run's layout-2
    efficiencies by M (``packed_by_m``, packed bytes / time / HBM) for the packed linears."""
    from specc.bench.shapes import QWEN3_8B, build_causal, tiny
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.search.calibrate import Calibration
    from specc.search.cost_model import CostModel

    cfg = tiny(QWEN3_8B) if smoke else QWEN3_8B
    context = 64 if smoke else 1024
    target = build_causal(cfg, dtype, dev, seed=1)
    target.setup_caches(1, 16)
    packed = DEFAULT_PIPELINE.replace("dce", "pack_weights_12bit,dce")
    # packed_v2: layout 2 as engines run it (the tensor-core kernel at 1 .. 16 rows where it runs);
    # packed_v2_prefetch: the same with every tensor-core launch prefetching (since run 18 the
    # default launch rule prefetches everywhere, so this equals packed_v2);
    # packed_v2_triton: SPECC_BF12_MMA=0 (the Triton kernels only)
    # packed_v2_u2w4: every tensor-core launch with two super-groups per chunk, 4 warps, prefetching
    # packed_v3: layout 3 (layout 2's bytes in 16 x 64 tiles), the pass's default since run 21;
    # run 29's experiments, each the shipped default but one choice (built only when named):
    # packed_v3_norm_fused: the tensor-core kernel's own norm prologue at one row (the default
    # before run 29; now the rms_norm kernel runs first at every row count);
    # packed_v3_mid_u1w8: launches of 2-4 waves of 16-row blocks at <= 8 rows (q/k/v) one
    # super-group x 8 warps (the rule before run 29; now 2 x 4);
    # packed_v3_mid16_u1w8: 2-4 waves at 9-16 rows (q/k/v in the verify step) 1 x 8, no prefetch
    v2 = (packed, {"pack_version": 2})
    v3 = (packed, {"pack_version": 3})
    variants = {"unpacked": (DEFAULT_PIPELINE, {}), "packed_v1": (packed, {"pack_version": 1}),
                "packed_v2": v2, "packed_v2_prefetch": v2, "packed_v2_u2w4": v2,
                "packed_v2_triton": v2, "packed_v3": v3,
                **{name: v3 for name in STEP_EXPERIMENTS}}
    if "v1" not in args.layouts.split(","):
        del variants["packed_v1"]
    if not args.step_variants:  # run 29's launch experiments are built only when named
        variants = {k: v for k, v in variants.items() if k not in STEP_EXPERIMENTS}
    else:  # the unpacked step is always the yardstick
        wanted = {v.strip() for v in args.step_variants.split(",") if v.strip()}
        unknown = wanted - set(variants)
        if unknown:
            raise SystemExit(f"unknown --step-variants {sorted(unknown)} (use {', '.join(v for v in variants if v != 'unpacked')})")
        variants = {k: v for k, v in variants.items() if k == "unpacked" or k in wanted}
    model = CostModel(args.deployment)
    base = model.calibration or Calibration(deployment=model.deployment.name, device="cuda")
    measured = CostModel(model.deployment, calibration=dataclasses.replace(
        base, packed_linear_bandwidth_by_m=packed_by_m)) if packed_by_m else None
    gen = torch.Generator(device=dev).manual_seed(5)
    ids = {q: torch.randint(0, cfg["vocab_size"], (1, q), device=dev, generator=gen) for q in (1, 16)}
    res, logits_of = {}, {}
    for label, (pipeline, options) in variants.items():
        with _kernel_choice(label):
            _step_variant(label, pipeline, options, target, context, ids, model, measured, res, logits_of, dev)
        if not smoke:
            torch.cuda.empty_cache()
    return _step_records(res, logits_of, context, model, measured, packed_by_m)


@contextlib.contextmanager
def _kernel_choice(label: str):
    """The bf12 kernel choice a step variant is built and timed under (restored after):
    ``packed_v2_triton`` turns the tensor-core kernel off (``SPECC_BF12_MMA=0``),
    ``packed_v2_prefetch`` makes its every launch prefetch, ``packed_v2_u2w4`` also use two
    super-groups per chunk and 4 warps, ``packed_v3_norm_fused`` lets the kernel's own prologue
    normalize at one row (since run 29 the rms_norm kernel runs first at every row count),
    ``packed_v3_mid_u1w8`` / ``packed_v3_mid16_u1w8`` give q/k/v's launches (2-4 waves of 16-row
    blocks) 1 super-group x 8 warps at 1-8 / 9-16 rows; every other variant gets the defaults."""
    from specc.codegen.kernels import linear_bf12_mma as mma

    saved_env, default_config, fused_norm_rows = os.environ.get(mma.ENV), mma.get_config, mma.FUSED_NORM_MAX_ROWS
    os.environ[mma.ENV] = "0" if label == "packed_v2_triton" else "1"
    if label == "packed_v2_prefetch":
        mma.get_config = lambda *a, **k: dataclasses.replace(default_config(*a, **k), prefetch=True)
    if label == "packed_v2_u2w4":
        mma.get_config = lambda *a, **k: dataclasses.replace(default_config(*a, **k), unroll=2, warps=4, prefetch=True)
    if label in ("packed_v3_mid_u1w8", "packed_v3_mid16_u1w8"):
        few_rows = label == "packed_v3_mid_u1w8"

        def mid_u1w8(m, n, kp, sms, **k):
            cfg = default_config(m, n, kp, sms, **k)
            mid = 2 < mma.waves(n, cfg.splits, sms) <= 4
            if not mid or (m <= 8) != few_rows:
                return cfg
            return dataclasses.replace(cfg, unroll=1, warps=8, prefetch=cfg.prefetch and few_rows)

        mma.get_config = mid_u1w8
    if label == "packed_v3_norm_fused":
        mma.FUSED_NORM_MAX_ROWS = 1
    try:
        yield
    finally:
        mma.get_config, mma.FUSED_NORM_MAX_ROWS = default_config, fused_norm_rows
        if saved_env is None:
            os.environ.pop(mma.ENV, None)
        else:
            os.environ[mma.ENV] = saved_env


def _step_variant(label, pipeline, options, target, context, ids, model, measured, res, logits_of, dev) -> None:
    """Build, run (logits) and time one step variant at Q = 1 and 16 into ``res`` / ``logits_of``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_steps import time_graph  # the step timer of examples/bench_steps.py

    from specc.codegen.build import build_steps
    from specc.runtime.compiled import instantiate

    built = build_steps(target, None, pipeline, pass_options=options)
    stats = {r["name"]: r["stats"] for r in built.pass_records["target"]}
    step = instantiate(built.emitted["target"])
    step.setup_caches(1, context + 128)
    res[label] = {"pipeline": pipeline, "options": options, "pack_stats": stats.get("pack_weights_12bit")}
    for q in (1, 16):
        pos = torch.arange(context, context + q, device=dev)[None]
        cl = torch.tensor([context], device=dev)
        with torch.inference_mode():
            logits_of[label, q] = step(ids[q], pos, cl).float().cpu()
        vals = {"B": 1, "Q": q, "C": context}
        res[label][q] = {"ms": time_graph(step, (ids[q], pos, cl)),
                         "predicted_ms": model.step(built.irs["target"], vals).time * 1e3,
                         "predicted_measured_eff_ms": None if measured is None else
                         measured.step(built.irs["target"], vals).time * 1e3}


def _step_records(res, logits_of, context, model, measured, packed_by_m) -> list[dict]:
    """One record per (step, packed variant): times, logit agreement with the unpacked step, and
    the cost model's choice beside the measured winner."""
    out = []
    for q, what in ((1, "AR"), (16, "verify Q=16")):
        u = res["unpacked"][q]
        for label in [v for v in res if v != "unpacked"]:  # the packed variants, in step_rows' order
            p = res[label][q]
            rec = {"kind": "step", "step": what, "variant": label, "layout": res[label]["options"].get("pack_version"),
                   "Q": q, "context": context,
                   "unpacked_ms": u["ms"], "packed_ms": p["ms"], "packed_over_unpacked": p["ms"] / u["ms"],
                   **logit_agreement(logits_of["unpacked", q], logits_of[label, q]),
                   "deployment": model.deployment.name, "predicted_unpacked_ms": u["predicted_ms"],
                   "predicted_packed_ms": p["predicted_ms"],
                   "cost_model_packs": p["predicted_ms"] < u["predicted_ms"], "packing_wins": p["ms"] < u["ms"],
                   "pack_stats": res[label]["pack_stats"]}
            rec["cost_model_right"] = rec["cost_model_packs"] == rec["packing_wins"]
            if measured is not None and label in ("packed_v2", "packed_v3"):  # the cost model told this run's speeds
                rec.update(packed_bandwidth_by_m=packed_by_m,
                           predicted_packed_ms_measured_eff=p["predicted_measured_eff_ms"],
                           cost_model_packs_measured_eff=p["predicted_measured_eff_ms"] < u["predicted_measured_eff_ms"])
                rec["cost_model_right_measured_eff"] = rec["cost_model_packs_measured_eff"] == rec["packing_wins"]
            out.append(rec)
            emit(rec)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bf12.json")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES),
                    help="linear shapes to time (comma list; 'none': the steps only)")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--layouts", default="v1,v2,mma",
                    help="bf12 kernels to time: v1 (layout 1), v2 (layout 2, Triton), mma (layout 2, tensor cores, "
                         "1 .. 16 rows), mma3 (layout 3: 16 x 64 tiles, tensor cores)")
    ap.add_argument("--quick", action="store_true", help="3 configs per M")
    ap.add_argument("--sweep-v1", action="store_true", help="sweep the layout-1 configs too (default: its table)")
    ap.add_argument("--steps", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the compiled Qwen3-8B AR and Q=16 verify steps, packed (v2) vs unpacked")
    ap.add_argument("--step-variants", default=None,
                    help="comma-separated packed step variants to build (default: packed_v1 with layout v1, "
                         "packed_v2, packed_v2_prefetch, packed_v2_u2w4, packed_v2_triton, packed_v3; "
                         "built only when named: packed_v3_norm_fused, packed_v3_mid_u1w8, packed_v3_mid16_u1w8)")
    ap.add_argument("--deployment", default="h200-bs1",
                    help="deployment (a built-in name or a calibrated .json/.toml file) whose cost model prices "
                         "the steps and whose HBM bandwidth the fractions use")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--tiny", "--cpu-smoke", dest="tiny", action="store_true",
                    help="check this script end to end on the CPU (Triton interpreter, tiny shapes, fp32)")
    args = ap.parse_args()
    smoke = args.tiny
    if smoke:  # tiny shapes, Triton interpreter, fp32 activations, wall-clock "timing"
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import triton

    from specc.codegen.kernels import linear_bf12 as L
    from specc.search.deployments import get_deployment

    global ROTATE_BYTES, MIN_CALLS, REPLAYS
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    bad = [lay for lay in layouts if lay not in LAYOUT_VERSION]
    if bad:
        ap.error(f"unknown layout {bad[0]!r} (use {', '.join(LAYOUT_VERSION)})")
    named = args.shapes.split(",")
    unknown = [x for x in named if x and x != "none" and x not in {s[0] for s in SHAPES + EXTRA_SHAPES}]
    if unknown:
        ap.error(f"unknown shape {unknown[0]!r} (use {', '.join(s[0] for s in SHAPES + EXTRA_SHAPES)} or none)")
    shapes = [s for s in SHAPES + EXTRA_SHAPES if s[0] in named]
    ms = [int(m) for m in args.ms.split(",")]
    hbm = get_deployment(args.deployment).hbm_bandwidth
    if smoke:
        dev, act = torch.device("cpu"), torch.float32
        shapes = [(nm, 16 * (k // 1024) + 32, n // 1024 + 8) for nm, k, n in shapes]
        ms = [m for m in ms if m <= 16]
        ROTATE_BYTES, MIN_CALLS, REPLAYS = 2000, 2, 1
        timer, sync, gpu_name, sms = wall_time_us, (lambda: None), "cpu-smoke", 0
        args.no_precompile = True
    else:
        assert torch.cuda.is_available(), "needs a CUDA GPU (or --tiny for a CPU smoke run)"
        dev, act, timer, sync = torch.device("cuda"), torch.bfloat16, graph_time_us, torch.cuda.synchronize
        props = torch.cuda.get_device_properties(dev)
        gpu_name, sms = props.name, props.multi_processor_count
    info = {"kind": "info", "gpu": gpu_name, "sms": sms, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "hbm_Bps": hbm,
            "deployment": args.deployment, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv,
            "weights": "random normal(0, 0.02) bf16 (realistic exponent spread; not a checkpoint)",
            "timing": f"median of {REPLAYS} CUDA-graph replays, >= {MIN_CALLS} calls each, "
                      f"rotating over weight copies of >= {ROTATE_BYTES >> 20} MB"}
    emit(info)
    t_start = time.time()
    if not args.no_precompile:
        precompile(layouts, ms, [4096], args.quick, args.sweep_v1, args.workers)
    # one workspace big enough for every split-K call (allocated outside graph capture)
    L._workspace(dev, 64 * max((n for _, _, n in shapes), default=1 << 16), 1 << 16)
    rows = linear_rows(args, shapes, ms, layouts, dev, act, timer, sync, hbm, smoke, sms)

    sums = {}
    for m in ms:
        rs = [r for r in rows if r["M"] == m and r["shape"] in LAYER]
        if len(rs) != len(LAYER):
            continue
        rec = {"kind": "layer_sum", "M": m, "bf16_us": sum(r["bf16_us"] for r in rs)}
        for lay in layouts:
            if all(f"{lay}_us" in r for r in rs):
                rec[f"{lay}_us"] = sum(r[f"{lay}_us"] for r in rs)
                rec[f"{lay}_speedup"] = rec["bf16_us"] / rec[f"{lay}_us"]
        sums[m] = rec
        emit(rec)
    if "v2" in layouts:
        table = ["DEFAULT_CONFIGS = {  # specc/codegen/kernels/linear_bf12_v2.py"]
        for r in rows:
            if r.get("v2_params"):
                kw = ", ".join(f"{k}={v!r}" for k, v in r["v2_params"].items() if k != "esc_block")
                table.append(f"    ({r['M']}, {r['N']}, {r['K']}): Bf12v2Config({kw}),"
                             f"  # {r['v2_speedup']:.2f}x cuBLAS")
        table.append("}")
        print("\n".join(table), flush=True)
    else:
        table = []
    out = {"info": info, "linear": rows, "layer_sums": sums, "steps": [], "v2_default_configs_py": "\n".join(table),
           "wall_s": time.time() - t_start}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:  # the kernel half is kept even if the steps fail
        json.dump(out, f, indent=1)
    steps = []
    if args.steps:
        # what engines get per M: the faster of the Triton layout-2 kernel and the tensor-core one
        best = [(r["M"], max(r.get("v2_hbm_frac", 0.0), r.get("mma_hbm_frac", 0.0), r.get("mma3_hbm_frac", 0.0)))
                for r in rows]
        packed_by_m = {m: statistics.median(f for mm, f in best if mm == m and f > 0)
                       for m in ms if any(mm == m and f > 0 for mm, f in best)}
        packed_by_m = {m: min(1.0, v) for m, v in packed_by_m.items()}
        try:
            steps = step_rows(args, dev, torch.bfloat16, smoke, packed_by_m)  # bf16 weights: what bf12 packs
        except Exception as e:  # noqa: BLE001 - keep the kernel results, say what failed
            import traceback

            traceback.print_exc()
            steps = [{"kind": "step", "error": f"{type(e).__name__}: {str(e)[:800]}"}]
            emit(steps[0])
    out.update(steps=steps, wall_s=time.time() - t_start)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
