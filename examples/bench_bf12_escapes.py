"""What the bf12 escape fix-up costs: layout-1 kernel times with and without its escape table.

Per Qwen3-8B linear shape and M (1 and 16), on a GPU: specc's bf16 Triton linear, cuBLAS, the
layout-1 bf12 kernel (its table config) on the packed weights, and the same kernel on the same
planes with the escape table emptied, so it compiles without the fix-up (its output is wrong at
the ~7.7e-5 escaped weights: a timing bound only). Timing as ``bench_bf12.py``: median of
CUDA-graph replays rotating over weight copies larger than L2. One JSON line per row, and all
rows in ``--out``.

    PYTHONPATH=. python3 examples/bench_bf12_escapes.py --out $OUT/bf12-escapes.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_bf12 as B  # noqa: E402  (the timer, the shapes and the packed-copy helper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bf12-escapes.json")
    ap.add_argument("--ms", default="1,16")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_bf12_escapes.py times CUDA kernels: run it on a GPU")
    from specc.codegen.kernels import linear_bf12 as L
    from specc.codegen.kernels.linear import linear as triton_linear
    from specc.formats import pack_bf16_12bit

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, k, n in B.SHAPES:
        w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
        p = pack_bf16_12bit(w, version=1)
        ps = [p] + [B.clone_packed(p) for _ in range(max(1, math.ceil(B.ROTATE_BYTES / p.nbytes)) - 1)]
        bare = [dataclasses.replace(q, esc_idx=q.esc_idx[:0], esc_val=q.esc_val[:0], _cache={}) for q in ps]
        ws = [w] + [w.clone() for _ in range(max(1, math.ceil(B.ROTATE_BYTES / (2 * n * k))) - 1)]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in ps]
            ref = x.float() @ w.float().T
            y = L.linear_bf12(x, p)
            row = {"shape": name, "M": m, "N": n, "K": k, "escapes_per_row": p.esc_idx.numel() / n,
                   "config": B.cfg_str(L.get_config(m, n, k)),
                   "bf12_rel_err": float((y.float() - ref).norm() / ref.norm()),
                   "bf16_triton_us": B.graph_time_us([lambda i=i: triton_linear(x, ws[i]) for i in range(len(ws))]),
                   "bf16_cublas_us": B.graph_time_us([lambda i=i: torch.nn.functional.linear(x, ws[i])
                                                      for i in range(len(ws))]),
                   "bf12_us": B.graph_time_us([lambda i=i: L.linear_bf12(x, ps[i], out=ys[i]) for i in range(len(ps))]),
                   "bf12_no_escape_code_us": B.graph_time_us([lambda i=i: L.linear_bf12(x, bare[i], out=ys[i])
                                                              for i in range(len(ps))])}
            print(json.dumps(row), flush=True)
            rows.append(row)
        ps = bare = ws = None
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
