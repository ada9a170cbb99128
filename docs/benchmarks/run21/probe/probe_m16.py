"""Why is the bf12 tensor-core kernel ~12% slower per byte at 16 rows than at 1-8?

Third probe (PROBE_VARIANTS=base,tiled): tiled reads each 16-row block's planes as if stored in
64-weight tiles (a warp's loads: 1 KB contiguous), timing only (other weights, wrong results).

Second probe: xpf (each warp loads the next chunk's x fragments with the next chunk's weights,
so the MMAs never wait on an x load), against base, at M = 1, 8, 16; outputs compared bit for bit.

Ablations of the kernel (commit 82456e4's source, with NB = 1 or 2 blocks per CTA) built as
separate extensions: base; samexb (the second x tile loads the first tile's addresses: no extra
x traffic, both MMAs); onemma (both x tiles loaded, the second tile's MMA skipped). Timed alone
(CUDA graph over weight copies of >= 320 MB, median of replays) on Qwen3-8B shapes at M = 16
(and M = 8 / 1 with the base build for reference). Results are wrong for the ablations: timing only.
"""
import json
import os
import statistics
import sys

import torch
from torch.utils.cpp_extension import load

from specc.codegen.kernels.bf12_launch import escape_meta
from specc.formats.bf12 import pack_bf16_12bit

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp")
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}


def build(variant):
    flags = {"base": [], "samexb": ["-DPROBE_SAMEXB=1"], "onemma": ["-DPROBE_ONEMMA=1"], "xpf": ["-DPROBE_XPF=1"],
             "tiled": ["-DPROBE_TILED=1"]}[variant]
    return load(f"probe_bf12_{variant}", sources=[os.path.join(HERE, "probe.cu"), os.path.join(HERE, "probe_host.cpp")],
                extra_include_paths=[HERE], extra_cuda_cflags=["-O3", "-arch=sm_90", "-DSKINNY_L2_PREFETCH=256"] + flags,
                verbose=False)


def call(ext, x, p, meta, y, cfg):
    unroll, warps, prefetch, blocks = cfg
    unused = meta["rowptr"]
    ext.bf12_mma_out(x, p.sm, p.ex, meta["base"], meta["stride_base"], meta["rowptr"], meta["ecol"], meta["etrue"],
                     meta["efake"], unused, False, unused, False, 1e-6, unused, False, y, unused, unused,
                     1, blocks, unroll, warps, prefetch, True)


def time_us(fn_list, reps=15):
    for f in fn_list:
        f()
    torch.cuda.synchronize()
    inner = max(1, -(-48 // len(fn_list)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            for f in fn_list:
                f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / (inner * len(fn_list)))
    return statistics.median(ts)


def main():
    from concurrent.futures import ThreadPoolExecutor

    names = tuple(os.environ.get("PROBE_VARIANTS", "base,xpf").split(","))
    with ThreadPoolExecutor(3) as pool:  # three nvcc builds at once
        exts = dict(zip(names, pool.map(build, names)))
    print("built", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    configs16 = [(1, 8, False, 1), (2, 8, False, 1), (2, 4, True, 1), (2, 8, True, 1), (1, 4, True, 1),
                 (1, 8, True, 1), (1, 4, False, 2), (2, 4, False, 2)]
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
        p0 = pack_bf16_12bit(w, version=2)
        # the bf16 yardsticks: specc's own linear (the unpacked step's kernel, default config) and cuBLAS
        from specc.codegen.kernels.linear import linear as specc_linear
        ws_ = [w] + [w.clone() for _ in range(max(1, -(-320_000_000 // (2 * n * k))) - 1)]
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            for kind, fn in (("specc_bf16", lambda wi: specc_linear(x, wi)), ("cublas_bf16", lambda wi: torch.mm(x, wi.T))):
                us = time_us([lambda wi=wi, fn=fn: fn(wi) for wi in ws_])
                rec = {"shape": name, "M": m, "variant": kind, "unroll": 0, "warps": 0, "prefetch": False, "blocks": 0,
                       "us": us, "hbm_frac": 2 * n * k / (us * 1e-6) / 3.35e12, "equal_to_base": None}
                rows.append(rec)
                print(json.dumps(rec), flush=True)
        del w, ws_
        nbytes = p0.sm.numel() + p0.ex.numel()
        copies = max(1, -(-320_000_000 // nbytes))
        ps = [p0] + [type(p0)(sm=p0.sm.clone(), ex=p0.ex.clone(), base=p0.base.clone(), esc_idx=p0.esc_idx.clone(),
                              esc_val=p0.esc_val.clone(), shape=p0.shape, base_mode=p0.base_mode, version=p0.version)
                     for _ in range(copies - 1)]
        metas = [escape_meta(p) for p in ps]
        small = [(1, 8, True, 1), (2, 8, True, 1), (1, 4, True, 1), (2, 4, True, 1), (1, 8, False, 1)]
        for m, cfgs in ((1, small), (16, configs16)):
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            for cfg in cfgs:
                if n % (16 * cfg[3]):
                    continue
                outs = {}
                for v in names:
                    yv = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    call(exts[v], x, ps[0], metas[0], yv, cfg)
                    outs[v] = yv
                    us = time_us([lambda p=p, mt=mt, v=v: call(exts[v], x, p, mt, y, cfg) for p, mt in zip(ps, metas)])
                    rec = {"shape": name, "M": m, "variant": v, "unroll": cfg[0], "warps": cfg[1], "prefetch": cfg[2],
                           "blocks": cfg[3], "us": us, "hbm_frac": nbytes / (us * 1e-6) / 3.35e12,
                           "equal_to_base": bool(torch.equal(outs[v], outs["base"]))}
                    rows.append(rec)
                    print(json.dumps(rec), flush=True)
        del ps, metas
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "probe-m16.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
