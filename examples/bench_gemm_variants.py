"""Ways to run one bf16 linear ``y = x W^T`` at the row counts of batched verification (M = 128-512),
timed side by side: which lowering of a large-M linear wastes the fewest SMs.

At B = 16, Q = 16 a verify step runs every linear at 256 rows. There the small-N weights (q/k/v,
o, down: N = 4096-6144) reach only 0.62-0.76 of the bf16 peak through cuBLAS on the H200
(docs/benchmarks/linears-h200-run8.json) while gate_up and the lm_head reach 0.94-0.99: with
128 x 128 output tiles an N = 4096, M = 256 product has 64 tiles for 132 SMs. Variants timed:

- ``cublas``: ``F.linear`` (what specc's cuBLAS lowering runs today);
- ``cublaslt``: the same under ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
- ``bias``: ``F.linear`` with a zero bias (torch's addmm path, cuBLASLt's bias epilogue);
- ``splitS_f32``: split-K by S as one strided batched GEMM with fp32 outputs (``torch.bmm(...,
  out_dtype=torch.float32)``), the S partials summed in fp32 and rounded once: 2-4x the tiles;
- ``splitS_bf16``: the same with bf16 partials (an extra rounding per partial);
- ``triton``: specc's Triton linear at that M.

Each variant's time is the median of CUDA-graph replays over weight copies past twice the L2
(``specc.search.calibrate``), with its TFLOP/s and its error against an fp32 product (max |y -
ref| / max |ref|, beside cuBLAS's own).

    PYTHONPATH=. python3 examples/bench_gemm_variants.py --out $OUT/gemm_variants.json   # ~1-2 min (GPU)
    PYTHONPATH=. python3 examples/bench_gemm_variants.py --device cpu --ms 8 --small      # CPU smoke

``--record FILE`` merges the cuBLAS times into a linear-choice table of measured cuBLAS times (the
format of ``specc/data/cublas-times-*.json``, which the GPUs' built-in rules carry: the cost model
prices cuBLAS rows of those shapes from them), replacing the rows measured again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096),
          # the DFlash-b16 drafter's own: its K/V projection (over context + block rows) and the
          # projection of the target's hidden states (its q_proj is o's shape)
          "draft_kv": (2048, 4096), "draft_fc": (4096, 20480)}
DEFAULT_SHAPES = ("qkv", "o", "gate_up", "down", "lm_head")
SMALL_SHAPES = {"o": (64, 64), "down": (64, 192)}
GRAPH_NODE_S = 1.5e-6  # the launch each timed call includes (a CUDA-graph node): a new table's overhead_s


@contextlib.contextmanager
def blas_library(name: str):
    """``preferred_blas_library`` set to ``name`` inside the block (CUDA only)."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def split_k(x: torch.Tensor, w: torch.Tensor, splits: int, fp32: bool) -> torch.Tensor:
    """``x @ w^T`` as ``splits`` K-slices in one strided batched GEMM, partials summed in fp32."""
    m, k = x.shape
    n = w.shape[0]
    xs = x.view(m, splits, k // splits).transpose(0, 1)  # [S, M, K/S]
    ws = w.view(n, splits, k // splits).permute(1, 2, 0)  # [S, K/S, N], column-major slices of w
    if fp32:
        parts = torch.bmm(xs, ws, out_dtype=torch.float32)
        return parts.sum(0).to(x.dtype)
    return torch.bmm(xs, ws).sum(0, dtype=torch.float32).to(x.dtype)


def variants(device: str) -> dict:
    """name -> (fn(x, w, zero_bias), context manager factory)."""
    out = {"cublas": (lambda x, w, b: F.linear(x, w), contextlib.nullcontext),
           "bias": (lambda x, w, b: F.linear(x, w, b), contextlib.nullcontext)}
    if device == "cuda":
        out["cublaslt"] = (lambda x, w, b: F.linear(x, w), lambda: blas_library("cublaslt"))
        for s in (2, 4):
            out[f"split{s}_f32"] = (lambda x, w, b, s=s: split_k(x, w, s, True), contextlib.nullcontext)
            out[f"split{s}_bf16"] = (lambda x, w, b, s=s: split_k(x, w, s, False), contextlib.nullcontext)
        from specc.codegen.kernels.linear import linear as triton_linear

        out["triton"] = (lambda x, w, b: triton_linear(x, w), contextlib.nullcontext)
    return out


def main(argv: list[str] | None = None) -> dict:
    from specc.search.calibrate import Timer, copies_past_cache

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ms", default="128,192,256,384,512", help="row counts, comma separated")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                    help="weight shapes by name (default: the target's): " + ",".join(SHAPES))
    ap.add_argument("--variants", default="", help="only these variants, comma separated (default: all)")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke run)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="gemm_variants.json")
    ap.add_argument("--record", help="merge the cuBLAS times into this linear-choice table of cuBLAS times")
    opts = ap.parse_args(argv)
    dev = opts.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    names = [n for n in opts.shapes.split(",") if n]
    if not opts.small and not set(names) <= set(SHAPES):
        ap.error(f"--shapes: unknown {sorted(set(names) - set(SHAPES))}; known: {','.join(SHAPES)}")
    table = SMALL_SHAPES if opts.small else {n: SHAPES[n] for n in names}
    ms = [int(m) for m in opts.ms.split(",") if m.strip()]
    timer = Timer(dev, reps=opts.reps)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if dev == "cuda" else 32 << 20
    gen = torch.Generator(device=dev).manual_seed(0)
    wanted = {v for v in opts.variants.split(",") if v}
    timed = {name: v for name, v in variants(dev).items()
             if not wanted or name in wanted or name == "cublas"}  # cuBLAS: every row's yardstick
    rows, t0 = [], time.perf_counter()
    for name, (n, k) in table.items():
        wbytes = n * k * 2
        copies = copies_past_cache(wbytes, l2) if dev == "cuda" else 2
        weights = [torch.randn(n, k, device=dev, dtype=dtype, generator=gen) * 0.02 for _ in range(copies)]
        bias = torch.zeros(n, device=dev, dtype=dtype)
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=dtype, generator=gen)
            ref = x.float() @ weights[0].float().T
            scale = ref.abs().max().item()
            row = {"shape": name, "M": m, "N": n, "K": k, "copies": copies}
            for vname, (fn, ctx) in timed.items():
                if vname.startswith("split") and k % int(vname[5]) != 0:
                    continue
                try:
                    with ctx(), torch.inference_mode():
                        err = (fn(x, weights[0], bias).float() - ref).abs().max().item() / scale

                        def run(fn=fn):
                            for w in weights:
                                fn(x, w, bias)

                        sec = timer(run, inner=copies)
                except Exception as e:  # noqa: BLE001 - a variant this torch cannot run is reported, not fatal
                    row[vname] = {"error": f"{type(e).__name__}: {e}"[:200]}
                    continue
                row[vname] = {"us": sec * 1e6, "tflops": 2.0 * m * n * k / sec / 1e12, "rel_err": err}
            best = min((v for v in row if isinstance(row[v], dict) and "us" in row[v]), key=lambda v: row[v]["us"])
            row["best"] = best
            row["best_vs_cublas"] = row["cublas"]["us"] / row[best]["us"]
            rows.append(row)
            print(f"{name:8s} M={m:4d} " + " ".join(
                f"{v}={row[v]['us']:.1f}" for v in row if isinstance(row[v], dict) and "us" in row[v])
                + f"  best {best} {row['best_vs_cublas']:.3f}x", flush=True)
        weights = []
    record = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
              "torch": torch.__version__, "seconds": time.perf_counter() - t0, "rows": rows}
    with open(opts.out, "w") as f:
        json.dump(record, f, indent=1)
    if opts.record:
        merge_cublas_times(opts.record, rows, f"{record['device']}, torch {record['torch']}, {record['date']}")
    return record


def merge_cublas_times(path: str, rows: list[dict], measured_on: str):
    """Merge each row's cuBLAS time into the linear-choice table at ``path`` (made if missing):
    points keyed by (N, K, M), a new time replacing an old one; the source says where the new
    ones came from. Returns the table written."""
    import dataclasses
    from pathlib import Path

    from specc.codegen.linear_choice import ChoicePoint, LinearChoice, ShapeChoice

    file = Path(path)
    old = LinearChoice.from_json(json.loads(file.read_text())) if file.exists() else \
        LinearChoice({}, overhead_s=GRAPH_NODE_S, source="F.linear (cuBLAS)")
    points = {key: {p.m: p for p in shape.points} for key, shape in old.shapes.items()}
    for r in rows:
        points.setdefault((r["N"], r["K"]), {})[r["M"]] = ChoicePoint(r["M"], "cublas",
                                                                     cublas_s=round(r["cublas"]["us"] * 1e-6, 9))
    shapes = {key: ShapeChoice(*key, tuple(by_m[m] for m in sorted(by_m))) for key, by_m in sorted(points.items())}
    measured = ",".join(str(m) for m in sorted({r["M"] for r in rows}))
    table = dataclasses.replace(old, shapes=shapes,
                                source=f"{old.source}; M = {measured} on {measured_on} (examples/bench_gemm_variants.py)")
    file.write_text(json.dumps(table.to_json(), indent=1) + "\n")
    return table


if __name__ == "__main__":
    main()
