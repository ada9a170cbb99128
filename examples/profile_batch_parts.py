"""Device time per part of the batched speculative step and of the batched AR step (CUDA events).

Why: a batched step's wall time is draft + verify + acceptance + the host's bookkeeping between
steps (the GPU idles there); the loop's ``profile = "events"`` splits it without synchronising
(``EventTimer``: "between" is from one step's host read to the next step's first launch). Builds
the Qwen3-8B + DFlash-b16 pair of ``examples/bench_batching.py`` (random weights, DFlash's GSM8K
acceptance replayed, the deployment's linear choice) and drives B requests per batch size with
continuous batching (buckets off: every step over the B slots), once untimed, once timed, once
profiled.

    PYTHONPATH=. python3 examples/profile_batch_parts.py --deployment h100-bs1 --out $OUT/parts.json
    PYTHONPATH=. python3 examples/profile_batch_parts.py --shapes tiny-qwen3 --batches 2 --tokens 8 --deployment cpu

``--host-profile N``: one more speculative pass per batch size with cProfile on inside its decode
steps, the N functions with the most own time per step: what the host does while the GPU waits
in the acceptance and between steps.

``--kernels``: one more speculative pass per batch size under ``torch.profiler``, each loop part
inside a host range ``part:NAME`` (:class:`RangeTimer`), and the kernels launched in each part by
name (``specc.bench.gaps.kernels_in_ranges``; graph-replayed kernels may be matched only in part,
so the sums are lower bounds): what the acceptance's and the draft's device time is made of.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_batching as bb  # noqa: E402

from specc.bench.batched import drive  # noqa: E402
from specc.runtime.device_loop import EventTimer  # noqa: E402


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


class RangeTimer(EventTimer):
    """The loop's event timer (``profile = "events"``) that also opens a profiler range
    ``part:NAME`` at each part's start and closes it at the next boundary (the loop takes it as
    its ``profile``)."""

    def __init__(self, device):
        super().__init__(device)
        self._range = None

    def mark(self, part) -> None:
        super().mark(part)
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if part:
            self._range = torch.profiler.record_function(f"part:{part}")
            self._range.__enter__()


def part_kernels(loop, prompts, tokens, dev) -> dict:
    """Kernels per loop part over one profiled pass (see the module docstring)."""
    from specc.bench.gaps import kernels_in_ranges, profiled

    loop.profile = RangeTimer
    try:
        _restart(loop)
        trace = profiled(lambda: drive(loop, prompts, tokens), dev.type == "cuda", False)[1]
    finally:
        loop.profile = False
    parts = sorted({e["name"] for e in trace.get("traceEvents", []) if str(e.get("name", "")).startswith("part:")})
    return {name[5:]: kernels_in_ranges(trace, name, top=12) for name in parts}


def host_profile(loop, prompts, tokens, dev, top: int) -> dict:
    """One pass with cProfile on inside the scheduler's decode steps only (admissions and their
    prefills left out): per decode step, the ``top`` functions by own time (us, calls, cumulative
    us). cProfile's hooks slow the host, so the figures rank the host's work rather than time it;
    a blocking device read's wait is the own time of the call that reads."""
    import cProfile
    import pstats

    from specc.runtime.batching import BatchScheduler

    prof = cProfile.Profile()
    decode = BatchScheduler.decode

    def profiled_decode(self):
        prof.enable()
        try:
            return decode(self)
        finally:
            prof.disable()

    _restart(loop)
    _sync(dev)
    BatchScheduler.decode = profiled_decode
    try:
        run = drive(loop, prompts, tokens)
        _sync(dev)
    finally:
        BatchScheduler.decode = decode
    steps = max(run.decode_steps, 1)
    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, callers)}
    rows = sorted(((own, calls, cum, f"{os.path.basename(f)}:{line}({name})")
                   for (f, line, name), (calls, _, own, cum, _) in stats.items()), reverse=True)[:top]
    return {"decode_steps": run.decode_steps, "what": "cProfile inside the decode steps of one pass",
            "top": [{"function": name, "us_per_step": 1e6 * own / steps, "calls_per_step": calls / steps,
                     "cum_us_per_step": 1e6 * cum / steps} for own, calls, cum, name in rows]}


def _restart(loop) -> None:
    if hasattr(loop.verifier, "reset"):  # a replayed acceptance draws the same counts every pass
        loop.verifier.reset()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-8b", help="target shapes (specc.bench.shapes)")
    ap.add_argument("--batches", default="16,32", help="batch sizes, comma separated")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--deployment", default="h200-bs1", help="whose linear choice the steps are built with")
    ap.add_argument("--kernels", action="store_true", help="also the kernels of each part (torch.profiler)")
    ap.add_argument("--greedy-verifier", action="store_true",
                    help="also the speculative loop with the greedy chain verifier instead of the replayed acceptance "
                         "(random weights: about one token a step; the same draft and verify shapes, so the "
                         "acceptance part shows what the replay's draws cost)")
    ap.add_argument("--host-profile", type=int, default=0, metavar="N",
                    help="also one speculative pass per batch size under cProfile: the N functions with the most "
                         "own time per decode step (where the host's share of a step goes; the device read's wait "
                         "shows as the .tolist() call)")
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = [int(b) for b in a.batches.split(",") if b.strip()]
    opts = bb.pair_options(a.shapes, max(batches), a.tokens, a.deployment)
    pair = bb.shaped_pairs(opts, dev)[0]
    out = {}
    systems = [("spec", pair.loop), ("ar", pair.ar)]
    if a.greedy_verifier:
        systems.append(("spec-greedy", pair.loop))
    for system, loop in systems:
        if system == "spec-greedy":
            from specc.runtime.verifiers import ChainVerifier

            loop.verifier = ChainVerifier()
        for b in batches:
            prompts = pair.prompts[:b]
            loop.profile = False
            drive(loop, prompts, a.tokens)  # untimed: compiles and captures
            _sync(dev)
            _restart(loop)
            run = drive(loop, prompts, a.tokens)
            _sync(dev)
            loop.profile = "events"
            _restart(loop)
            profiled = drive(loop, prompts, a.tokens)
            parts = {k: 1e3 * v / profiled.decode_steps for k, v in loop.part_seconds.items()}
            loop.profile = False
            out[f"{system}-B{b}"] = {"step_ms_unprofiled": 1e3 * run.decode_seconds / run.decode_steps,
                                     "steps": run.decode_steps, "parts_ms_per_step": parts,
                                     "step_ms_profiled": 1e3 * profiled.decode_seconds / profiled.decode_steps}
            print(system, b, json.dumps(out[f"{system}-B{b}"]), flush=True)
            if a.host_profile and system == "spec":
                out[f"{system}-B{b}"]["host"] = hp = host_profile(loop, prompts, a.tokens, dev, a.host_profile)
                for r in hp["top"]:
                    print(f"  host {r['us_per_step']:8.1f} us/step own ({r['calls_per_step']:.1f} calls, "
                          f"{r['cum_us_per_step']:.1f} cumulative) {r['function']}", flush=True)
            if a.kernels and system == "spec":
                out[f"{system}-B{b}"]["kernels"] = kp = part_kernels(loop, prompts, a.tokens, dev)
                for part, k in kp.items():
                    print(f"  {part}: {k['kernel_us']:.0f} us of kernels in {k['range_ms']:.3f} ms per range; "
                          + ", ".join(f"{r['kernel']} {r['calls_per_range']:.1f}x {r['us_per_range']:.0f} us"
                                      for r in k["top"][:8]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
