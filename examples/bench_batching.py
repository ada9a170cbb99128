"""Tokens/s against batch size: compiled AR and the compiled speculative loop with each batching
mechanism on and off, with the cost model's prediction beside every row.

Builds real shapes with random weights (``specc.bench.shapes``): one target (``--shapes``) and
each drafter of ``--drafter-shapes`` (comma separated, e.g. ``dflash-b16,pard``), compiles the AR
step and each speculative pair in memory (the default pipeline), and for each batch size B runs B
prompts of different lengths (``--prompt-len`` +- 25%) with continuous batching (B slots),
``--tokens`` new tokens each, no EOS. Random weights accept nothing, so the speculative loop's
acceptance is replayed from a stated model (``--acceptance``, ``specc.runtime.replay``): the
drafter and the target do all their work, only the accepted count is drawn, so the timing is real
and the tokens are not the model's output. ``--real TARGET:DRAFTER`` adds a trained pair (e.g.
``specc-tiny:specc-tiny-dflash``) decided by the target itself: real acceptance, its output
checked equal to compiled AR for every mechanism, and its prediction made with the acceptance
measured in the same run.

Systems per (drafter, B), each with the cost model's tokens/s (``specc.search.batching_cost``
at ``--deployment``, context = prompt + half the new tokens):

- ``ar``: the compiled AR loop (prediction: B / AR step);
- ``one-level``: the speculative loop verifying every row's k + 1 tokens;
- ``two-level``: ``loop.two_level_k1`` set to the k1 the cost model predicts best for B (the
  ``batching`` choice's candidate); skipped, with the reason, where the loop has no two-level
  verification;
- ``per-request``: a ``BatchScheduler`` with ``GoodputDraftLength(step_seconds, k,
  ragged_seconds=...)`` over the cost model's curves (one k per row); skipped where the runtime's
  rule takes no ``ragged_seconds``;
- ``goodput`` (``--goodput``): the same rule without ``ragged_seconds`` (one k per step, dense
  verify; prediction: the pricer's dense goodput k).

Exactness: batched AR must give the tokens of the first two prompts run alone, and a ``--real``
pair's every mechanism the tokens of batched AR, up to numerical ties: at a request's first
differing position the reference run's top-2 logit margin is measured (one forward of the target's
model definition over that prefix, ``specc.verify.output_equality``); within ``--tie-tolerance``
the row records the tie (``ties``: request, position, tokens, margin, and with ``--fp32-audit`` the
fp32 gap between the two tokens) and timing goes on, otherwise the run stops.

Each row gives tokens/s end to end (prefills included), two decode throughputs
(``decode_tokens_per_s``: this static batch's decode tokens / decode seconds, rows that finished
early idle while the slowest request ends; ``steady_tokens_per_s``: B x tokens per request-step /
step time, every slot full as under continuous batching; each over the same B's AR row as
``vs_ar_decode`` / ``vs_ar_steady``; the cost model predicts the steady one) and ``step_ms``, the mean wall time of a
decode step alone (each ends in the step's host read, so it is the device's step time plus the
host's glue), the figure to set beside a bs1 loop's ms/step; ``prefill_seconds`` is the rest
(admissions). ``--audit`` adds each step's host reads, blocking host -> device copies, eager glue
ops and forwards (``specc.bench.step_audit``), from an extra untimed pass; ``graphs`` says which
steps replayed CUDA graphs. ``--kernels`` adds, for the one-level pass, the kernels launched inside
its decode steps by name and per step, beside the steps' wall time (one more pass under
``torch.profiler``).

One untimed pass precedes every timed one (Triton compiles, CUDA-graph captures per shape).
Rows go to ``--out-dir``/batching.jsonl as they are measured (one JSON object per line) and
``run.json`` (device, versions, acceptance, notice); ``--budget-s`` stops measuring (rows say
so) past that many seconds, so a run fits its slot.

    python3 examples/bench_batching.py --device cpu --shapes tiny-qwen3 --drafter-shapes dflash-b16,pard \\
        --acceptance tau:3 --tokens 8 --batches 1,2
    PYTHONPATH=. python3 examples/bench_batching.py --device cuda --shapes qwen3-8b --drafter-shapes dflash-b16,pard \\
        --acceptance dflash-qwen3-8b:humaneval --batches 1,4,8,16,32,64 --tokens 48 --deployment h200-bs1 \\
        --goodput --real specc-tiny:specc-tiny-dflash --out-dir $OUT/batching
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from specc.bench.batched import DECODE_RANGE, drive, measured, random_prompts, run_batch
from specc.passes.pipelines import DEFAULT_PIPELINE


@dataclasses.dataclass
class Pair:
    """One speculative system to measure: its loop, what decides acceptance, and its pricer."""

    label: str
    loop: object
    impl: object
    k: int
    acceptance: object  # AcceptanceModel replayed, or None: the target decides (real weights)
    pricer: object
    prompts: list
    ar: object  # the compiled AR loop over the same target
    margins: object  # PrefixLogits over the target's model definition: the reference margin where outputs differ


def compile_loop(target, draft, impl, spec, section, k, max_len, linear_choice=None):
    """The device loop of compiled steps (AR when ``draft`` is None); a ``target_ragged`` step too
    where codegen builds one. ``linear_choice``: which linears run cuBLAS (``specc compile`` uses
    the deployment's calibrated table; None: Triton everywhere)."""
    from specc.codegen.build import ROLE_STEP, build_step, build_steps
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop

    saved = getattr(target, "capture_layers", ())
    if draft is None:
        target.capture_layers = ()
    try:
        target.setup_caches(1, 16)
        if draft is not None:
            draft.setup_caches(1, 16)
        built = build_steps(target, draft, DEFAULT_PIPELINE, spec if draft is not None else None,
                            linear_choice=linear_choice)
        emitted = dict(built.emitted)
        if draft is not None and "target_ragged" in ROLE_STEP and getattr(target, "ragged_rows", False):
            target.setup_caches(1, 16)
            emitted["target_ragged"] = build_step(target, "target_ragged", DEFAULT_PIPELINE,
                                                  linear_choice=linear_choice).emitted
    finally:
        target.capture_layers = saved
    steps = {role: instantiate(e, spec if role == "drafter" else None) for role, e in emitted.items()}
    return build_loop(steps, impl.strategy if draft is not None else None, k if draft is not None else 0, max_len,
                      drafter_section=section if draft is not None else None)


def linears_of(opts, dev):
    """The linear choice table the steps are built with: the deployment's, as ``specc compile``
    lowers (on CUDA; ``--linears triton``: none)."""
    if dev.type != "cuda" or opts.linears == "triton":
        return None
    from specc.search.calibrate import linear_choice_for
    from specc.search.deployments import get_deployment

    return linear_choice_for(get_deployment(opts.deployment))


def linears_used(opts, dev) -> str:
    """What the steps' linears run, in words (run.json's ``linears``): a calibrated deployment's
    measured table, a built-in deployment's stated rule for its GPU, or (neither) Triton at every
    row count (runs 5b-8 measured that by mistake: on the H200 1.6x slower at B = 16, Q = 16;
    docs/benchmarks/h200-run8.md)."""
    from specc.codegen.linear_choice import RowRule

    if dev.type != "cuda" or opts.linears == "triton":
        return "triton"
    choice = linears_of(opts, dev)
    if choice is None:
        return (f"triton at every row count (deployment {opts.deployment} has no calibration record and its GPU "
                "no stated rule; pass a calibrated deployment file for the per-shape Triton / cuBLAS choice)")
    if isinstance(choice, RowRule):
        return choice.source
    return f"per-shape choice of {opts.deployment}'s calibration record"


def pricer_for(target_raw, drafter_raw, impl, k, opts, dev):
    from specc.search.batching_cost import BatchingPricer
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment
    from specc.search.meta_pair import MetaPair

    irs = MetaPair(target_raw, drafter_raw, impl.name, "bfloat16" if dev.type == "cuda" else None).irs(DEFAULT_PIPELINE)
    return BatchingPricer(CostModel(get_deployment(opts.deployment)), *irs, impl, k,
                          context=opts.prompt_len + opts.tokens // 2)


def shaped_pairs(opts, dev) -> list[Pair]:
    """Random-weight pairs: one target, each drafter of ``--drafter-shapes``, acceptance replayed."""
    import types

    from specc.bench.acceptance import parse_acceptance
    from specc.bench.shapes import build_causal, build_dflash, drafter_config, target_config
    from specc.methods import get_method
    from specc.runtime.replay import ReplayVerifier

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tcfg = target_config(opts.shapes)
    target = build_causal(tcfg, dtype, dev, seed=1)
    max_len = int(opts.prompt_len * 1.25) + opts.tokens + 4
    linears = linears_of(opts, dev)
    ar = compile_loop(target, None, get_method("ar"), None, None, 0, max_len, linears)
    prompts = random_prompts(max(opts.batches), opts.prompt_len, tcfg["vocab_size"], opts.seed)
    pairs = []
    for shapes in [d for d in opts.drafter_shapes.split(",") if d.strip() and d != "none"]:
        method, dcfg = drafter_config(opts.shapes, shapes)
        impl = get_method(method)
        draft = build_dflash(dcfg, dtype, dev, seed=3) if impl.name == "dflash" else build_causal(dcfg, dtype, dev, 2)
        target.capture_layers = ()
        loaded = impl.bind(target, draft)
        k = impl.num_draft(opts.num_draft, dcfg)
        section = impl.manifest_drafter(types.SimpleNamespace(drafter=types.SimpleNamespace(raw=dcfg)), loaded)
        acceptance = parse_acceptance(opts.acceptance, k)
        if acceptance is None:
            raise SystemExit("random weights accept nothing: give --acceptance (e.g. dflash-qwen3-8b:humaneval)")
        loop = compile_loop(loaded.target, loaded.draft, impl, loaded.draft_spec, section, k, max_len, linears)
        # draws by absolute position: a function of the verify's inputs, as two-level verification needs
        loop.verifier = ReplayVerifier(acceptance.alphas, seed=opts.seed, source=acceptance.source,
                                       lengths=lambda loop=loop: loop.state.lengths)
        pairs.append(Pair(f"{opts.shapes}+{shapes}", loop, impl, k, acceptance,
                          pricer_for(tcfg, dcfg, impl, k, opts, dev), prompts, ar, margins_of(target, opts)))
    return pairs


def real_pairs(opts, dev) -> list[Pair]:
    """Trained pairs (``--real TARGET:DRAFTER``): the target decides, acceptance is measured."""
    from specc.methods import get_method
    from specc.models.loading import load_tokenizer
    from specc.pairing import resolve_pair
    from specc.verify import CALIBRATION_TEXTS

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    pairs = []
    for spec in opts.real:
        target_name, _, drafter_name = spec.partition(":")
        pair = resolve_pair(target_name, drafter_name or None, None)
        impl = pair.impl
        k = impl.num_draft(opts.num_draft, pair.drafter.raw if pair.drafter else None)
        loaded = impl.load(pair, dtype, dev)
        tok = load_tokenizer(pair.target.path)
        texts = (CALIBRATION_TEXTS * (max(opts.batches) // len(CALIBRATION_TEXTS) + 1))[: max(opts.batches)]
        prompts = [tok(t)["input_ids"] for t in texts] if tok is not None else random_prompts(
            max(opts.batches), 16, int(pair.target.raw["vocab_size"]), opts.seed)
        max_len = max(len(p) for p in prompts) + opts.tokens + 4
        linears = linears_of(opts, dev)
        ar = compile_loop(loaded.target, None, get_method("ar"), None, None, 0, max_len, linears)
        loop = compile_loop(loaded.target, loaded.draft, impl, loaded.draft_spec,
                            impl.manifest_drafter(pair, loaded), k, max_len, linears)
        pairs.append(Pair(spec, loop, impl, k, None, pricer_for(pair.target.raw, pair.drafter.raw, impl, k, opts, dev),
                          prompts, ar, margins_of(loaded.target, opts)))
    return pairs


def pair_options(shapes: str, batch: int, tokens: int, deployment: str, real=()) -> argparse.Namespace:
    """The options ``shaped_pairs`` / ``real_pairs`` read, for scripts that build one Qwen3-8B +
    DFlash-b16 pair the way this benchmark does (``bench_packed_step.py``, ``bench_buckets.py``):
    DFlash's GSM8K acceptance replayed, 128-token prompts, the deployment's linear choice."""
    return argparse.Namespace(shapes=shapes, drafter_shapes="dflash-b16", acceptance="dflash-qwen3-8b:gsm8k",
                              num_draft=None, batches=[batch], tokens=tokens, prompt_len=128, seed=0,
                              deployment=deployment, linears="auto", fp32_audit=False, real=list(real))


def margins_of(model, opts):
    from specc.verify import PrefixLogits

    return PrefixLogits(model, fp32=opts.fp32_audit)


def checked(pair, what, prompts, reference, got, opts) -> list[dict]:
    """The numerical ties (JSON) where ``got`` differs from ``reference`` only at positions whose
    reference top-2 margin is within ``--tie-tolerance`` (``specc.verify.output_equality``);
    any other difference stops the run: a wrong system is not timed."""
    from specc.verify import compare_outputs

    report = compare_outputs(prompts, reference, got, pair.margins, opts.tie_tolerance)
    if not report.passed:
        raise SystemExit(f"{pair.label}: {what}: {report.summary()}: not timing a wrong system")
    return [d.to_json() for d in report.ties]


def kernel_profile(loop, prompts, tokens, dev, rule=None) -> dict:
    """One more pass under ``torch.profiler``: the kernels launched inside the decode steps, by
    name, per step (``specc.bench.gaps.kernels_in_ranges``), beside the steps' wall time: what a
    batched step's time is made of (docs/benchmarks/h200-run8.md: the profiler matched only part
    of the graph-replayed kernels to their steps there, so ``kernel_us`` is a lower bound)."""
    from specc.bench.gaps import kernel_gaps, kernels_in_ranges, profiled

    def traced(stack: bool) -> dict:
        return profiled(lambda: drive(loop, prompts, tokens, rule), dev.type == "cuda", stack)[1]

    out = kernels_in_ranges(traced(False), DECODE_RANGE)
    if dev.type == "cuda":  # where the device waited, by the loop's line that launched next (stacks inflate times)
        out["gaps_with_stacks"] = kernel_gaps(traced(True), out["ranges"], top=12)
    return out


def acceptance_of(pair, results):
    """The acceptance the prediction uses: the replayed model, or the one measured in this run."""
    from specc.search.acceptance import AcceptanceModel

    if pair.acceptance is not None:
        return pair.acceptance
    return AcceptanceModel.from_accepted_lengths([r.stats.accepted_lengths for r in results], pair.k,
                                                 source=f"measured in this run ({len(results)} requests)")


def best_k1(pricer, batch, acceptance):
    rows = [pricer.two_level(batch, acceptance, k1) for k1 in range(1, pricer.k)]
    return max(rows, key=lambda r: r.tokens_per_s) if rows else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="qwen3-8b", help="target shapes (specc.bench.shapes)")
    ap.add_argument("--drafter-shapes", default="dflash-b16,pard", help="drafter shapes, comma separated ('' none)")
    ap.add_argument("--acceptance", default="dflash-qwen3-8b:humaneval", help="acceptance model replayed (specc bench)")
    ap.add_argument("--real", default="", help="trained pairs TARGET:DRAFTER measured with real acceptance, comma "
                                              "separated (e.g. specc-tiny:specc-tiny-dflash)")
    ap.add_argument("--num-draft", type=int, help="drafts per step (default: each method's)")
    ap.add_argument("--batches", default="1,4,8,16,32,64", help="batch sizes, comma separated")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    ap.add_argument("--prompt-len", type=int, default=128, help="mean prompt length (+- 25%%)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--goodput", action="store_true", help="also run the goodput rule with one k per step")
    ap.add_argument("--deployment", default="h200-bs1",
                    help="deployment whose cost model predicts (any batch size) and whose linear choice the steps "
                         "take: a calibrated file's measured table, or a built-in GPU's stated rule")
    ap.add_argument("--linears", choices=("auto", "triton"), default="auto",
                    help="auto: the deployment's calibrated Triton/cuBLAS choice per linear, as specc compile "
                         "builds (CUDA); triton: Triton linears everywhere")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop measuring after this many seconds")
    ap.add_argument("--tie-tolerance", type=float,
                    help="top-2 logit margin below which two outputs may differ (a numerical tie, reported in the "
                         "row's 'ties'); default: specc.verify's for the dtype (bf16 0.25, fp32 1e-3)")
    ap.add_argument("--fp32-audit", action="store_true",
                    help="also measure each tie's gap in an fp32 copy of the target (memory: the weights again, x2)")
    ap.add_argument("--audit", action="store_true",
                    help="after each timed pass, one more pass counting each decode step's host reads, blocking "
                         "host -> device copies, eager glue ops and forwards (the row's 'audit')")
    ap.add_argument("--kernels", action="store_true",
                    help="after each one-level pass, one more under torch.profiler: the kernels of its decode steps by "
                         "name, per step, beside the steps' wall time (the row's 'kernels')")
    ap.add_argument("--out-dir", help="write batching.jsonl (a row per line, as measured) and run.json here")
    ap.add_argument("--out", help="also write every row in one JSON file")
    opts = ap.parse_args()
    opts.batches = sorted({int(b) for b in opts.batches.split(",") if b.strip()})
    opts.real = [r for r in opts.real.split(",") if r.strip()]
    dev = torch.device(opts.device)
    if opts.tie_tolerance is None:
        from specc.verify import DEFAULT_TOLERANCE

        opts.tie_tolerance = DEFAULT_TOLERANCE["bfloat16" if dev.type == "cuda" else "float32"]
    t0 = time.perf_counter()
    out_dir = Path(opts.out_dir) if opts.out_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "batching.jsonl").write_text("")
    linears = linears_used(opts, dev)
    if linears.startswith("triton at every row count ("):
        print(f"note: {linears}", flush=True)
    pairs = (shaped_pairs(opts, dev) if opts.drafter_shapes.strip() else []) + real_pairs(opts, dev)
    rows = []
    ar_rates: dict = {}  # (pair, B) -> the AR row's (decode, steady) tok/s

    def emit(row):
        if "skipped" not in row:
            key = (row["pair"], row["batch"])
            if row["system"] == "ar":
                ar_rates[key] = (row["decode_tokens_per_s"], row["steady_tokens_per_s"])
            base_rates = ar_rates.get(key)
            if base_rates and base_rates[0] > 0 and base_rates[1] > 0:
                row["vs_ar_decode"] = row["decode_tokens_per_s"] / base_rates[0]
                row["vs_ar_steady"] = row["steady_tokens_per_s"] / base_rates[1]
        rows.append(row)
        if out_dir:
            with open(out_dir / "batching.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        if "skipped" in row:
            print(f"{row['pair']:>28} {row['system']:>12} {row['batch']:>4}  skipped: {row['skipped']}")
            return
        pred = row.get("predicted_tokens_per_s")
        ratios = (f"{row['vs_ar_decode']:>6.2f}x {row['vs_ar_steady']:>6.2f}x" if "vs_ar_decode" in row
                  else f"{'-':>7} {'-':>7}")
        print(f"{row['pair']:>28} {row['system']:>12} {row['batch']:>4} {row['tokens_per_s']:>10,.1f} "
              f"{row['tokens_per_step']:>8.2f} {row['step_ms']:>8.2f} {row['decode_tokens_per_s']:>10,.1f} "
              f"{row['steady_tokens_per_s']:>10,.1f} {ratios} " + (f"{pred:>10,.1f}" if pred else f"{'-':>10}")
              + (f"  {row['note']}" if row.get("note") else "")
              + (f"  {len(row['ties'])} numerical ties" if row.get("ties") else ""))

    print("tok/s: end to end (prefills included); decode: decode tokens / decode seconds of this static batch; "
          "steady: B x tok/step / ms/step (every slot full); x AR: decode, steady; predicted: the cost model's "
          "steady decode tok/s")
    print(f"{'pair':>28} {'system':>12} {'B':>4} {'tok/s':>10} {'tok/step':>8} {'ms/step':>8} {'decode':>10} "
          f"{'steady':>10} {'x AR':>15} {'predicted':>10}")
    ar_tokens_at: dict = {}  # (AR loop, B) -> the AR tokens of each prompt
    for pair in pairs:
        for b in opts.batches:
            prompts = pair.prompts[:b]
            base = {"pair": pair.label, "batch": b, "method": pair.impl.name, "num_draft": pair.k}

            def over_budget(system):
                if time.perf_counter() - t0 > opts.budget_s:
                    emit({**base, "system": system, "skipped": f"time budget ({opts.budget_s:.0f} s) spent"})
                    return True
                return False

            ar_key = (id(pair.ar), b)
            if ar_key not in ar_tokens_at and not over_budget("ar"):
                ar_run, seconds, _ = run_batch(pair.ar, prompts, opts.tokens, dev, audit=opts.audit)
                ar_results = ar_run.results
                alone = [pair.ar.generate(p, opts.tokens, ()).tokens for p in prompts[:2]]
                ties = checked(pair, f"batched AR (B={b}) against the prompts run alone", prompts[:2], alone,
                               [r.tokens for r in ar_results[:2]], opts)
                emit({**base, "system": "ar", "num_draft": 0, **measured(ar_run, seconds, b),
                      "predicted_tokens_per_s": b / pair.pricer.ar_seconds(b), "ties": ties})
                ar_tokens_at[ar_key] = [r.tokens for r in ar_results]
            elif ar_key not in ar_tokens_at:
                continue
            ar_tokens = ar_tokens_at[ar_key]
            if over_budget("one-level"):
                continue
            loop = pair.loop
            if hasattr(loop, "two_level_k1"):
                loop.two_level_k1 = None
            run, seconds, _ = run_batch(loop, prompts, opts.tokens, dev, audit=opts.audit)
            results = run.results
            acc = acceptance_of(pair, results)
            exact = pair.acceptance is None

            def exact_ties(system, results):
                """Where the target decides: the output against compiled AR's, tie-aware."""
                if not exact:
                    return {}
                return {"ties": checked(pair, f"{system} against AR at B={b}", prompts, ar_tokens,
                                        [r.tokens for r in results], opts)}

            ties = exact_ties("one-level", results)
            one = pair.pricer.one_level(b, acc)
            kernels = {"kernels": kernel_profile(loop, prompts, opts.tokens, dev)} if opts.kernels else {}
            emit({**base, "system": "one-level", **measured(run, seconds, b), "graphs": loop.graph_stats(),
                  "predicted_tokens_per_s": one.tokens_per_s, "acceptance": acc.source, **ties, **kernels})
            if kernels:
                kp = kernels["kernels"]
                print(f"  kernels of a decode step ({kp['ranges']} steps): {kp['kernel_us'] / 1e3:.2f} ms of "
                      f"{kp['what']}s in {kp['range_ms']:.2f} ms, {kp['launches']:.0f} launches; largest: "
                      + ", ".join(f"{r['kernel']} {r['us_per_range']:.0f} us" for r in kp["top"][:8]), flush=True)
                for g in kp.get("gaps_with_stacks", {}).get("gaps", [])[:8]:
                    print(f"  idle {g['us_per_step']:.0f} us/step (host late {g['host_late_us_per_step']:.0f}) before "
                          f"{g['before']} after {g['after']}, launched by {g['launch']} at {g['frames']}", flush=True)

            two = best_k1(pair.pricer, b, acc)
            # both mechanisms need a packed verify; without one the loop would time one level under their name
            unpacked = None
            if not hasattr(loop, "two_level_k1"):
                unpacked = "the runtime has no two-level verification (DeviceSpeculativeDecoder.two_level_k1)"
            elif not getattr(loop, "verifies_ragged", False):
                unpacked = "the loop has no ragged verify step (a compiled target_ragged)"
            if two is not None and not over_budget("two-level"):
                if unpacked:
                    emit({**base, "system": "two-level", "skipped": unpacked,
                          "predicted_tokens_per_s": two.tokens_per_s, "two_level_k1": two.two_level_k1})
                else:
                    loop.two_level_k1 = two.two_level_k1
                    run, seconds, _ = run_batch(loop, prompts, opts.tokens, dev, audit=opts.audit)
                    loop.two_level_k1 = None
                    ties = exact_ties("two-level", run.results)
                    emit({**base, "system": "two-level", **measured(run, seconds, b), **ties,
                          "graphs": loop.graph_stats(), "two_level_k1": two.two_level_k1,
                          "predicted_tokens_per_s": two.tokens_per_s, "predicted_level2_rows": two.level2_rows,
                          "note": f"k1={two.two_level_k1}"})

            from specc.runtime.adaptive import GoodputDraftLength
            from specc.search.batch_pricing import ragged_step_seconds, step_seconds

            p = pair.pricer
            dense = step_seconds(p.cost, p.target_ir, p.draft_ir, p.method.name, p.context)
            ragged = ragged_step_seconds(p.cost, p.target_ir, p.draft_ir, p.method, p.context, p.k)
            rules = [("per-request", lambda: GoodputDraftLength(dense, p.k, ragged_seconds=ragged),
                      p.per_request(b, acc).tokens_per_s)]
            if opts.goodput:
                rules.append(("goodput", lambda: GoodputDraftLength(dense, p.k), p.dense_goodput(b, acc).tokens_per_s))
            for system, make, predicted in rules:
                if over_budget(system):
                    continue
                if system == "per-request" and getattr(loop, "verifies_ragged", None) is False:
                    emit({**base, "system": system, "skipped": "the loop has no ragged verify step (a compiled "
                          "target_ragged)", "predicted_tokens_per_s": predicted})
                    continue
                try:
                    rule = make()
                except TypeError:
                    emit({**base, "system": system, "skipped": "the runtime's GoodputDraftLength takes no "
                          "ragged_seconds (no per-row draft length)", "predicted_tokens_per_s": predicted})
                    continue
                run, seconds, _ = run_batch(loop, prompts, opts.tokens, dev, rule, audit=opts.audit)
                ks = run.ks
                ties = exact_ties(system, run.results)
                emit({**base, "system": system, **measured(run, seconds, b), "predicted_tokens_per_s": predicted,
                      **ties, "graphs": loop.graph_stats(),
                      "mean_k": sum(ks) / len(ks) if ks else 0.0, "note": f"mean k {sum(ks) / max(len(ks), 1):.1f}"})
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "shapes": opts.shapes, "drafter_shapes": opts.drafter_shapes, "real": opts.real, "tokens": opts.tokens,
              "prompt_len": opts.prompt_len, "deployment": opts.deployment, "acceptance": opts.acceptance,
              "tie_tolerance": opts.tie_tolerance, "linears": linears,
              "seconds": time.perf_counter() - t0,
              "notice": "random weights: speculative acceptance replayed from the stated model, tokens are not the "
                        "model's output; --real pairs decide with the target (output checked equal to AR)"}
    if out_dir:
        (out_dir / "run.json").write_text(json.dumps(report, indent=2) + "\n")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({**report, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
