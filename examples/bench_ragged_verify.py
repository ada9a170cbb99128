"""Verify step times: dense [B, k + 1] vs packed (ragged) per-row blocks vs two-level verification.

Real target shapes with random weights (``specc.bench.shapes``; ``tiny-qwen3`` for a CPU smoke
run), the specc.models definition (its ragged path is ``ops.ragged_attention``'s torch reference
until a compiled ``target_ragged`` step exists, so the packed figures are that reference's), each
row's cache filled to ``--context`` tokens. For each batch size B:

- ``dense``: one verify of [B, k + 1] (what a step with one k costs);
- ``packed``: one packed verify where row b checks k_b + 1 tokens, k_b drawn from the stated
  per-request acceptance (``--alphas``, cycled over rows) as the goodput rule would pick them
  (``GoodputDraftLength.choose_rows`` against this run's own dense step times as the curve);
- ``two-level``: level 1 dense [B, k1 + 1], then level 2 packed over the rows that accept all k1
  drafts (in expectation alpha^k1 of them; drawn here with a seeded generator) with their k - k1
  remaining drafts.

Median of ``--reps`` timed calls after warm-up (CUDA: synchronised). Prints a table, writes JSON.

    PYTHONPATH=. python3 examples/bench_ragged_verify.py --device cpu --shapes tiny-qwen3 --batches 1,4 --reps 3
    PYTHONPATH=. python3 examples/bench_ragged_verify.py --device cuda --shapes qwen3-8b --batches 1,4,16,32 \
        --k 15 --k1 3 --context 1024 --out $OUT/ragged_verify.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def timed(fn, dev, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> dict:
    from specc.bench.shapes import build_causal, target_config
    from specc.runtime.adaptive import GoodputDraftLength
    from specc.runtime.ragged import PackedRows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="qwen3-8b")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--k", type=int, default=15, help="drafts per row (the most)")
    ap.add_argument("--k1", type=int, default=3, help="drafts checked at level 1")
    ap.add_argument("--alphas", default="0.9,0.6,0.3", help="per-request acceptance, cycled over rows")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    opts = ap.parse_args(argv)
    dev = torch.device(opts.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = build_causal(target_config(opts.shapes), dtype, dev, opts.seed)
    vocab = model.config.vocab_size
    alphas = [float(a) for a in opts.alphas.split(",")]
    gen = torch.Generator().manual_seed(opts.seed)
    rows_out = []
    for batch in [int(b) for b in opts.batches.split(",")]:
        model.setup_caches(batch, opts.context + opts.k + 2)
        lengths = torch.full((batch,), opts.context, dtype=torch.long, device=dev)
        block = torch.randint(10, vocab - 10, (batch, opts.k + 1), generator=gen).to(dev)

        def dense(width):
            ids = block[:, :width]
            return model(ids, lengths[:, None] + torch.arange(width, device=dev)[None], lengths)

        def packed(counts, offset=0):
            rows = PackedRows.of(counts, block.shape[1] - offset, dev)
            part = block[:, offset:]
            return model(rows.tokens(part), rows.positions(lengths, offset), rows.cache_len(lengths, offset),
                         row_slots=rows.row_slots, row_starts=rows.row_starts)

        with torch.inference_mode():
            dense_s = {w: timed(lambda w=w: dense(w), dev, opts.reps) for w in sorted({1, opts.k1 + 1, opts.k + 1})}
            row_alpha = [alphas[b % len(alphas)] for b in range(batch)]
            curve = {}

            def ragged_seconds(rows, tokens):  # this run's dense times, interpolated in tokens per row
                per_row = max(1, round(tokens / rows))
                if per_row not in curve:
                    curve[per_row] = timed(lambda: dense(min(per_row, opts.k + 1)), dev, max(1, opts.reps // 3))
                return curve[per_row]

            rule = GoodputDraftLength(lambda rows, k: dense_s[opts.k + 1], opts.k, ragged_seconds=ragged_seconds)
            ks = rule.choose_rows(row_alpha, [opts.k] * batch, batch)
            packed_s = timed(lambda: packed([kb + 1 for kb in ks]), dev, opts.reps)
            goes = [bool(torch.rand((), generator=gen) < a ** opts.k1) for a in row_alpha]
            level2 = [opts.k - opts.k1 if g else 0 for g in goes]
            level2_s = timed(lambda: packed(level2, opts.k1 + 1), dev, opts.reps) if any(goes) else 0.0
        row = {"batch": batch, "dense_s": dense_s[opts.k + 1], "packed_s": packed_s, "packed_ks": ks,
               "packed_tokens": sum(k + 1 for k in ks), "two_level_s": dense_s[opts.k1 + 1] + level2_s,
               "level2_rows": sum(goes), "dense_tokens": batch * (opts.k + 1)}
        rows_out.append(row)
        print(f"B={batch:3d}  dense {row['dense_s'] * 1e3:8.2f} ms ({row['dense_tokens']} tok)  "
              f"packed {packed_s * 1e3:8.2f} ms ({row['packed_tokens']} tok, k_b {ks})  "
              f"two-level {row['two_level_s'] * 1e3:8.2f} ms ({sum(goes)}/{batch} rows to level 2)")
    result = {"device": str(torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"),
              "torch": torch.__version__, "shapes": opts.shapes, "k": opts.k, "k1": opts.k1, "alphas": alphas,
              "context": opts.context, "ragged_path": "ops.ragged_attention torch reference", "rows": rows_out}
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
