"""Time the ragged attention kernel against the dense attention kernel on padded batches, at
Qwen3-8B head shapes (Hq 32, Hkv 8, D 128, bf16) on the GPU; prints one JSON line per case.

A case is B rows with their own draft lengths (tokens per row Q_r in 1..16) and cache lengths
(512..4096): what a batch with per-request draft lengths verifies. The dense kernel gets the
batch padded to the longest row (B x max Q_r query tokens, every row computing its padding);
the ragged kernel gets the rows packed (T = sum Q_r tokens, no padding). Both write the block's
K/V into the cache as part of the op (dense: the kernel ABI's ``write_kv``; ragged: its own write
kernel), and are also timed without the write. Each figure is the median of CUDA-graph replays
of ``--layers`` calls over as many distinct caches (one per layer, as in a step), divided by the
layer count. Before timing, the ragged output of every row's real tokens is compared with the
dense output of the same row (``max_rel_err``; padding after a row's tokens cannot change them
under the causal mask).

    PYTHONPATH=. python3 examples/bench_ragged_attention.py --out $OUT/ragged_attention.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specc.codegen import kernel_abi
from specc.codegen.kernels import attention as A
from specc.codegen.kernels import ragged_attention as RA
from specc.search.calibrate import Timer

HQ, HKV, D = 32, 8, 128


def mixes(batch: int, seed: int) -> dict[str, tuple[list[int], list[int]]]:
    """(tokens per row, cache length per row) of the cases at one batch size."""
    g = torch.Generator().manual_seed(seed + batch)
    caches = torch.randint(512, 4097, (batch,), generator=g).tolist()
    return {
        "random_q_1_16": (torch.randint(1, 17, (batch,), generator=g).tolist(), caches),
        "one_long_row": ([16] + [1] * (batch - 1), caches),
        "two_level_half": ([8 if i % 2 == 0 else 1 for i in range(batch)], caches),
        "uniform_q_16": ([16] * batch, caches),
    }


def case(batch: int, counts: list[int], lens: list[int], layers: int, timer: Timer, dev) -> dict:
    total, qmax = sum(counts), max(counts)
    cap = max(lens) + qmax + 1
    bf = torch.bfloat16
    caches = [(torch.randn(batch, HKV, cap, D, device=dev, dtype=bf), torch.randn(batch, HKV, cap, D, device=dev, dtype=bf))
              for _ in range(layers)]
    cache_len = torch.tensor(lens, device=dev)
    slots = torch.arange(batch, device=dev)
    starts = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), device=dev)
    q = torch.randn(1, total, HQ, D, device=dev, dtype=bf)
    k = torch.randn(1, total, HKV, D, device=dev, dtype=bf)
    v = torch.randn(1, total, HKV, D, device=dev, dtype=bf)
    # the same tokens padded to [B, qmax] for the dense kernel (zeros after each row's tokens)
    qd = torch.zeros(batch, qmax, HQ, D, device=dev, dtype=bf)
    kd = torch.zeros(batch, qmax, HKV, D, device=dev, dtype=bf)
    vd = torch.zeros(batch, qmax, HKV, D, device=dev, dtype=bf)
    for r, n in enumerate(counts):
        lo = int(starts[r])
        qd[r, :n], kd[r, :n], vd[r, :n] = q[0, lo:lo + n], k[0, lo:lo + n], v[0, lo:lo + n]
    scale = D ** -0.5

    ck, cv = caches[0]
    ref_k, ref_v = ck.clone(), cv.clone()
    ragged_out = RA.ragged_attention(q, k, v, ck, cv, cache_len, slots, starts, scale)
    kernel_abi.write_kv(kd, vd, ref_k, ref_v, cache_len)
    dense_out = A.attention(qd, ref_k, ref_v, cache_len, qmax, "causal", scale)
    err = 0.0
    for r, n in enumerate(counts):
        lo = int(starts[r])
        a, b = ragged_out[0, lo:lo + n].float(), dense_out[r, :n].float()
        err = max(err, ((a - b).norm() / b.norm().clamp_min(1e-30)).item())

    def ragged():
        for ck, cv in caches:
            RA.ragged_attention(q, k, v, ck, cv, cache_len, slots, starts, scale)

    def ragged_write():
        for ck, cv in caches:
            RA.ragged_write_kv(k, v, ck, cv, cache_len, slots, starts)

    def dense():
        for ck, cv in caches:
            A.attention(qd, ck, cv, cache_len, qmax, "causal", scale)

    def dense_write():
        for ck, cv in caches:
            kernel_abi.write_kv(kd, vd, ck, cv, cache_len)
            A.attention(qd, ck, cv, cache_len, qmax, "causal", scale)

    us = {name: timer(fn, inner=layers) * 1e6 for name, fn in
          (("ragged_us", ragged), ("ragged_write_us", ragged_write), ("dense_us", dense),
           ("dense_with_write_us", dense_write))}
    plan = RA.ragged_launch_plan(total, batch, HQ, HKV, D, cap, dev)
    del caches
    return {"B": batch, "T": total, "padded_tokens": batch * qmax, "q_per_row": counts, "cache_len": lens,
            **{k_: round(v_, 3) for k_, v_ in us.items()},
            "ragged_attention_only_us": round(us["ragged_us"] - us["ragged_write_us"], 3),
            "speedup_with_write": round(us["dense_with_write_us"] / us["ragged_us"], 3),
            "speedup_attention_only": round(us["dense_us"] / max(us["ragged_us"] - us["ragged_write_us"], 1e-9), 3),
            "ragged_plan": {k_: plan[k_] for k_ in ("block_m", "block_n", "num_splits", "row_blocks")},
            "max_rel_err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="8,16,32")
    ap.add_argument("--layers", type=int, default=4, help="distinct caches per timed call (default 4)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write all cases to this JSON file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_ragged_attention.py times CUDA kernels: run it on a GPU")
    dev = torch.device("cuda")
    timer = Timer("cuda", reps=args.reps)
    header = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "heads": [HQ, HKV, D], "dtype": "bfloat16"}
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        for name, (counts, lens) in mixes(batch, args.seed).items():
            row = {"case": name, **case(batch, counts, lens, args.layers, timer, dev)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
