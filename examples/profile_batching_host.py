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
so rows join and leave often. Per B it reports, per decode step (admissions apart): wall time
(``step_ms``), its split into the step forwards and the rest (``forward_ms_per_step``,
``host_ms_per_step``: the host's glue, forward hooks only), the ``StepAudit`` counts from a
separate pass (``audit_*``: eager glue ops, forwards, host reads, and its glue seconds, which
its own per-op hooks inflate), the admission time per joining request (prefills) and, with
``--profile N``, cProfile's top N functions over the decode steps. Each figure is the least of
``--repeat`` passes (other work on the machine only adds time).

``--phases`` (the bs1 critical path, e.g. ``--batches 1``): the loop runs as it does on a GPU
(its steps and the chain acceptance wrapped as graphed steps, every drafting shape captured up
front, drafting uncapped at the budget) with ``EmulatedGraphs`` standing in for CUDA graphs: the
wrapper's host path is the real one (signature key, static input copies), and its "replay" runs
the step on the static inputs. A ``PhaseClock`` notes when each draft, verify and acceptance
starts (on a GPU: the launch) and ends, so a step's host time splits into the three gaps the GPU
waits through at bs1: ``copy_to_draft`` (from the end of the acceptance, i.e. the step's host
copy, to the next draft's launch: the drafter's bookkeeping and Python, and the scheduler's work
unless the loop drafts ahead, ``draft_ahead``; across an admission it is not counted), ``draft_to_verify`` and ``verify_to_accept`` (host work between
launches, hidden behind the GPU's work when shorter than it). Meant for the CPU, where a call's
end is its work's end; on a GPU the real graphs and ``bench_tree --e2e-8b`` say what the step costs.

    PYTHONPATH=. SPECC_THREADS=1 python3 examples/profile_batching_host.py --batches 16,32
    PYTHONPATH=. python3 examples/profile_batching_host.py --batches 16 --profile 25 --out host.json
    PYTHONPATH=. SPECC_THREADS=1 python3 examples/profile_batching_host.py --batches 1 --phases --profile 30
    PYTHONPATH=. SPECC_THREADS=1 python3 examples/profile_batching_host.py --batches 1 --phases --step-graphs
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
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


class ForwardClock:
    """Wall time inside the loop's step forwards (forward hooks, no dispatch modes: unlike the
    StepAudit it adds almost nothing to the glue it leaves out), so a step's host glue time is
    its wall time minus this."""

    def __init__(self, loop):
        from specc.bench.step_audit import step_modules

        self.modules, self.seconds, self._depth, self._start = step_modules(loop), 0.0, 0, 0.0
        self._handles = []

    counting = True  # False: forwards are not added (hooks stay registered, e.g. across admissions)

    def _enter(self, module, args):
        if self._depth == 0:
            self._start = time.perf_counter()
        self._depth += 1

    def _leave(self, module, args, out):
        self._depth -= 1
        if self._depth == 0 and self.counting:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> "ForwardClock":
        for module in self.modules:
            self._handles += [module.register_forward_pre_hook(self._enter), module.register_forward_hook(self._leave)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


PHASES = ("copy_to_draft", "draft_to_verify", "verify_to_accept", "result_to_step")


class PhaseClock:
    """When each graphed call of the step starts and ends (``EmulatedGraphs`` reports them), by
    role: "draft", "verify", "accept". ``gaps()`` sums the host time between them per ``PHASES``
    (module doc); ``boundary()`` marks an admission (the next copy_to_draft gap is not a step's),
    and calls while ``counting`` is False (the admissions' prefills) count in no gap."""

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.counts = dict.fromkeys(PHASES, 0)
        self._last: tuple[str, float] | None = None  # (role, end) of the last call

    counting = True  # False while admitting requests (prefills are no step's launches)

    def boundary(self) -> None:
        self._last = None

    def enter(self, role: str) -> None:
        if not self.counting:
            self._last = None
            return
        now = time.perf_counter()
        if self._last is not None:
            phase = {("accept", "draft"): "copy_to_draft", ("draft", "verify"): "draft_to_verify",
                     ("verify", "accept"): "verify_to_accept", ("result", "step"): "result_to_step"}.get(
                         (self._last[0], role))
            if phase is not None:
                self.seconds[phase] += now - self._last[1]
                self.counts[phase] += 1
        self._last = None

    def leave(self, role: str) -> None:
        self._last = (role, time.perf_counter()) if self.counting else None

    def result(self) -> None:
        """The host has read a whole step's result (``StepGraphs.on_result``): on a GPU it waited
        for the step there, so the next step's launch is late by what the host does from here."""
        self.leave("result")


def emulated_graphs():
    """``GraphedStep`` with CUDA graphs emulated on any device (class made here: the runtime is
    imported lazily). Its host path (``__call__``: signature key, static input copies, output
    buffers) is the real one; capture records the first call's outputs as the static outputs
    (that call runs the step once, as an eager first call would), a replay runs the step on the
    static inputs and copies its outputs into them. ``clock`` / ``role``: a ``PhaseClock`` told
    when each call of the step (eager or replay) starts and ends."""
    from specc.runtime.graphs import GraphedStep

    class _Replay:
        def __init__(self, owner, static_in, out):
            self.owner, self.static_in, self.out, self.skip = owner, static_in, out, True

        def replay(self):
            if self.skip:  # the capture's own call already ran the step on these inputs
                self.skip = False
                return
            _copy_into(self.out, self.owner._run(*self.static_in))

    class EmulatedGraphs(GraphedStep):
        clock: PhaseClock | None = None
        role = ""

        def _on_device(self, tensor) -> bool:
            return True

        def _run(self, *args):
            if self.clock is not None:
                self.clock.enter(self.role)
            try:
                return self.step(*args)
            finally:
                if self.clock is not None:
                    self.clock.leave(self.role)

        def _capture(self, args, key):
            static_in = [a.clone() if torch.is_tensor(a) else a for a in args]
            out = self._run(*static_in)
            entry = (static_in, _Replay(self, static_in, out), out)
            self.graphs[key] = entry
            return entry

    return EmulatedGraphs


def _copy_into(dst, src) -> None:
    if torch.is_tensor(dst):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            _copy_into(d, s)


class StepReplay:
    """A CPU stand-in for a whole-step graph (``--step-graphs``): a replay runs the step's body,
    reported to the ``PhaseClock`` as role "step". With the loop's ``step_graph_on_result`` hook,
    ``result_to_step`` is the host's time from reading one step's result (where on a GPU it waited
    for that step) to launching the next: the GPU's idle window per step at batch 1."""

    def __init__(self, body, clock: PhaseClock):
        self.body, self.clock = body, clock

    def replay(self):
        self.clock.enter("step")
        try:
            self.body()
        finally:
            self.clock.leave("step")


def graph_loop(loop, clock: PhaseClock, step_graphs: bool = False) -> None:
    """Set ``loop`` up as ``engine.build_loop`` does on a GPU (graphed target and drafter steps,
    shapes captured up front, drafting uncapped at the budget), with ``EmulatedGraphs``
    reporting to ``clock``, the next draft launched ahead at batch 1 (``draft_ahead``); the chain
    acceptance's graph is made per scheduler (``graph_accept``). ``step_graphs``: batch-1 steps as
    whole-step graphs (``StepReplay``) launched ahead, as the engine runs them on CUDA by default."""
    graphs = emulated_graphs()
    k = loop.num_draft
    target = graphs(loop.target, k + 1)
    target.clock, target.role = clock, "verify"
    loop.target = target
    drafter = loop.drafter
    attr = "drafter" if hasattr(drafter, "spec") else "model"
    step = graphs(getattr(drafter, attr), 2 * k + 2)
    step.clock, step.role = clock, "draft"
    setattr(drafter, attr, step)
    loop.capture_shapes, loop.cap_to_budget = True, False
    loop.draft_ahead = True  # as on a GPU (a runtime without it ignores the attribute)
    loop.emulated_graphs = graphs
    if step_graphs:
        loop.step_graphs = True
        loop.step_graph_capture = lambda body, pool: StepReplay(body, clock)
        loop.step_graph_on_result = clock.result


def graph_accept(loop, clock: PhaseClock) -> None:
    """The chain acceptance as the loop wraps it on a GPU (``_chain_accept_fn``), emulated; call
    after ``open_slots`` (the graph holds the slots' ``seq``)."""
    fn = loop.emulated_graphs(loop._accept_chain, max_tokens=1 << 30, warmup=0, eager_first=True)
    fn.clock, fn.role = clock, "accept"
    loop._chain_graph, loop._chain_graph_seq = fn, loop.seq


def drive(loop, batch: int, work, audit: bool = False, profiler=None, phases: PhaseClock | None = None) -> dict:
    """Every request of ``work`` through a scheduler of ``batch`` slots; decode steps timed
    apart from admissions. ``audit``: StepAudit counts summed over the decode steps;
    ``profiler``: enabled around the decode steps only; ``phases``: the loop's ``PhaseClock``
    (``graph_loop``), whose gaps are reported per decode step."""
    from specc.bench.step_audit import StepAudit
    from specc.runtime.batching import BatchScheduler

    scheduler = BatchScheduler(loop, batch)
    if phases is not None:
        graph_accept(loop, phases)
        phases.__init__()
    for prompt, budget in work:
        scheduler.submit(prompt, budget, ())
    totals: dict = {}
    steps, decode_s, admit_s, joins = 0, 0.0, 0.0, 0
    clock = ForwardClock(loop)
    with contextlib.nullcontext() if audit else clock:  # the hooks stay for the whole drive (out of the steps' time)
        while not scheduler.idle:
            start = time.perf_counter()
            clock.counting = False
            if phases is not None:
                phases.counting = False
            admitted = scheduler.admit()
            clock.counting = True
            joins += len(admitted)
            admit_s += time.perf_counter() - start
            if phases is not None:
                phases.counting = True
                if admitted:
                    phases.boundary()
            if not scheduler.num_running:
                continue
            start = time.perf_counter()
            with StepAudit(loop) if audit else contextlib.nullcontext() as watch:
                if profiler is not None:
                    profiler.enable()
                scheduler.decode()
                if profiler is not None:
                    profiler.disable()
            decode_s += time.perf_counter() - start
            steps += 1
            for key, value in (watch.counts() if audit else {}).items():
                totals[key] = totals.get(key, 0) + value
    per_step = 1e3 / max(steps, 1)
    out = {"decode_steps": steps, "joins": joins, "step_ms": decode_s * per_step,
           "admit_ms_per_join": 1e3 * admit_s / max(joins, 1)}
    if not audit:  # the step's time outside the forwards: the host's glue (CPU: forwards run synchronously)
        out.update(forward_ms_per_step=clock.seconds * per_step, host_ms_per_step=(decode_s - clock.seconds) * per_step)
    if phases is not None:
        out.update({f"{name}_ms": 1e3 * phases.seconds[name] / max(phases.counts[name], 1) for name in PHASES})
        out["whole_steps"] = phases.counts["result_to_step"]  # steps launched after a whole step's result
        # the window the GPU waits through per step: before the draft's launch, or between whole steps
        out["host_critical_ms"] = out["result_to_step_ms" if phases.counts["result_to_step"] else "copy_to_draft_ms"]
    if audit:
        out.update({f"{key}_per_step": value / max(steps, 1) for key, value in totals.items()})
        out["glue_ms_per_step"] = 1e3 * out.pop("glue_seconds_per_step")
    return out


def least(runs: list[dict]) -> dict:
    return {key: min(run[key] for run in runs) for key in runs[0]}


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
    ap.add_argument("--phases", action="store_true", help="graphed steps emulated, the host gaps between the "
                    "draft, verify and acceptance launches per step (module doc)")
    ap.add_argument("--step-graphs", action="store_true", help="with --phases: batch-1 steps as whole-step graphs "
                    "(the engine's default on CUDA), timed from reading one step's result to the next one's launch")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    opts = ap.parse_args(argv)
    if torch.device(opts.device).type == "cpu":
        from specc.threads import configure_threads

        configure_threads()  # SPECC_THREADS, else the idle cores
    loop, vocab = build_loop(opts)
    clock = PhaseClock() if opts.phases else None
    if opts.step_graphs and clock is None:
        ap.error("--step-graphs needs --phases")
    if clock is not None:
        graph_loop(loop, clock, opts.step_graphs)
    rows = []
    for batch in [int(b) for b in opts.batches.split(",")]:
        opts_b = argparse.Namespace(**{**vars(opts), "requests": opts.requests or 3 * batch})
        work = requests(opts_b, vocab)
        with torch.inference_mode():
            drive(loop, batch, work, phases=clock)  # warm-up (allocations, first shapes)
            # per figure the least of --repeat passes: other processes on the machine only add time
            # (the counts are the same in every pass)
            timed = least([drive(loop, batch, work, phases=clock) for _ in range(opts.repeat)])
            counted = least([drive(loop, batch, work, audit=True, phases=clock) for _ in range(opts.repeat)])
            counted = {key: value for key, value in counted.items()
                       if key not in (*(f"{p}_ms" for p in PHASES), "host_critical_ms", "whole_steps")}
            profiler = cProfile.Profile() if opts.profile else None
            if profiler is not None:
                drive(loop, batch, work, profiler=profiler, phases=clock)
        row = {"batch": batch, "requests": len(work), **timed,
               **{f"audit_{key}": value for key, value in counted.items() if key.endswith("_per_step")}}
        rows.append(row)
        print(json.dumps(row))
        if profiler is not None:
            print(top_functions(profiler, opts.profile, opts.sort))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"device": opts.device, "shapes": opts.shapes, "drafter_shapes": opts.drafter_shapes,
                       "acceptance": opts.acceptance, "phases": opts.phases, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
