"""``run_bench``: build each system, warm it up, time it over the prompts, predict it.

Three inputs (``BenchOptions``):

- a checkpoint (zoo name, local directory) with ``--drafter``: real weights, real acceptance
  (unless ``--acceptance`` states one to replay); AR baselines and stock run the same weights;
- an artifact (a directory written by `specc compile`): the specc system is the artifact's engine
  (``specc.load``), the baselines load the target the manifest names;
- named real shapes with random weights (``--shapes qwen3-8b --drafter-shapes dflash-b16``):
  timing is real, acceptance is replayed from ``--acceptance`` (required; the report says so).

Every system first runs ``warmup`` untimed generations (HF + torch.compile: 3), then each prompt
once, timed. Reported per system: medians over prompts of tokens/s (all tokens / wall time),
time to first token and steady decode tokens/s; the accepted lengths of every step; the
cost model's prediction for specc's systems (the acceptance it used beside it).
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch

from specc.errors import UserError

ALL_SYSTEMS = ("hf-eager", "hf-compiled", "stock", "specc-ar", "specc")


@dataclasses.dataclass
class BenchOptions:
    model: str | None = None
    drafter: str | None = None
    method: str | None = None
    num_draft: int | None = None
    shapes: str | None = None
    drafter_shapes: str | None = "dflash-b16"
    acceptance: str | None = None
    device: str = "cpu"
    tokens: int = 64
    prompts: int = 2
    prompt_len: int = 128
    systems: tuple[str, ...] = ALL_SYSTEMS
    deployment: str | None = None
    passes: str | None = None
    ar_passes: tuple[str, ...] = ()  # more specc-ar rows at batch 1, each compiled with one of these pipelines
    drafter_passes: str | None = None  # the drafter's own pipeline (None: the run's)
    seed: int = 0
    warmup: int = 1
    batches: tuple[int, ...] = (1,)  # batch sizes: 1 times every system; B > 1 specc-ar and specc (specc.bench.batched)
    tree: int | None = None  # tree budget of the speculative system (checkpoints and --shapes; artifacts: the manifest's)


def default_deployment(device: torch.device, batch: int = 1) -> str:
    from specc.search.deployments import deployment_names

    if device.type != "cuda":
        return "cpu"
    gpu = torch.cuda.get_device_name(device).lower()
    for name in ("h200", "h100", "a100"):
        if name in gpu and f"{name}-bs{batch}" in deployment_names():
            return f"{name}-bs{batch}"
    return f"h200-bs{batch}" if f"h200-bs{batch}" in deployment_names() else "h200-bs1"


class _Setup:
    """What a bench run holds: target (+ drafter) definitions on the device, prompts, HF twins."""

    target: Any = None
    loaded: Any = None  # LoadedPair
    impl: Any = None  # the Method
    section: dict = {}
    k: int = 0
    hf_target: Any = None
    stock: Any = None
    engine: Any = None  # an artifact's engine
    prompts: list = []
    label: str = ""
    target_raw: dict = {}
    drafter_raw: dict | None = None
    pipeline: str = ""
    prompts_for: Any = None  # B -> B prompts for a batched row (different lengths with --shapes)


def _pipeline(opts) -> str:
    from specc.passes.pipelines import DEFAULT_PIPELINE

    return DEFAULT_PIPELINE if opts.passes is None else opts.passes


def _is_artifact(opts) -> bool:
    """MODEL names an artifact written by ``specc compile`` (a folder with its manifest)."""
    return bool(opts.model) and (Path(opts.model) / "manifest.json").is_file()


def ar_row_name(pipeline: str, other: str) -> str:
    """The name of a specc-ar row compiled with ``other`` instead of the run's ``pipeline``: the
    passes it adds (+) and drops (-), e.g. ``specc-ar[-pack_weights_12bit]`` for a bf16 AR beside
    a packed run; ``specc-ar[order]`` when only the order differs."""
    mine = [p.strip() for p in pipeline.split(",") if p.strip()]
    theirs = [p.strip() for p in other.split(",") if p.strip()]
    diff = [f"+{p}" for p in theirs if p not in mine] + [f"-{p}" for p in mine if p not in theirs]
    if not diff:
        if theirs == mine:
            raise UserError(f"--ar-passes {other!r} is the run's own pipeline (--passes): specc-ar already runs it")
        diff = ["order"]
    return f"specc-ar[{','.join(diff)}]"


def check_ar_passes(opts, batches) -> None:
    """--ar-passes: known passes, each pipeline different from the run's, batch 1 in the run; a
    mistake stops here, before anything is built."""
    from specc.passes.registry import check_pipeline

    if 1 not in batches:
        raise UserError("--ar-passes adds AR rows at batch 1: include 1 in --batch")
    if _is_artifact(opts):
        raise UserError("--ar-passes: give a checkpoint or --shapes (an artifact's pipeline is fixed when it is compiled)")
    names = set()
    for other in opts.ar_passes:
        check_pipeline("--ar-passes", other)
        name = ar_row_name(_pipeline(opts), other)
        if name in names:
            raise UserError(f"--ar-passes {other!r}: given twice")
        names.add(name)


def check_drafter_passes(opts) -> None:
    """--drafter-passes: known passes, a run with a drafter that specc compiles here."""
    from specc.passes.registry import check_pipeline

    if _is_artifact(opts):
        raise UserError("--drafter-passes: give a checkpoint or --shapes (an artifact's pipeline is fixed when it "
                        "is compiled)")
    if (opts.shapes and opts.drafter_shapes == "none") or (opts.model and not opts.drafter) \
            or "specc" not in opts.systems:
        raise UserError("--drafter-passes needs a drafter (--drafter, or --drafter-shapes other than none) and the "
                        "specc system")
    check_pipeline("--drafter-passes", opts.drafter_passes)


def _drafter_pipeline(opts, s: _Setup, pipeline: str) -> str:
    """The pipeline the speculative row's drafter was built with: --drafter-passes, an artifact's
    record (older manifests have none: the target's), else the run's."""
    if s.engine is not None:
        recorded = s.engine.manifest["passes"].get("drafter_pipeline")
        return pipeline if recorded is None else recorded
    return opts.drafter_passes if opts.drafter_passes is not None else pipeline


def is_ar_system(name: str) -> bool:
    """An AR row: the baselines, specc-ar, and the specc-ar rows of --ar-passes."""
    return name in AR_SYSTEMS or name.startswith("specc-ar[")


def _setup_shapes(opts, dtype, dev) -> _Setup:
    from specc.bench.shapes import build_causal, build_dflash, build_target, drafter_config, hf_twin, target_config
    from specc.methods import get_method

    s = _Setup()
    tcfg = target_config(opts.shapes)
    method, dcfg = drafter_config(opts.shapes, opts.drafter_shapes)
    s.target_raw, s.drafter_raw = tcfg, dcfg
    s.impl = get_method(opts.method or method or "ar")
    if s.impl.uses_drafter and dcfg is None:
        raise UserError(f"--method {s.impl.name} needs --drafter-shapes")
    target = build_target(tcfg, dtype, dev, seed=1)
    draft = None
    if s.impl.uses_drafter:
        draft = build_dflash(dcfg, dtype, dev, seed=3) if s.impl.name == "dflash" else build_causal(dcfg, dtype, dev, 2)
    s.hf_target = hf_twin(target, tcfg) if {"hf-eager", "hf-compiled"} & set(opts.systems) else None
    s.loaded = s.impl.bind(target, draft)
    s.target = s.loaded.target
    s.k = s.impl.num_draft(opts.num_draft, dcfg)
    if s.impl.uses_drafter:
        s.section = s.impl.manifest_drafter(types.SimpleNamespace(drafter=types.SimpleNamespace(raw=dcfg)), s.loaded)
    g = torch.Generator().manual_seed(opts.seed)
    s.prompts = [torch.randint(10, tcfg["vocab_size"] - 10, (opts.prompt_len,), generator=g).tolist()
                 for _ in range(opts.prompts)]
    s.label = f"{opts.shapes} shapes" + (f" + {opts.drafter_shapes}" if draft is not None else "") + ", random weights"

    def prompts_for(b: int) -> list[list[int]]:
        from specc.bench.batched import random_prompts

        return random_prompts(b, opts.prompt_len, tcfg["vocab_size"], opts.seed + 1)

    s.prompts_for = prompts_for
    return s


def _prompts_from_tokenizer(tokenizer, vocab: int, count: int, seed: int) -> list[list[int]]:
    from specc.verify import CALIBRATION_TEXTS

    if tokenizer is None:
        g = torch.Generator().manual_seed(seed)
        return [torch.randint(1, vocab, (16,), generator=g).tolist() for _ in range(count)]
    texts = (CALIBRATION_TEXTS * (count // len(CALIBRATION_TEXTS) + 1))[:count]
    return [tokenizer(t)["input_ids"] for t in texts]


def _setup_checkpoint(opts, dtype, dev) -> _Setup:
    from specc.models.loading import load_tokenizer
    from specc.pairing import resolve_pair
    from specc.stock.runner import StockSystem, load_hf_causal_lm

    s = _Setup()
    pair = resolve_pair(opts.model, opts.drafter, opts.method)
    s.impl = pair.impl
    s.target_raw, s.drafter_raw = pair.target.raw, (pair.drafter.raw if pair.drafter else None)
    s.k = s.impl.num_draft(opts.num_draft, s.drafter_raw)
    s.loaded = s.impl.load(pair, dtype, dev)
    s.target = s.loaded.target
    if s.impl.uses_drafter:
        s.section = s.impl.manifest_drafter(pair, s.loaded)
    if {"hf-eager", "hf-compiled"} & set(opts.systems):
        s.hf_target = load_hf_causal_lm(pair.target.path, dtype, dev)
    if "stock" in opts.systems and s.impl.uses_drafter:
        s.stock = StockSystem(pair, s.k, dtype, dev)
    tokenizer, vocab = load_tokenizer(pair.target.path), int(s.target_raw["vocab_size"])
    s.prompts = _prompts_from_tokenizer(tokenizer, vocab, opts.prompts, opts.seed)
    s.prompts_for = lambda b: _prompts_from_tokenizer(tokenizer, vocab, b, opts.seed)
    s.label = pair.target.name + (f" + {pair.drafter.name}" if pair.drafter else "") + " (real weights)"
    s.pair = pair
    return s


def _setup_artifact(opts, dev) -> _Setup:
    from specc.codegen.artifact import ArtifactError
    from specc.runtime.engine import load

    try:
        engine = load(opts.model, dev)
    except ArtifactError as exc:
        raise UserError(str(exc)) from exc
    m = engine.manifest
    dtype = getattr(torch, m["deployment"]["dtype"]) if dev.type == "cuda" else torch.float32
    sub = dataclasses.replace(opts, model=m["model"]["name"], drafter=(m["drafter"] or {}).get("name"),
                              method=m["method"], num_draft=m.get("num_draft") or None,
                              passes=m["passes"]["pipeline"])
    try:
        s = _setup_checkpoint(sub, dtype, dev)
    except UserError as exc:
        raise UserError(f"{opts.model}: the baselines need the target the artifact names ({exc})") from exc
    s.engine = engine
    s.label = f"{opts.model} (artifact of {s.label})"
    return s


def _stats(runs: list[dict]) -> dict:
    def med(key):
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    lengths = [x for r in runs for x in r.get("accepted_lengths", [])]
    out = {"tokens_per_s": med("tokens_per_s"), "time_to_first_token_s": med("time_to_first_token_s"),
           "decode_tokens_per_s": med("decode_tokens_per_s"), "seconds": [r["seconds"] for r in runs],
           "tokens": sum(r["tokens"] for r in runs)}
    if lengths:
        out["accepted_lengths"] = lengths
        out["tau"] = sum(lengths) / len(lengths)
    return out


def _time(system, prompts, n, warmup: int) -> tuple[list[list[int]], dict, float]:
    t0 = time.perf_counter()
    for _ in range(warmup):
        system.generate(prompts[0], n)
    warm = time.perf_counter() - t0
    outs, runs = [], []
    for p in prompts:
        tokens, t = system.generate(p, n)
        outs.append(tokens)
        runs.append(t)
    return outs, _stats(runs), warm


def _predict(cost, irs, impl, k, acceptance, context, batch: int = 1):
    """The cost model's tokens/s for a specc row (+ its step time and E)."""
    t_ir, d_ir = irs
    pred = cost.predict(t_ir, d_ir, method=impl.name if k else "ar", num_draft=k, acceptance=acceptance,
                        context=context, batch_size=batch)
    return {"tokens_per_s": pred.tokens_per_s, "step_s": pred.step_time, "expected_tokens_per_step": pred.expected_tokens,
            "ar_step_s": pred.ar.time, "ar_floor_s": pred.ar.floor,
            "acceptance": acceptance.source if acceptance is not None and k else "AR (no drafts)"}


def run_bench(opts: BenchOptions, progress: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; returns the report (JSON-ready dict; ``specc.bench.report`` prints it)."""
    from specc.bench.acceptance import parse_acceptance, parse_tree_acceptance
    from specc.bench.batched import ONE_LEVEL_REFERENCE, BatchedRows
    from specc.bench.equality import audit_into, reference_margins, tie_tolerance
    from specc.search.batching_cost import ONE_LEVEL
    from specc.bench.systems import HFSystem, LoopSystem, StockSpecSystem
    from specc.codegen.build import build_steps
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop
    from specc.runtime.replay import REPLAY_NOTICE, TREE_REPLAY_NOTICE, ReplayVerifier
    from specc.runtime.verifiers import ChainVerifier
    from specc.runtime.state import reserve_block
    from specc.search.acceptance import AcceptanceModel
    from specc.search.calibrate import linear_choice_for
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment
    from specc.runtime import warmup as warm

    say = progress or (lambda msg: None)
    dev = torch.device(opts.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is available (use --device cpu)")
    if opts.tokens < 2 or opts.prompts < 1:
        raise UserError("--tokens must be >= 2 and --prompts >= 1")
    batches = sorted(set(int(b) for b in opts.batches))
    if not batches or batches[0] < 1:
        raise UserError(f"--batch: batch sizes must be >= 1 (got {','.join(map(str, opts.batches)) or 'none'})")
    batched = [b for b in batches if b > 1]
    if batched and opts.tree:
        raise UserError("--tree with --batch > 1: tree verification runs at batch 1 (give --batch 1)")
    unknown = set(opts.systems) - set(ALL_SYSTEMS)
    if unknown:
        raise UserError(f"unknown system {sorted(unknown)[0]!r}; systems: {', '.join(ALL_SYSTEMS)}")
    if opts.ar_passes:
        check_ar_passes(opts, batches)
    if opts.drafter_passes is not None:
        check_drafter_passes(opts)
    if opts.tree and _is_artifact(opts):
        raise UserError("--tree: an artifact verifies with the tree budget it was compiled with (specc compile --tree)")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(opts.seed)
    if opts.shapes:
        if opts.model:
            raise UserError("give either MODEL or --shapes, not both")
        say(f"building {opts.shapes} shapes with random weights on {dev}")
        s = _setup_shapes(opts, dtype, dev)
    elif _is_artifact(opts):
        say(f"loading artifact {opts.model}")
        s = _setup_artifact(opts, dev)
    elif opts.model:
        say(f"loading {opts.model}" + (f" + {opts.drafter}" if opts.drafter else ""))
        s = _setup_checkpoint(opts, dtype, dev)
    else:
        raise UserError("give MODEL (a checkpoint or an artifact) or --shapes NAME")
    stated = parse_acceptance(opts.acceptance, s.k) if s.k else None
    if opts.tree and not (s.impl.supports_tree and s.k):
        raise UserError(f"--tree: method {s.impl.name} has no per-position draft distributions (no tree verification)")
    if s.engine is not None:
        tree_budget = int(getattr(s.engine.loop, "tree_budget", 0)) if s.k else 0
    else:
        tree_budget = int(opts.tree or 0)
    stated_tree = parse_tree_acceptance(opts.acceptance, s.k) if tree_budget else None
    if opts.shapes and s.k and stated is None:
        raise UserError("random weights accept nothing: state the acceptance to replay, e.g. --acceptance tau:6.5 "
                        "or --acceptance dflash-qwen3-8b:gsm8k")
    replay = stated is not None
    dep = get_deployment(opts.deployment or default_deployment(dev, 1))
    cost = CostModel(dep)
    pipeline = _pipeline(opts) if s.engine is None else s.engine.manifest["passes"]["pipeline"]
    n, prompts = opts.tokens, s.prompts
    batch_prompts = {b: s.prompts_for(b) for b in batched}
    max_len = max(len(p) for p in prompts + [q for ps in batch_prompts.values() for q in ps]) + n + 2
    context = int(statistics.mean(len(p) for p in prompts) + n / 2)
    rows: list[dict] = []
    reference, differing = None, {}  # differing: system -> its outputs, where they are not HF eager's

    def record(name, system, kind, extra=None, warmup=None, one_time=0.0):
        nonlocal reference
        say(f"timing {name}")
        outs, st, warm_s = _time(system, prompts, n, opts.warmup if warmup is None else warmup)
        row = {"system": name, "kind": kind, "batch": 1, "one_time_s": one_time + warm_s, **st, **(extra or {})}
        if name == "hf-eager":
            reference = outs
        if row.get("replay"):
            row["same_tokens_as_hf_eager"] = None
        elif reference is not None:
            row["same_tokens_as_hf_eager"] = same = outs == reference
            if not same:
                differing[name] = outs
        rows.append(row)
        say(f"{name}: {row['tokens_per_s']:,.1f} tok/s")
        return row

    def skipped(name, kind, reason):
        rows.append({"system": name, "kind": kind, "skipped": reason})
        say(f"{name}: skipped ({reason})")

    # ---------------------------------------------------------------- AR baselines (batch 1)
    bs1 = 1 in batches
    if bs1 and "hf-eager" in opts.systems:
        record("hf-eager", HFSystem(s.hf_target, dev), "baseline")
    if "hf-eager" in opts.systems:
        from specc.bench.systems import hf_batch

        for b in batched:
            say(f"timing hf-eager at B={b}")
            rows.append({"system": "hf-eager", "kind": "baseline", **hf_batch(HFSystem(s.hf_target, dev),
                                                                              batch_prompts[b], n, opts.warmup > 0)})
    if bs1 and "hf-compiled" in opts.systems:
        if dev.type != "cuda":
            skipped("hf-compiled", "baseline", "CPU: torch.compile reduce-overhead needs CUDA graphs (and compiling "
                                               "takes minutes on CPU)")
        else:
            try:
                record("hf-compiled", HFSystem(s.hf_target, dev, static=True), "baseline", warmup=3)
            except Exception as exc:  # a transformers / torch combination that cannot compile it
                skipped("hf-compiled", "baseline", f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            torch._dynamo.reset() if hasattr(torch, "_dynamo") else None
    if bs1 and "stock" in opts.systems and s.impl.uses_drafter:
        name = f"stock-{s.impl.name}"
        if s.stock is None:
            skipped(name, "baseline", "random weights: stock would decide acceptance itself (zero); not comparable")
        elif replay:
            skipped(name, "baseline", "acceptance is replayed for specc; stock cannot replay it")
        else:
            record(name, StockSpecSystem(s.stock, dev, s.impl.name), "stock")
    s.hf_target = s.stock = None
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # ---------------------------------------------------------------- specc
    choice = linear_choice_for(dep) if dev.type == "cuda" else cost.linear_choice

    def compiled(with_drafter: bool, passes: str | None = None):
        from specc.codegen.build import add_target_step, wants_ragged_step

        t0 = time.perf_counter()
        target, draft = s.loaded.target, s.loaded.draft if with_drafter else None
        saved = getattr(target, "capture_layers", ())
        if not with_drafter:
            target.capture_layers = ()  # plain AR returns no hidden states
        try:
            if draft is not None:  # a hybrid target keeps per-node GDN states for its largest verify block
                reserve_block(target, max(s.k, tree_budget) + 1)
            target.setup_caches(1, 16)
            if draft is not None:
                draft.setup_caches(1, 16)
            spec = s.loaded.draft_spec if draft is not None else None
            own = {"drafter": opts.drafter_passes} if draft is not None and opts.drafter_passes is not None else None
            built = build_steps(target, draft, pipeline if passes is None else passes, spec,  # as compile does
                                linear_choice=choice, role_pipelines=own, tree=bool(tree_budget and draft is not None))
            if draft is not None and batched and wants_ragged_step(target, s.k):  # packed rows: two-level, per-row k
                add_target_step(built, target, pipeline, "target_ragged", choice)
        finally:
            target.capture_layers = saved
        steps = {role: instantiate(e, spec if role == "drafter" else None) for role, e in built.emitted.items()}
        strategy = s.impl.strategy if draft is not None else None
        loop = build_loop(steps, strategy, s.k if draft is not None else 0, max_len,
                          drafter_section=s.section if draft is not None else None,
                          tree_budget=tree_budget if draft is not None else 0)
        irs = (built.irs["target"], built.irs.get("drafter"))
        return loop, irs, time.perf_counter() - t0

    def warmed(loop):
        stats = warm.warm_up(loop, int(s.target_raw["vocab_size"]), prompt_len=len(prompts[0]))
        return stats["kernels"] + stats["graphs"]

    at_batch = BatchedRows(dev, n, opts.warmup > 0, cost, say)
    ar_tokens_at: dict = {}  # B -> specc-ar's tokens of each request (the reference where the target decides)

    def record_batched(row, tokens, b):
        if row["system"] == "specc-ar":
            ar_tokens_at[b] = tokens
        elif not row.get("replay") and b in ar_tokens_at:  # greedy: every request's tokens are AR's
            if tokens == ar_tokens_at[b]:
                row["same_tokens_as_specc_ar"] = True
            else:
                audit_into(row, "same_tokens_as_specc_ar", batch_prompts[b], ar_tokens_at[b], tokens,
                           reference_margins(s.loaded.target, dtype), tie_tolerance(dtype))
        rows.append(row)

    ar_pred = None
    if "specc-ar" in opts.systems:
        say("compiling specc AR")
        loop, irs, build_s = compiled(False)
        one = build_s + (warmed(loop) if bs1 else 0.0)
        ar_pred = _predict(cost, irs, s.impl, 0, None, context)
        if bs1:
            record("specc-ar", LoopSystem(loop, dev, "specc-ar"), "specc", {"prediction": ar_pred}, one_time=one)
            one = 0.0
        for b in batched:
            record_batched(*at_batch.ar("specc-ar", loop, b, batch_prompts[b], irs[0], one_time=one), b)
            one = 0.0
        del loop
    for other in opts.ar_passes if bs1 else ():  # AR under another pipeline (e.g. bf16 beside a packed run)
        label = ar_row_name(pipeline, other)
        say(f"compiling {label}")
        loop, irs, build_s = compiled(False, other)
        record(label, LoopSystem(loop, dev, label), "specc",
               {"pipeline": other, "prediction": _predict(cost, irs, s.impl, 0, None, context)},
               one_time=build_s + warmed(loop))
        del loop
    if "specc" in opts.systems and s.impl.uses_drafter:
        name = f"specc-{s.impl.name}"
        if s.engine is not None:
            loop, one = s.engine.loop, s.engine.load_stats.get("total", 0.0)
            from specc.search.meta_pair import MetaPair

            irs = MetaPair(s.target_raw, s.drafter_raw, s.impl.name, dep.dtype).irs(pipeline)
        else:
            say(f"compiling {name}")
            loop, irs, build_s = compiled(True)
            one = build_s
        acc = stated
        if bs1:
            verifier = ReplayVerifier(stated.alphas, seed=opts.seed, source=stated.source) if replay else ChainVerifier()
            loop.verifier = verifier
            loop.tree_budget = 0  # a tree artifact's chain row: its chain verify step, the same drafter
            if s.engine is None:
                one += warmed(loop)
            if replay:
                verifier.reset()
            extra = {"num_draft": s.k, "replay": replay,
                     "acceptance": stated.source if replay else "real (the target decides)"}
            row = record(name, LoopSystem(loop, dev, name), "specc", extra, one_time=one)
            one = 0.0
            acc = stated if replay else AcceptanceModel.from_accepted_lengths(
                [row.get("accepted_lengths", [])] if row.get("accepted_lengths") else [], s.k,
                source="measured in this run")
            row["prediction"] = _predict(cost, irs, s.impl, s.k, acc, context)
            if replay:
                row["acceptance_model"] = stated.to_json()
                row["expected_tokens_per_step"] = stated.expected_tokens(s.k)
            if ar_pred is None:
                ar_pred = {"ar_step_s": row["prediction"]["ar_step_s"], "ar_floor_s": row["prediction"]["ar_floor_s"]}
            loop.verifier = ChainVerifier()
            loop.tree_budget = tree_budget
            if tree_budget:
                from specc.bench.tree_rows import record_tree_row

                record_tree_row(record, loop, dev, name, s, irs, cost, context, stated_tree if replay else None,
                                opts.seed, row)
        saved_tree, loop.tree_budget = getattr(loop, "tree_budget", 0), 0  # batched rows verify chains
        artifact_choice = s.engine.batching if s.engine is not None and s.engine.batching.get("source") else None

        def speculative_at(b, section, one_time=0.0):
            return at_batch.speculative(name, loop, b, batch_prompts[b], irs, s.impl, s.k, stated=stated,
                                        seed=opts.seed, acceptance=None if replay else acc, section=section,
                                        one_time=one_time)

        for b in batched:
            row, tokens = speculative_at(b, artifact_choice, one)
            record_batched(row, tokens, b)
            one = 0.0
            if row["mechanism"] != ONE_LEVEL:  # the mechanism off, in the same run: what it gains
                record_batched(*speculative_at(b, ONE_LEVEL_REFERENCE), b)
        loop.tree_budget = saved_tree

    if differing:
        from specc.bench.equality import classify_differences

        say("auditing the differences from HF eager's tokens (numerical ties?)")
        classify_differences(rows, differing, reference, prompts, getattr(s.loaded, "target", None), dtype)
    best_ar = _compare(rows)
    from specc.codegen.kernels.pdl import launch_mode
    from specc.runtime.step_graphs import step_graphs_enabled
    from specc.switches import batch_draft_ahead_enabled, residual_norm_enabled

    report = {
        "format": "specc-bench/1", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "what": s.label,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({platform.processor() or platform.machine()}, "
                                                                             f"{torch.get_num_threads()} threads)",
        "versions": _versions(), "dtype": str(dtype).replace("torch.", ""), "deployment": dep.name,
        "launch": launch_mode(dev), "step_graphs": bool(dev.type == "cuda" and step_graphs_enabled()),
        "batch_draft_ahead": bool(dev.type == "cuda" and batch_draft_ahead_enabled()),
        "residual_norm_pairs": residual_norm_enabled(),  # where linears lower to cuBLAS (codegen/residual_norm.py)
        "method": s.impl.name, "num_draft": s.k, "pipeline": pipeline,
        "drafter_pipeline": _drafter_pipeline(opts, s, pipeline),
        "tokens": n, "prompts": len(prompts),
        "prompt_lengths": [len(p) for p in prompts], "batches": batches, "context_for_prediction": context,
        "acceptance": ({"mode": "replay", "source": stated.source, "model": stated.to_json(),
                        "expected_tokens_per_step": stated.expected_tokens(s.k), "notice": REPLAY_NOTICE}
                       if replay else {"mode": "real" if s.k else "none"}),
        "tree_budget": tree_budget,
        "best_ar": best_ar["system"] if best_ar else None,
        "ar_floor_tokens_per_s": 1.0 / ar_pred["ar_floor_s"] if ar_pred and ar_pred.get("ar_floor_s") else None,
        "rows": rows,
    }
    if replay and stated_tree is not None:
        report["acceptance"]["tree"] = {"source": stated_tree.source, "model": stated_tree.to_json(),
                                        "budget": tree_budget, "depth": s.k,
                                        "expected_tokens_per_step": stated_tree.expected_tokens(tree_budget, s.k),
                                        "replay": TREE_REPLAY_NOTICE}
    return report


AR_SYSTEMS = ("hf-eager", "hf-compiled", "specc-ar")


def _compare(rows: list[dict]) -> dict | None:
    """Set each measured row's speedups over the AR rows of its own batch size (tokens/s end to
    end; batched rows also decode and steady decode over specc-ar's) and its rate at the stated
    acceptance (replayed rows); returns the best AR row at batch 1 (None without one)."""
    from specc.bench.batched import stated_rates

    done = [r for r in rows if not r.get("skipped")]
    best_at: dict = {}
    for r in done:
        b = r.get("batch", 1)
        if is_ar_system(r["system"]) and (b not in best_at or r["tokens_per_s"] > best_at[b]["tokens_per_s"]):
            best_at[b] = r
    for r in done:
        b = r.get("batch", 1)
        same = [x for x in done if x.get("batch", 1) == b]
        best = best_at.get(b)
        if best is not None:
            r["speedup_vs_best_ar"] = r["tokens_per_s"] / best["tokens_per_s"]
        ars = [x for x in same if is_ar_system(x["system"])]
        for x in ars:
            r.setdefault("speedup_vs", {})[x["system"]] = r["tokens_per_s"] / x["tokens_per_s"]
        if b == 1:
            at_stated = at_stated_acceptance(r, best)
            if at_stated is not None:  # beside every AR row's decode, not only the best's
                at_stated["decode_speedup_vs"] = {x["system"]: at_stated["decode_tokens_per_s"] / x["decode_tokens_per_s"]
                                                  for x in ars if x.get("decode_tokens_per_s")}
        else:
            ar = next((x for x in same if x["system"] == "specc-ar"), None)
            if ar is not None and r is not ar:
                for key in ("decode_tokens_per_s", "steady_tokens_per_s"):
                    if ar.get(key):
                        r[key.replace("tokens_per_s", "speedup_vs_ar")] = r[key] / ar[key]
            at_stated = stated_rates(r, r.get("expected_tokens_per_step"), ar) if r.get("replay") else None
        if at_stated is not None:
            r["at_stated_acceptance"] = at_stated
    return best_at.get(1)


def at_stated_acceptance(row: dict, best_ar: dict | None) -> dict | None:
    """A replayed row's decode rate at the acceptance model's expected tokens per step E instead
    of the mean its draws gave in this run (a few hundred steps: 256 tokens x 4 prompts at tau 6.55
    draw a mean within ~0.4 of E): the measured decode step time, ``tau / decode tok/s``, times E.
    Only the accepted counts change, not any timing (a step's time hardly depends on how many of
    its drafts are accepted); None for rows that are not replayed."""
    tau, expected, decode = row.get("tau"), row.get("expected_tokens_per_step"), row.get("decode_tokens_per_s")
    if not row.get("replay") or not tau or not expected or not decode:
        return None
    out = {"tokens_per_step": expected, "drawn_tokens_per_step": tau, "decode_step_s": tau / decode,
           "decode_tokens_per_s": decode * expected / tau}
    if best_ar is not None and best_ar.get("decode_tokens_per_s"):
        out["decode_speedup_vs_best_ar"] = out["decode_tokens_per_s"] / best_ar["decode_tokens_per_s"]
    return out


def _versions() -> dict:
    out = {"torch": torch.__version__}
    for mod in ("transformers", "triton"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    from specc import __version__

    out["specc"] = __version__
    return out
