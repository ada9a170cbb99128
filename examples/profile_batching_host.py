"""Host time of the batched speculative step, per decode step, on any device (CPU included).

Why: on the GPU a batched step of continuous batching measured several times its cost-model
prediction, and the step audit showed host glue and extra eager drafter forwards as the cause
(docs/benchmarks/h200-run5.md, "Batched speculation"). At tiny model sizes on the CPU the
forwards are cheap, so the host's share of a step (Python per-row loops, tensor construction,
uploads, the scheduler's bookkeeping) is what a timing shows.

Builds a tiny target and drafter of real architecture (``specc.bench.shapes``, ``--shapes`` /
``--drafter-shapes``; model definitions, not compiled), replays acceptance from a stated model
(``specc.runtime.replay``: random weights accept nothing), and runs ``--requests`` short requests
of different prompt lengths through a ``BatchScheduler`` with B slots for each B of ``--batches``,
so rows join and leave often. Per B it reports, per decode step (admissions apart): wall time,
the ``StepAudit`` counts (eager glue ops, forwards, host reads, glue seconds: the time outside the
step forwards) and, with ``--profile N``, cProfile's top N functions by own time over the decode
steps. Times are the least of ``--repeat`` passes (other work on the machine only adds time).

    PYTHONPATH=. SPECC_THREADS=1 python3 examples/profile_batching_host.py --batches 16,32
    PYTHONPATH=. python3 examples/profile_batching_host.py --batches 16 --profile 25 --out host.json
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import io
import json
import pstats
import time

import torch


def build_loop(opts):
    """(device loop over model definitions with replayed acceptance, vocabulary size)."""
    from specc.bench.acceptance import parse_acceptance
    from specc.bench.shapes import build_causal, build_dflash, drafter_config, target_config
    from specc.methods import get_method
    from specc.runtime.device_loop import DeviceSpeculativeDecoder
    from specc.runtime.replay import ReplayVerifier

    dev = torch.device(opts.device)
    tcfg = target_config(opts.shapes)
    method, dcfg = drafter_config(opts.shapes, opts.drafter_shapes)
    impl = get_method(method)
    target = build_causal(tcfg, torch.float32, dev, seed=1)
    draft = build_dflash(dcfg, torch.float32, dev, seed=3) if impl.name == "dflash" else \
        build_causal(dcfg, torch.float32, dev, seed=2)
    loaded = impl.bind(target, draft)
    section = {"pard_token": dcfg.get("pard_token")} if impl.name == "pard" else None
    from specc.runtime.drafters import drafter_from_manifest

    drafter = drafter_from_manifest(impl.strategy, loaded.draft, section)
    k = impl.num_draft(opts.num_draft, dcfg)
    max_len = opts.prompt_max + opts.tokens_max + 4
    loop = DeviceSpeculativeDecoder(loaded.target, drafter, k, max_len)
    acceptance = parse_acceptance(opts.acceptance, k)
    loop.verifier = ReplayVerifier(acceptance.alphas, seed=opts.seed, source=acceptance.source,
                                   lengths=lambda: loop.state.lengths)
    return loop, tcfg["vocab_size"]


def requests(opts, vocab: int) -> list[tuple[list[int], int]]:
    """``--requests`` (prompt, budget) pairs, lengths uniform in their ranges (seeded)."""
    g = torch.Generator().manual_seed(opts.seed)

    def draw(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    return [(torch.randint(10, vocab - 10, (draw(opts.prompt_min, opts.prompt_max),), generator=g).tolist(),
             draw(opts.tokens_min, opts.tokens_max)) for _ in range(opts.requests)]


def drive(loop, batch: int, work, audit: bool = False, profiler=None) -> dict:
    """Every request of ``work`` through a scheduler of ``batch`` slots; decode steps timed
    apart from admissions. ``audit``: StepAudit counts summed over the decode steps;
    ``profiler``: enabled around the decode steps only."""
    from specc.bench.step_audit import StepAudit
    from specc.runtime.batching import BatchScheduler

    scheduler = BatchScheduler(loop, batch)
    for prompt, budget in work:
        scheduler.submit(prompt, budget, ())
    totals: dict = {}
    steps, decode_s, admit_s, joins = 0, 0.0, 0.0, 0
    while not scheduler.idle:
        start = time.perf_counter()
        joins += len(scheduler.admit())
        admit_s += time.perf_counter() - start
        if not scheduler.num_running:
            continue
        start = time.perf_counter()
        with StepAudit(loop) if audit else contextlib.nullcontext() as counted:
            if profiler is not None:
                profiler.enable()
            scheduler.decode()
            if profiler is not None:
                profiler.disable()
        decode_s += time.perf_counter() - start
        steps += 1
        for key, value in (counted.counts() if audit else {}).items():
            totals[key] = totals.get(key, 0) + value
    out = {"decode_steps": steps, "joins": joins, "step_ms": 1e3 * decode_s / max(steps, 1),
           "admit_ms_per_join": 1e3 * admit_s / max(joins, 1)}
    if audit:
        out.update({f"{key}_per_step": value / max(steps, 1) for key, value in totals.items()})
        out["glue_ms_per_step"] = 1e3 * out.pop("glue_seconds_per_step")
    return out


def top_functions(profiler, count: int, sort: str = "tottime") -> str:
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats(sort).print_stats(count)
    return buf.getvalue()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default="tiny-qwen3")
    ap.add_argument("--drafter-shapes", default="dflash-b16")
    ap.add_argument("--num-draft", type=int, default=None, help="drafts per step (default: the method's)")
    ap.add_argument("--acceptance", default="dflash-qwen3-8b:humaneval")
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--requests", type=int, default=0, help="requests per batch size (default: 3 B)")
    ap.add_argument("--prompt-min", type=int, default=24)
    ap.add_argument("--prompt-max", type=int, default=160)
    ap.add_argument("--tokens-min", type=int, default=8)
    ap.add_argument("--tokens-max", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="passes per figure; the least time is reported")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions by own time")
    ap.add_argument("--sort", default="tottime", help="cProfile order (tottime, cumulative, ...)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    opts = ap.parse_args(argv)
    if torch.device(opts.device).type == "cpu":
        from specc.threads import configure_threads

        configure_threads()  # SPECC_THREADS, else the idle cores
    loop, vocab = build_loop(opts)
    rows = []
    for batch in [int(b) for b in opts.batches.split(",")]:
        opts_b = argparse.Namespace(**{**vars(opts), "requests": opts.requests or 3 * batch})
        work = requests(opts_b, vocab)
        with torch.inference_mode():
            drive(loop, batch, work)  # warm-up (allocations, first shapes)
            # the least of --repeat passes: other processes on the machine only ever add time
            timed = min((drive(loop, batch, work) for _ in range(opts.repeat)), key=lambda r: r["step_ms"])
            counted = min((drive(loop, batch, work, audit=True) for _ in range(opts.repeat)),
                          key=lambda r: r["glue_ms_per_step"])
            profiler = cProfile.Profile() if opts.profile else None
            if profiler is not None:
                drive(loop, batch, work, profiler=profiler)
        row = {"batch": batch, "requests": len(work), **timed,
               **{key: value for key, value in counted.items() if key.endswith("_per_step")}}
        rows.append(row)
        print(json.dumps(row))
        if profiler is not None:
            print(top_functions(profiler, opts.profile, opts.sort))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"device": opts.device, "shapes": opts.shapes, "drafter_shapes": opts.drafter_shapes,
                       "acceptance": opts.acceptance, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
