"""Committing an accepted prefix of a GDN verify block: per-position snapshots vs replay.

One GDN layer at real Qwen3.5 shapes (Hk = 16 q/k heads, Hv = 32 value heads, dk = dv = 128 by
default; random inputs, fp32 state), batch ``--batch``, verify blocks of Q = 4 / 8 / 16 tokens:

- ``snapshot``: the verify runs the recurrence and writes the state after every block position
  into a ``[B, Q + 2, Hv, dk, dv]`` buffer (what ``specc.models.hybrid`` does); the commit copies
  the entry of the last accepted position into the live slot;
- ``replay``: the verify computes the block's outputs with the chunked form and keeps only the
  per-token inputs (q, k, v, g, beta); the commit replays the ``a`` accepted tokens from the state
  before the step with the recurrence.

Both are the pure-torch reference forms of ``specc.models.gdn`` (eager ops, so launch-bound on a
GPU): the figures compare the two strategies' work in that form, not the Triton kernels that do
not exist yet. Each strategy's committed state is checked equal to the other's before timing.
Prints a table (median ms per verify + commit, CUDA events on a GPU) and writes JSON.

    PYTHONPATH=. python3 examples/bench_hybrid_commit.py --device cuda --out $OUT/hybrid_commit.json
    PYTHONPATH=. python3 examples/bench_hybrid_commit.py --device cpu --tiny     # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specc.models import gdn


def _inputs(batch, q_len, hk, hv, dk, dv, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return (rnd(batch, q_len, hk, dk), rnd(batch, q_len, hk, dk), rnd(batch, q_len, hv, dv),
            -torch.rand(batch, q_len, hv, generator=g).to(device), torch.rand(batch, q_len, hv, generator=g).to(device),
            rnd(batch, hv, dk, dv) * 0.1)


def snapshot_step(q, k, v, decay, beta, state, accepted, buffer):
    bsz, q_len = q.shape[:2]
    out, states = gdn.gated_delta_recurrent(q, k, v, decay, beta, state, gdn.chain_parents(bsz, q_len, q.device))
    buffer[:, 1] = state
    buffer[:, 2:2 + q_len] = states
    buffer[:, 0] = buffer[torch.arange(bsz, device=q.device), 1 + accepted]
    return out, buffer[:, 0]


def replay_step(q, k, v, decay, beta, state, accepted, buffer):
    out, _ = gdn.gated_delta_chunked(q, k, v, decay, beta, state)
    a = int(accepted.max())  # one accepted count per batch here (equal rows)
    if a == 0:
        return out, state
    bsz = q.shape[0]
    _, states = gdn.gated_delta_recurrent(q[:, :a], k[:, :a], v[:, :a], decay[:, :a], beta[:, :a], state,
                                          gdn.chain_parents(bsz, a, q.device))
    return out, states[:, -1]


def _time(fn, device, reps):
    times = []
    for _ in range(reps + 2):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="tiny head shapes (a CPU smoke run)")
    ap.add_argument("--out", default="hybrid_commit.json")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    hk, hv, dk, dv = (2, 4, 8, 8) if args.tiny else (16, 32, 128, 128)
    rows = []
    with torch.inference_mode():
        for q_len in (4, 8, 16):
            for accepted in sorted({0, q_len // 2, q_len}):
                q, k, v, decay, beta, state = _inputs(args.batch, q_len, hk, hv, dk, dv, device)
                acc = torch.full((args.batch,), accepted, dtype=torch.long, device=device)
                buffer = torch.zeros(args.batch, q_len + 2, hv, dk, dv, device=device)
                _, snap = snapshot_step(q, k, v, decay, beta, state, acc, buffer)
                _, rep = replay_step(q, k, v, decay, beta, state, acc, buffer)
                torch.testing.assert_close(snap, rep, rtol=1e-4, atol=1e-4)
                row = {"Q": q_len, "accepted": accepted,
                       "snapshot_ms": _time(lambda: snapshot_step(q, k, v, decay, beta, state, acc, buffer), device, args.reps),
                       "replay_ms": _time(lambda: replay_step(q, k, v, decay, beta, state, acc, buffer), device, args.reps)}
                rows.append(row)
                print(f"Q={q_len:3d} accepted={accepted:3d}  snapshot {row['snapshot_ms']:8.3f} ms  "
                      f"replay {row['replay_ms']:8.3f} ms")
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "batch": args.batch, "shapes": {"Hk": hk, "Hv": hv, "dk": dk, "dv": dv}, "form": "pure-torch reference"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
