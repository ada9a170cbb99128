"""Check and time specc's Triton kernels (specc/codegen/kernels) on one CUDA GPU, in one run.

    PYTHONPATH=. python examples/bench_kernels.py [--out DIR] [--budget SECONDS]

1. bf16 correctness of every kernel against its pure-torch reference (relative error, and for
   the element-wise kernels the fraction of outputs not bit-identical to the reference);
2. linear (Qwen3-8B shapes, M = 1, 4, 16, 64) against torch F.linear (cuBLAS);
3. attention (Q = 1, 16, 64 new tokens over 1024 / 4096 cached, Hq 32, Hkv 8, D 128, bs 1)
   against torch SDPA (enable_gqa; a boolean mask for Q > 1);
4. while the time budget lasts: config sweeps of linear and attention, fused norm+linear.

Timing: each measurement captures one CUDA graph that calls the op once per rotating copy of its
weights (>= 256 MB of distinct weights, so L2 (60 MB on an H200) cannot serve them) and replays
it; the figure is the median over replays divided by the calls per graph. Effective bandwidth
counts every byte an op must move once (weights + activations in + out; K/V for attention).
A table is printed and everything goes to DIR/bench_kernels.json (DIR: --out, else $OUT).

Compilation dominates a cold run, so the script first runs itself in ``--warm-shards`` parallel
"dry" processes, each compiling (and running once) its share of every kernel variant the run
will use; Triton's on-disk cache then serves the timed process. Timings start after they end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

# --smoke: exercise this script's code paths on the CPU (Triton interpreter, tiny shapes, no
# timing worth reading). TRITON_INTERPRET must be set before triton is imported.
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from bench_bf12 import replay_ms  # noqa: E402  (each replay's milliseconds; examples/ is on the path)

from specc.codegen.kernels import attention as A  # noqa: E402
from specc.codegen.kernels import embedding as E
from specc.codegen.kernels import greedy as G
from specc.codegen.kernels import kv_cache as KV
from specc.codegen.kernels import linear as L
from specc.codegen.kernels import rmsnorm as N
from specc.codegen.kernels import rope as R
from specc.codegen.kernels import swiglu as S
from specc.models import ops

DEV = "cpu" if SMOKE else "cuda"
BF = torch.bfloat16
ROT_BYTES = 256 << 20
# Qwen3-8B: hidden 4096, intermediate 12288, vocab 151936, 32 q heads, 8 kv heads, head dim 128
H, I, V = (256, 384, 1000) if SMOKE else (4096, 12288, 151936)
HQ, HKV, HD = (8, 2, 32) if SMOKE else (32, 8, 128)
CTXS = (64, 128) if SMOKE else (1024, 4096)
LENS = [0, 100, 250] if SMOKE else [0, 1000, 4000]
S_CAP = 330 if SMOKE else 4200
QWEN3_8B = [("qkv", (HQ + 2 * HKV) * HD, H), ("o", H, HQ * HD), ("gate_up", 2 * I, H),
            ("down", H, I), ("lm_head", V, H)]
MS = (1, 4, 16, 64)


def empty_cache():
    if not SMOKE:
        torch.cuda.empty_cache()


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


class Plan:
    """Which work items this process does: all (shard None), or every n-th (dry warm-up)."""

    shard: int | None = None
    nshards: int = 1
    counter: int = 0

    @classmethod
    def take(cls) -> bool:
        cls.counter += 1
        return cls.shard is None or (cls.counter - 1) % cls.nshards == cls.shard

    @classmethod
    def dry(cls) -> bool:
        return cls.shard is not None


def log(*a):
    if not Plan.dry():
        print(*a, flush=True)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def mismatch(a, b) -> float:
    return float((a != b).float().mean())


def time_calls(calls, reps: int = 25) -> float:
    """Median µs per call of a CUDA graph that runs every callable once (dry: call one once)."""
    if Plan.dry():
        calls[0]()
        sync()
        return float("nan")
    if SMOKE:
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) * 1e6 / len(calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    ts = replay_ms(g, reps)
    del g
    return statistics.median(ts) * 1e3 / len(calls)


def env_info() -> dict:
    if SMOKE:
        return {"gpu": "none (smoke run on the CPU, Triton interpreter)", "torch": torch.__version__,
                "triton": triton.__version__}
    p = torch.cuda.get_device_properties(0)
    info = {"gpu": p.name, "sms": p.multi_processor_count, "mem_gib": round(p.total_memory / 2**30, 1),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem",
                                         "--format=csv,noheader"], capture_output=True, text=True,
                                        timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        info["driver"] = f"n/a ({e})"
    # ceiling: device-to-device copy, bytes read + written
    a = torch.empty(1 << 29, dtype=torch.float16, device=DEV).normal_()  # 1 GiB
    b = torch.empty_like(a)
    us = time_calls([lambda: b.copy_(a)], reps=10)
    info["copy_TBps"] = round(2 * a.numel() * 2 / us / 1e6, 3)
    del a, b
    empty_cache()
    return info


# ------------------------------------------------------------------------------------------
# 1. correctness (bf16)
# ------------------------------------------------------------------------------------------
def correctness() -> list[dict]:
    rows = []

    def check(name, fn, limit):
        if not Plan.take():
            return
        try:
            t = time.time()
            metrics = fn()
            ok = all(v <= limit.get(k, math.inf) for k, v in metrics.items())
            rows.append({"check": name, "ok": ok, **{k: float(v) for k, v in metrics.items()},
                         "s": round(time.time() - t, 1)})
        except Exception as e:  # noqa: BLE001
            rows.append({"check": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
            traceback.print_exc()
        r = rows[-1]
        if Plan.dry():
            return
        log(f"  {'PASS' if r['ok'] else 'FAIL'} {name:42s} "
            + " ".join(f"{k}={v:.2e}" for k, v in r.items() if isinstance(v, float) and k != "s")
            + (f" {r.get('error', '')}" if not r["ok"] else ""))

    torch.manual_seed(0)
    # linear: every kernel path, odd sizes, bias, norm prologue, split-K
    cfgs = {
        "gemv": L.LinearConfig("gemv", block_n=16, block_k=256, split_k=1),
        "gemv-split": L.LinearConfig("gemv", block_n=16, block_k=128, split_k=5),
        "gemv-1d-x": L.LinearConfig("gemv", block_n=8, block_k=512, split_k=2, x_2d=False),
        "dot-swap": L.LinearConfig("dot", block_m=16, block_n=64, block_k=128, split_k=1),
        "dot-swap-split": L.LinearConfig("dot", block_m=64, block_n=64, block_k=128, split_k=3),
        "dot-noswap": L.LinearConfig("dot", block_m=64, block_n=128, block_k=64, split_k=2,
                                     swap_ab=False),
        "dot-prologue": L.LinearConfig("dot", block_m=16, block_n=64, block_k=128, split_k=2,
                                       norm_prologue=True),
        "auto": None,
    }
    for cname, cfg in cfgs.items():
        for m in ((1, 3) if cname.startswith("gemv") else (1, 16, 37, 64, 100)):
            for norm in (False, True):
                def f(cfg=cfg, m=m, norm=norm):
                    n, k = 1000, H if m != 37 else H - 96
                    x = torch.randn(m, k, device=DEV).to(BF)
                    w = (torch.randn(n, k, device=DEV) * 0.02).to(BF)
                    b = torch.randn(n, device=DEV).to(BF)
                    g = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF) if norm else None
                    y = L.linear(x, w, b, g, 1e-6, config=cfg)
                    ref = L.linear_reference(x.float(), w.float(), b.float(),
                                             None if g is None else g.float(), 1e-6)
                    out = {"rel": rel(y, ref)}
                    if norm:  # prologue rounds like ops.rms_norm: == plain kernel on the normed x
                        out["rel_vs_unfused"] = rel(y, L.linear(ops.rms_norm(x, g, 1e-6), w, b,
                                                                config=cfg))
                    return out
                check(f"linear {cname} m={m}{' +norm' if norm else ''}", f,
                      {"rel": 8e-3, "rel_vs_unfused": 2e-3})

    def graph_replay():  # split-K counters reset: CUDA-graph replays give the eager result
        if SMOKE:
            return {"mismatch_vs_eager": 0.0}
        x = torch.randn(1, 4096, device=DEV).to(BF)
        w = (torch.randn(4096, 4096, device=DEV) * 0.02).to(BF)
        cfg = L.LinearConfig("gemv", block_n=16, block_k=256, split_k=4)
        eager = L.linear(x, w, config=cfg)
        gr = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            L.linear(x, w, config=cfg)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(gr):
            y = L.linear(x, w, config=cfg)
        diffs = 0.0
        for _ in range(5):
            x.copy_(torch.randn_like(x))
            gr.replay()
            torch.cuda.synchronize()
            diffs += mismatch(y, L.linear(x, w, config=cfg))
        return {"mismatch_vs_eager": diffs + mismatch(eager, eager)}
    check("linear split-K graph replays == eager", graph_replay, {"mismatch_vs_eager": 0.0})

    # attention
    for num_q, kind in ((1, "causal"), (16, "causal"), (16, "full"), (64, "causal"), (5, "tree"),
                        (16, "tree")):
        def f(num_q=num_q, kind=kind):
            bsz, hq, hkv, d, s = 3, HQ, HKV, HD, S_CAP
            q = torch.randn(bsz, num_q, hq, d, device=DEV).to(BF)
            ck = torch.randn(bsz, hkv, s, d, device=DEV).to(BF)
            cv = torch.randn(bsz, hkv, s, d, device=DEV).to(BF)
            cl = torch.tensor(LENS, device=DEV)
            tm = None
            if kind == "tree":
                tm = torch.tril(torch.rand(bsz, num_q, num_q, device=DEV) < 0.5)
                tm |= torch.eye(num_q, dtype=torch.bool, device=DEV)
            out = A.attention(q, ck, cv, cl, num_q, kind, d ** -0.5, tree_mask=tm)
            ref = A.attention_reference(q, ck, cv, cl, num_q, kind, d ** -0.5, tree_mask=tm)
            res = {"rel": rel(out, ref)}
            if kind != "tree":  # the model's eager op (bf16 scores) on the same cache
                ck2, cv2 = ck.clone(), cv.clone()
                k_new = torch.stack([ck[b, :, int(cl[b]):int(cl[b]) + num_q] for b in range(bsz)]
                                    ).transpose(1, 2)
                v_new = torch.stack([cv[b, :, int(cl[b]):int(cl[b]) + num_q] for b in range(bsz)]
                                    ).transpose(1, 2)
                res["rel_vs_ops"] = rel(out, ops.attention(q, k_new, v_new, ck2, cv2, cl, kind,
                                                           d ** -0.5))
            for splits in (1, 7):
                o2 = A.attention(q, ck, cv, cl, num_q, kind, d ** -0.5, tree_mask=tm,
                                 num_splits=splits)
                res[f"rel_splits{splits}"] = rel(o2, ref)
            return res
        check(f"attention q={num_q} {kind}", f,
              {"rel": 1e-2, "rel_vs_ops": 2e-2, "rel_splits1": 1e-2, "rel_splits7": 1e-2})

    # rope + cache write
    for qk_norm in (False, True):
        def f(qk_norm=qk_norm):
            bsz, num_q, num_k, hq, hkv, d, s = 3, 16, 20, HQ, HKV, HD, S_CAP
            q = (torch.randn(bsz, num_q, hq, d, device=DEV) * 2).to(BF)
            k = (torch.randn(bsz, num_k, hkv, d, device=DEV) * 2).to(BF)
            v = torch.randn(bsz, num_k, hkv, d, device=DEV).to(BF)
            cl = torch.tensor(LENS, device=DEV)
            pos = cl[:, None] + torch.arange(num_k, device=DEV)[None]
            inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV).float() / d))
            qw = (1 + 0.1 * torch.randn(d, device=DEV)).to(BF) if qk_norm else None
            kw = (1 + 0.1 * torch.randn(d, device=DEV)).to(BF) if qk_norm else None
            ck = torch.randn(bsz, hkv, s, d, device=DEV).to(BF)
            cv = torch.randn(bsz, hkv, s, d, device=DEV).to(BF)
            ck_r, cv_r = ck.clone(), cv.clone()
            out = R.rope_and_cache(q, k, v, pos, inv, ck, cv, cl, qw, kw, 1e-6)
            ref = R.rope_and_cache_reference(q, k, v, pos, inv, ck_r, cv_r, cl, qw, kw, 1e-6)
            return {"rel": rel(out, ref), "mismatch_q": mismatch(out, ref),
                    "mismatch_k": mismatch(ck, ck_r), "mismatch_v": mismatch(cv, cv_r)}
        check(f"rope_and_cache{' +qk_norm' if qk_norm else ''}", f,
              {"rel": 1e-2, "mismatch_q": 0.01, "mismatch_k": 0.01, "mismatch_v": 0.0})

    def f_swiglu():
        gu = (torch.randn(64, 2 * I, device=DEV) * 3).to(BF)
        y = S.swiglu(gu)
        ref = S.swiglu_reference(gu)
        y2 = S.silu_mul(gu[:, :I], gu[:, I:])
        return {"rel": rel(y, ref), "mismatch": mismatch(y, ref), "mismatch_sep": mismatch(y2, ref)}
    check("swiglu / silu_mul", f_swiglu, {"rel": 1e-2, "mismatch": 0.01, "mismatch_sep": 0.01})

    def f_emb():
        w = torch.randn(V, H, device=DEV).to(BF)
        ids = torch.randint(0, V, (32, 16), device=DEV)
        return {"mismatch": mismatch(E.embedding(ids, w), F.embedding(ids, w))}
    check("embedding", f_emb, {"mismatch": 0.0})

    def f_rms():
        x = torch.randn(64, H, device=DEV).to(BF)
        r = torch.randn(64, H, device=DEV).to(BF)
        w = (1 + 0.1 * torch.randn(H, device=DEV)).to(BF)
        y, s = N.rms_norm(x, w, 1e-6, residual=r)
        y1 = N.rms_norm(x, w, 1e-6)
        return {"mismatch_sum": mismatch(s, x + r), "mismatch": mismatch(y, ops.rms_norm(x + r, w, 1e-6)),
                "mismatch_plain": mismatch(y1, ops.rms_norm(x, w, 1e-6)),
                "rel": rel(y, ops.rms_norm((x + r).float(), w.float(), 1e-6))}
    check("rms_norm (+residual)", f_rms, {"mismatch_sum": 0.0, "mismatch": 0.01,
                                          "mismatch_plain": 0.01, "rel": 1e-2})

    def f_argmax():
        x = torch.randn(17, V, device=DEV).to(BF)
        x[3, [7, V - 1000]] = 100.0
        x[5, [V // 2, 900]] = float("nan")
        x[6] = float("-inf")
        xf = torch.randn(5, V, device=DEV)
        return {"mismatch": mismatch(G.argmax(x), torch.argmax(x, -1)),
                "mismatch_fp32": mismatch(G.argmax(xf), torch.argmax(xf, -1))}
    check("argmax V=151936 (ties, NaN, -inf)", f_argmax, {"mismatch": 0.0, "mismatch_fp32": 0.0})

    def f_accept():
        bsz, k, v = 32, 15, V
        logits = torch.randn(bsz, k + 1, v, device=DEV).to(BF)
        target = torch.argmax(logits, -1)
        drafts = target[:, :k].clone()
        cut = torch.randint(0, k + 1, (bsz,), device=DEV)
        for b in range(bsz):
            if int(cut[b]) < k:
                drafts[b, int(cut[b])] += 1
        out = torch.full((bsz, 64), -1, dtype=torch.long, device=DEV)
        pos = torch.randint(0, 40, (bsz,), device=DEV)
        out_r, pos_r = out.clone(), pos.clone()
        a, nxt, tgt = G.greedy_verify(logits, drafts, None, out, pos)
        a_r, n_r, _ = G.greedy_verify_reference(logits, drafts, None, out_r, pos_r)
        return {"mismatch_a": mismatch(a, a_r) + mismatch(a, cut), "mismatch_next": mismatch(nxt, n_r),
                "mismatch_out": mismatch(out, out_r) + mismatch(pos, pos_r)}
    check("greedy_verify B=32 K=15", f_accept, {"mismatch_a": 0.0, "mismatch_next": 0.0,
                                               "mismatch_out": 0.0})

    def f_kv():
        ck = torch.randn(8, HKV, S_CAP, HD, device=DEV).to(BF)
        cv = torch.randn(8, HKV, S_CAP, HD, device=DEV).to(BF)
        src = torch.randint(LENS[1], LENS[1] + 64, (8, 16), device=DEV).sort(dim=1).values
        dst = LENS[1] + torch.arange(16, device=DEV).expand(8, -1).contiguous()
        cnt = torch.randint(0, 17, (8,), device=DEV)
        ck_r, cv_r = ck.clone(), cv.clone()
        KV.kv_compact(ck, cv, src, dst, cnt)
        KV.kv_compact_reference(ck_r, cv_r, src, dst, cnt)
        return {"mismatch": mismatch(ck, ck_r) + mismatch(cv, cv_r)}
    check("kv_compact (overlapping slots)", f_kv, {"mismatch": 0.0})
    return rows


# ------------------------------------------------------------------------------------------
# 2. linear vs cuBLAS
# ------------------------------------------------------------------------------------------
def weight_copies(n, k):
    nbytes = n * k * 2
    copies = 1 if Plan.dry() or SMOKE else max(1, math.ceil(ROT_BYTES / nbytes))
    return [(torch.randn(n, k, device=DEV) * 0.02).to(BF) for _ in range(copies)]


def calls_for(fn, ws, x, min_calls=4):
    reps = max(1, math.ceil(min_calls / len(ws)))
    return [lambda w=w: fn(x, w) for w in ws] * reps


def linear_bytes(m, n, k):
    return (n * k + m * k + m * n) * 2


def bench_linear(deadline) -> list[dict]:
    rows = []
    for name, n, k in QWEN3_8B:
        ws = None
        for m in MS:
            if not Plan.take():
                continue
            if time.time() > deadline and not Plan.dry():
                log(f"  (time budget reached: skipping linear {name} M={m})")
                continue
            ws = ws or weight_copies(n, k)
            x = torch.randn(m, k, device=DEV).to(BF)
            cfg = L.get_config(m, n, k)
            row = {"shape": name, "N": n, "K": k, "M": m, "config": cfg.__dict__.copy()}
            try:
                t_tr = time_calls(calls_for(lambda a, w: L.linear(a, w), ws, x))
                t_cb = time_calls(calls_for(lambda a, w: F.linear(a, w), ws, x))
                nb = linear_bytes(m, n, k)
                row.update(us_triton=t_tr, us_cublas=t_cb, TBps_triton=nb / t_tr / 1e6,
                           TBps_cublas=nb / t_cb / 1e6, speedup=t_cb / t_tr)
                log(f"  {name:8s} M={m:3d} triton {t_tr:8.1f} us {nb / t_tr / 1e6:5.2f} TB/s | "
                    f"cuBLAS {t_cb:8.1f} us {nb / t_cb / 1e6:5.2f} TB/s | x{t_cb / t_tr:5.2f}")
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            rows.append(row)
        del ws
        empty_cache()
    return rows


GEMV_SWEEP = [
    L.LinearConfig("gemv", block_n=16, block_k=256, split_k=0, num_warps=4, num_stages=1),
    L.LinearConfig("gemv", block_n=8, block_k=512, split_k=0, num_warps=4, num_stages=1),
    L.LinearConfig("gemv", block_n=16, block_k=512, split_k=0, num_warps=8, num_stages=1),
    L.LinearConfig("gemv", block_n=32, block_k=256, split_k=0, num_warps=8, num_stages=1),
    L.LinearConfig("gemv", block_n=4, block_k=1024, split_k=0, num_warps=4, num_stages=1),
    L.LinearConfig("gemv", block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=1),
    L.LinearConfig("gemv", block_n=16, block_k=256, split_k=0, num_warps=4, num_stages=3),
    L.LinearConfig("gemv", block_n=16, block_k=256, split_k=0, num_warps=4, num_stages=1,
                   x_2d=False),
    L.LinearConfig("gemv", block_n=32, block_k=512, split_k=0, num_warps=8, num_stages=1),
    L.LinearConfig("gemv", block_n=8, block_k=256, split_k=0, num_warps=2, num_stages=1),
]


def dot_sweep(m):
    bm = max(16, m)
    return [
        L.LinearConfig("dot", block_m=bm, block_n=64, block_k=128, split_k=0, num_warps=4, num_stages=4),
        L.LinearConfig("dot", block_m=bm, block_n=128, block_k=64, split_k=0, num_warps=4, num_stages=4),
        L.LinearConfig("dot", block_m=bm, block_n=64, block_k=256, split_k=0, num_warps=4, num_stages=3),
        L.LinearConfig("dot", block_m=bm, block_n=128, block_k=128, split_k=0, num_warps=8, num_stages=3),
        L.LinearConfig("dot", block_m=bm, block_n=32, block_k=128, split_k=0, num_warps=4, num_stages=4),
        L.LinearConfig("dot", block_m=bm, block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4),
        L.LinearConfig("dot", block_m=bm, block_n=64, block_k=128, split_k=0, num_warps=4, num_stages=4,
                       swap_ab=False),
    ]


def sweep_linear(deadline) -> list[dict]:
    rows = []
    for m in (1, 16, 64, 4):
        for name, n, k in QWEN3_8B:
            if time.time() > deadline and not Plan.dry():
                log(f"  (time budget reached: sweep stops before M={m} {name})")
                return rows
            ws = None
            x = torch.randn(m, k, device=DEV).to(BF)
            nb = linear_bytes(m, n, k)
            best = None
            for cfg in (GEMV_SWEEP if m == 1 else dot_sweep(m)):
                if not Plan.take():
                    continue
                if time.time() > deadline and not Plan.dry():
                    break
                ws = ws or weight_copies(n, k)
                try:
                    t = time_calls(calls_for(lambda a, w, cfg=cfg: L.linear(a, w, config=cfg), ws, x),
                                   reps=15)
                    rows.append({"shape": name, "M": m, "N": n, "K": k, "config": cfg.__dict__.copy(),
                                 "us": t, "TBps": nb / t / 1e6})
                    if not math.isnan(t) and (best is None or t < best[0]):
                        best = (t, cfg)
                except Exception as e:  # noqa: BLE001
                    rows.append({"shape": name, "M": m, "config": cfg.__dict__.copy(),
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"})
            if best:
                c = best[1]
                log(f"  best {name:8s} M={m:3d} {best[0]:8.1f} us {nb / best[0] / 1e6:5.2f} TB/s  "
                    f"{c.kind} bm={c.block_m} bn={c.block_n} bk={c.block_k} split={c.split_k} "
                    f"w={c.num_warps} st={c.num_stages} swap={c.swap_ab} x2d={c.x_2d}")
            del ws
            empty_cache()
    return rows


def bench_norm_linear(deadline) -> list[dict]:
    rows = []
    for name, n, k in (QWEN3_8B[0], QWEN3_8B[2]):
        ws = None
        g = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
        for m in (1, 16):
            if not Plan.take():
                continue
            if time.time() > deadline and not Plan.dry():
                return rows
            ws = ws or weight_copies(n, k)
            x = torch.randn(m, k, device=DEV).to(BF)
            t_f = time_calls(calls_for(lambda a, w: L.linear(a, w, None, g, 1e-6), ws, x))
            t_u = time_calls(calls_for(lambda a, w: L.linear(N.rms_norm(a, g, 1e-6), w), ws, x))
            t_t = time_calls(calls_for(lambda a, w: F.linear(
                F.rms_norm(a, (k,), g, 1e-6), w), ws, x))
            rows.append({"shape": name, "M": m, "us_fused": t_f, "us_triton_unfused": t_u,
                         "us_torch": t_t})
            log(f"  norm+{name:8s} M={m:3d} fused {t_f:7.1f} us | rms_norm kernel + linear "
                f"{t_u:7.1f} us | F.rms_norm + F.linear {t_t:7.1f} us")
        del ws
        empty_cache()
    return rows


# ------------------------------------------------------------------------------------------
# 3. attention vs SDPA
# ------------------------------------------------------------------------------------------
def _attn_setup(ctx, num_q, hkv=HKV, d=HD):
    s_cap = ctx + 64
    per = 2 * hkv * s_cap * d * 2
    copies = 1 if Plan.dry() or SMOKE else max(1, math.ceil(ROT_BYTES / per))
    return [(torch.randn(1, hkv, s_cap, d, device=DEV).to(BF),
             torch.randn(1, hkv, s_cap, d, device=DEV).to(BF)) for _ in range(copies)]


def bench_attention(deadline) -> list[dict]:
    rows = []
    hq, hkv, d = HQ, HKV, HD
    scale = d ** -0.5
    for ctx in CTXS:
        caches = None
        cl = torch.tensor([ctx], device=DEV)
        for num_q in (1, 16, 64):
            if not Plan.take():
                continue
            if time.time() > deadline and not Plan.dry():
                log(f"  (time budget reached: skipping attention ctx={ctx} Q={num_q})")
                continue
            caches = caches or _attn_setup(ctx, num_q)
            kv_len = ctx + num_q
            q = torch.randn(1, num_q, hq, d, device=DEV).to(BF)
            qt = q.transpose(1, 2).contiguous()
            mask = None
            if num_q > 1:
                kpos = torch.arange(kv_len, device=DEV)[None, :]
                mask = kpos <= (ctx + torch.arange(num_q, device=DEV))[:, None]
            nbytes = 2 * hkv * kv_len * d * 2 + 2 * num_q * hq * d * 2
            plan = A.launch_plan(1, num_q, hq, hkv, d, kv_len, torch.device(DEV))
            row = {"ctx": ctx, "Q": num_q, "kv_len": kv_len, "plan": plan,
                   "sdpa_mask": "none (all visible)" if mask is None else "bool [Q, kv_len]"}
            try:
                tr = [lambda c=c: A.attention(q, c[0], c[1], cl, num_q, "causal", scale,
                                              max_kv_len=kv_len) for c in caches]
                sd = [lambda c=c: F.scaled_dot_product_attention(
                    qt, c[0][:, :, :kv_len], c[1][:, :, :kv_len], attn_mask=mask, scale=scale,
                    enable_gqa=True) for c in caches]
                t_tr = time_calls(tr)
                t_sd = time_calls(sd)
                row.update(us_triton=t_tr, us_sdpa=t_sd, TBps_triton=nbytes / t_tr / 1e6,
                           TBps_sdpa=nbytes / t_sd / 1e6, speedup=t_sd / t_tr)
                log(f"  ctx={ctx:5d} Q={num_q:3d} triton {t_tr:7.1f} us {nbytes / t_tr / 1e6:5.2f} TB/s"
                    f" | SDPA {t_sd:7.1f} us {nbytes / t_sd / 1e6:5.2f} TB/s | x{t_sd / t_tr:5.2f}"
                    f"  (splits {plan['num_splits']}, block_m {plan['block_m']})")
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            rows.append(row)
        del caches
        empty_cache()
    return rows


def sweep_attention(deadline) -> list[dict]:
    rows = []
    hq, hkv, d, ctx = HQ, HKV, HD, CTXS[-1]
    scale = d ** -0.5
    cl = torch.tensor([ctx], device=DEV)
    caches = None
    for num_q in (1, 16, 64):
        kv_len = ctx + num_q
        q = torch.randn(1, num_q, hq, d, device=DEV).to(BF)
        base = A.launch_plan(1, num_q, hq, hkv, d, kv_len, torch.device(DEV))["num_splits"]
        best = None
        for ns in sorted({max(1, base // 2), base, base * 2}):
            for bn, nw, st in ((64, 4, 2), (128, 4, 2), (64, 8, 2), (64, 4, 3), (32, 4, 2)):
                if not Plan.take():
                    continue
                if time.time() > deadline and not Plan.dry():
                    log(f"  (time budget reached: attention sweep stops at Q={num_q})")
                    return rows
                caches = caches or _attn_setup(ctx, num_q)
                row = {"ctx": ctx, "Q": num_q, "num_splits": ns, "block_n": bn, "num_warps": nw,
                       "num_stages": st}
                try:
                    t = time_calls([lambda c=c, ns=ns, bn=bn, nw=nw, st=st: A.attention(
                        q, c[0], c[1], cl, num_q, "causal", scale, num_splits=ns, block_n=bn,
                        num_warps=nw, num_stages=st) for c in caches], reps=15)
                    row["us"] = t
                    if not math.isnan(t) and (best is None or t < best[0]):
                        best = (t, row)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
        if best:
            b = best[1]
            log(f"  best Q={num_q:3d} ctx={ctx}: {best[0]:7.1f} us  splits={b['num_splits']} "
                f"(default {base}) block_n={b['block_n']} warps={b['num_warps']} "
                f"stages={b['num_stages']}")
    del caches
    empty_cache()
    return rows


# ------------------------------------------------------------------------------------------
def print_tables(res):
    log("\n## linear (bf16, CUDA graph, rotating weights), us and effective TB/s")
    log("| shape | N x K | M | Triton us | Triton TB/s | cuBLAS us | cuBLAS TB/s | cuBLAS/Triton |")
    log("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in res.get("linear", []):
        if "us_triton" in r:
            log(f"| {r['shape']} | {r['N']} x {r['K']} | {r['M']} | {r['us_triton']:.1f} | "
                f"{r['TBps_triton']:.2f} | {r['us_cublas']:.1f} | {r['TBps_cublas']:.2f} | "
                f"{r['speedup']:.2f} |")
    log("\n## attention (bf16, bs 1, Hq 32, Hkv 8, D 128, causal), us")
    log("| context | Q | Triton us | Triton TB/s | SDPA us | SDPA TB/s | SDPA/Triton |")
    log("| --- | --- | --- | --- | --- | --- | --- |")
    for r in res.get("attention", []):
        if "us_triton" in r:
            log(f"| {r['ctx']} | {r['Q']} | {r['us_triton']:.1f} | {r['TBps_triton']:.2f} | "
                f"{r['us_sdpa']:.1f} | {r['TBps_sdpa']:.2f} | {r['speedup']:.2f} |")
    fails = [c for c in res.get("correctness", []) if not c["ok"]]
    n = len(res.get("correctness", []))
    log(f"\ncorrectness: {n - len(fails)}/{n} checks pass"
        + ("" if not fails else ": FAILED " + ", ".join(c["check"] for c in fails)))


def run_sections(args, t0, res, save):
    deadline = t0 + args.budget
    sections = [
        ("env", env_info),
        ("correctness", correctness),
        ("linear", lambda: bench_linear(t0 + args.budget * 0.7)),
        ("attention", lambda: bench_attention(t0 + args.budget * 0.8)),
        ("linear_sweep", lambda: sweep_linear(deadline)),
        ("attention_sweep", lambda: sweep_attention(deadline)),
        ("norm_linear", lambda: bench_norm_linear(deadline)),
    ]
    for name, fn in sections:
        if Plan.dry() and name == "env":
            continue
        log(f"\n# {name} (t = {time.time() - t0:.0f} s)")
        try:
            res[name] = fn()
            if name == "env":
                log("  " + json.dumps(res[name]))
        except Exception as e:  # noqa: BLE001
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            if not Plan.dry():
                traceback.print_exc()
        save()


def warm(args) -> dict:
    """Compile every kernel variant in parallel dry processes (Triton's disk cache keeps them)."""
    t = time.time()
    procs = []
    for i in range(args.warm_shards):
        cmd = [sys.executable, os.path.abspath(__file__), "--shard", f"{i}/{args.warm_shards}",
               "--out", os.path.join(args.out, "warm")] + (["--smoke"] if SMOKE else [])
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    codes, tails = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(5.0, args.warm_timeout - (time.time() - t)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        codes.append(p.returncode)
        if p.returncode:
            tails.append(out[-1500:])
    info = {"shards": args.warm_shards, "seconds": round(time.time() - t, 1), "returncodes": codes}
    if tails:
        info["failed_tails"] = tails
    log(f"  warm-up: {args.warm_shards} processes, {info['seconds']} s, return codes {codes}")
    for tail in tails[:2]:
        log("  --- failed warm process output (tail) ---\n" + tail)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_kernels"))
    ap.add_argument("--budget", type=float, default=170.0,
                    help="seconds (after warm-up) before optional parts stop")
    ap.add_argument("--warm-shards", type=int, default=12, help="parallel compile processes (0: none)")
    ap.add_argument("--warm-timeout", type=float, default=120.0)
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="CPU smoke run of the script itself")
    args = ap.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)
    if args.shard:
        Plan.shard, Plan.nshards = (int(v) for v in args.shard.split("/"))
        run_sections(args, time.time(), {}, lambda: None)
        return
    t_start = time.time()
    res = {"command": " ".join([sys.executable] + sys.argv)}
    path = os.path.join(args.out, "bench_kernels.json")

    def save():
        res["elapsed_s"] = round(time.time() - t_start, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    if args.warm_shards > 0:
        log("# warm-up (parallel compilation)")
        res["warm"] = warm(args)
    run_sections(args, time.time(), res, save)
    print_tables(res)
    log(f"\nwrote {path} after {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
