"""The compile pipeline: load -> trace -> passes -> lower -> emit -> token forcing -> publish.

``compile_artifact`` is what `specc compile` runs. It never publishes an artifact that fails
token forcing against stock: the staged directory is deleted and ``VerificationFailed`` raised.
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
from pathlib import Path
from typing import Callable

import torch

from specc import __version__
from specc.errors import UserError, auto_off_or_int
from specc.passes.pipelines import DEFAULT_PIPELINE

__all__ = ["DEFAULT_PIPELINE", "CompileResult", "VerificationFailed", "compile_artifact"]


class VerificationFailed(RuntimeError):
    """Token forcing found a non-tie mismatch: nothing was written."""


@dataclasses.dataclass
class CompileResult:
    path: Path
    manifest: dict
    summary_lines: list[str]
    manifest_hash: str = ""  # sha256 of manifest.json: pin it with `specc run --expect-hash`


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _step_costs(ir, values: dict) -> dict:
    from specc.ir import evaluate

    totals = ir.totals()
    return {"weight_bytes": float(evaluate(totals.weight_bytes, values)),
            "bytes_read": float(evaluate(totals.bytes_read, values)),
            "flops": float(evaluate(totals.flops, values))}


def _reserve_block(target, block: int) -> None:
    """Give a hybrid target's GDN state ``block`` per-node entries before tracing: the emitted
    steps' state specs (and so the artifact's capacity) come from the traced buffers."""
    from specc.runtime.state import reserve_block

    reserve_block(target, block)
    target.setup_caches(1, 16)


def _choose_tree(tree, pair, dep, pipeline, k, prompts, max_new_tokens, dtype, device, say,
                 irs=None) -> dict | None:
    """The manifest's tree section (None: the method cannot build trees or no drafts).
    ``irs``: the built (target, drafter) IRs the cost model prices."""
    impl = pair.impl
    if not (impl.supports_tree and k):
        if tree not in (None, "auto", "off", 0, "0"):
            raise UserError(f"method {impl.name} has no per-position draft distributions: no tree verification")
        return None
    if tree in (None, "off", 0, "0"):
        return {"budget": 0, "depth": k, "acceptance_source": "off (requested)"}
    if tree != "auto":
        budget = auto_off_or_int(tree, "--tree", "a node budget")
        if budget < 1:
            raise UserError("--tree N needs N >= 1")
        return {"budget": budget, "depth": k, "acceptance_source": "given (--tree)"}
    from specc.search.measure_tree import measure_rank_acceptance
    from specc.search.tree_cost import tree_choice

    say(f"measuring per-rank draft acceptance on {len(prompts)} prompts for the tree budget")
    model = measure_rank_acceptance(pair, prompts, max_new_tokens, k, ranks=8, dtype=dtype, device=device)
    section = tree_choice(pair, dep, pipeline, k, model, irs=irs, context=_context(pair, dep))
    section["acceptance"] = model.to_json()
    return section


def _context(pair, dep) -> int:
    """The KV-cache length the tree and batching choices price: the cost model's default, at most
    the models' positions (as ``choose_pipeline`` and `specc cost` price it)."""
    from specc.search.cost_model import default_context

    return default_context(dep, pair.target.raw, pair.drafter.raw if pair.drafter else None)


def _verifies_ragged(target, k: int) -> bool:
    """Whether the artifact verifies packed rows of their own lengths, which two-level verification
    and per-request k need: it gets a ``target_ragged`` step (``codegen.build.wants_ragged_step``)."""
    from specc.codegen.build import wants_ragged_step

    return wants_ragged_step(target, k)


def _choose_batching(pair, dep, irs, k: int, acceptance, two_level, target, tree_budget: int) -> dict:
    """The manifest's batching section (``search.batching_choice``): two-level verification or
    per-request k for a batch > 1 deployment, priced on the built IRs with the measured acceptance."""
    from specc.search.batching_choice import batching_section
    from specc.search.batching_cost import BatchingPricer
    from specc.search.cost_model import CostModel

    pricer = None
    if k and pair.impl.uses_drafter:
        pricer = BatchingPricer(CostModel(dep), irs[0], irs[1], pair.impl, k, _context(pair, dep))
    return batching_section(pricer, dep.batch_size, acceptance, two_level=two_level, tree_budget=tree_budget,
                            ragged=_verifies_ragged(target, k), num_draft=k)


def _linear_choice(dep, given):
    """The LinearChoice the lowering uses: ``given`` (a LinearChoice, or the path of its JSON),
    else the deployment's calibrated table (``specc calibrate``), else on CUDA the stated rule
    for its GPU (``linear_choice.BUILTIN_RULES``), else None (Triton linears everywhere);
    False: None."""
    if given is False:
        return None
    if isinstance(given, (str, Path)):
        import json

        from specc.codegen.linear_choice import LinearChoice

        try:
            return LinearChoice.from_json(json.loads(Path(given).read_text()))
        except (OSError, ValueError) as exc:  # ValueError: JSON, UTF-8 and table errors
            raise UserError(f"{given}: unreadable linear choice table ({exc})") from exc
    if given is not None:
        return given
    from specc.search.calibrate import linear_choice_for

    return linear_choice_for(dep)


def _remember_acceptance(pair, dep, memory, k: int, acc) -> None:
    """Record stock's measured acceptance in the search memory, so that `specc cost` predicts
    this pair with the same acceptance compile did (one source of acceptance)."""
    if memory is False or pair.drafter is None:
        return
    from specc.search.memory import Memory, family_of, pair_weights

    try:
        mem = memory if isinstance(memory, Memory) else Memory.open(family_of(pair.target.raw), dep.name, memory)
        mem.record_acceptance(pair.target.name, pair.drafter.name, pair.method, k, acc, weights=pair_weights(pair))
        mem.save()
    except (OSError, UserError):  # a read-only cache: the prediction still uses it, the memory does not keep it
        pass


def _stock_acceptance(pair, dep, memory, prompts, max_new_tokens, dtype, device, say, count, runs: dict):
    """The ``measure`` callback ``choose_pipeline`` calls when the search memory holds no measured
    acceptance for the pair (a first compile): stock on the calibration prompts at k drafts per
    step, its accepted lengths as an AcceptanceModel (None when no step drafted), remembered in the
    memory at k. Choosing drafts per step from it, not from an assumed E = 1, makes a first compile
    choose what a later one reading the memory chooses. ``runs[k]`` keeps stock's runs: token
    forcing reuses them when the artifact drafts k per step."""
    from specc.search.acceptance import AcceptanceModel
    from specc.verify import run_stock_reference

    def measure(k: int):
        say(f"measuring acceptance: stock at k={k} on {len(prompts)} calibration prompts "
            "(the search memory holds none at that k)")
        runs[k] = run_stock_reference(pair, prompts, max_new_tokens, k, dtype, device, progress=count("stock"))
        if not any(r.accepted_lengths for r in runs[k]):
            return None
        source = f"measured by stock at k={k} on {len(runs[k])} calibration prompts"
        acc = AcceptanceModel.from_accepted_lengths([r.accepted_lengths for r in runs[k]], k, source=source)
        _remember_acceptance(pair, dep, memory, k, acc)
        return acc

    return measure


def _plugins(pipeline: str | None, drafter_passes: str | None) -> list[dict]:
    """The manifest's ``plugins``: the user passes of every role's pipeline, each once."""
    from specc.passes.registry import plugin_records

    records = plugin_records(pipeline)
    return records + [r for r in plugin_records(drafter_passes) if r not in records]


def _cublas_nodes(summary: dict) -> int:
    """Linear nodes a role's lowering gave cuBLAS row ranges."""
    return sum(len(r["nodes"]) for r in summary.get("linear_impl") or []
               if any(x["impl"] == "cublas" for x in r["ranges"]))


def compile_artifact(model: str, drafter: str | None = None, *, out: str | Path,
                     progress: Callable[[str], None] | None = None, **kwargs) -> CompileResult:
    """Compile a target (+ drafter) for a deployment into an artifact at ``out``.

    ``out`` is checked before any work (its parent exists and is writable; an existing path is
    replaced only when it is a specc artifact) and locked for the whole compile, so two compiles
    to one path run one after the other; stale temporaries of killed runs are removed. Keywords:
    see ``_compile_artifact``."""
    from specc.codegen.artifact import check_output_path, output_lock

    out = check_output_path(Path(out))
    with output_lock(out, progress):
        check_output_path(out)  # again: it may have changed while this waited for the lock
        return _compile_artifact(model, drafter, out=out, progress=progress, **kwargs)


def _compile_artifact(model: str, drafter: str | None = None, *, method: str | None = None, deployment: str = "cpu",
                      out: str | Path, passes: str | None = None, prompts: list[list[int]] | None = None,
                      prompts_file: str | None = None, num_draft: int | None = None, max_new_tokens: int = 24,
                      tolerance: float | None = None, progress: Callable[[str], None] | None = None,
                      memory=None, tree: str | int | None = "auto", two_level: str | int | None = "auto",
                      linear_choice=None, drafter_passes: str | None = None) -> CompileResult:
    """Compile a target (+ drafter) for a deployment into an artifact at ``out``.

    ``passes=None`` lets the cost model choose the pipeline and drafts per step
    (``specc.search.choose_pipeline``: validated mechanisms from the search memory first, else
    the default pipeline), with the memory's measured acceptance for the pair, else stock's
    measured first on the calibration prompts (``_stock_acceptance``), so an empty memory and one
    holding that measurement choose alike; ``memory``: a memory file, None for the default
    location, False for none. Raises ``VerificationFailed`` (nothing written) when token forcing fails.

    ``tree``: tree verification. "auto" (default): where the method has per-position draft
    distributions (``Method.supports_tree``), measure per-rank acceptance on the calibration
    prompts (``search.measure_tree``) and let the cost model pick a node budget or the chain
    (``search.tree_cost``); "off" / None / 0: chains; an int N: a tree of N drafted nodes.
    The manifest's ``tree`` section records the budget, depth and acceptance source.

    ``two_level``: two-level verification. "auto" (default): for a batch > 1 deployment the cost
    model prices one level, two-level at each k1 and per-request k with the acceptance stock
    measured on the calibration prompts and the manifest's ``batching`` section records the
    choice (``search.batching_choice``); "off": two-level is not considered; an int K1 in
    1..k-1: two-level with K1 drafts in level 1.

    ``linear_choice``: which linears run cuBLAS instead of the Triton kernel, per shape and row
    range (a ``codegen.linear_choice.LinearChoice`` or its JSON file); None (default): the table in the
    deployment's calibration record (``specc calibrate`` measures both), if any; False: Triton
    everywhere. The manifest's ``linear_choice`` section and each role's ``lowering.linear_impl``
    record the choice and the measured times behind it.

    ``drafter_passes``: the drafter's own pipeline (None: the target's), e.g. 12-bit weights for
    the target only; the cost model prices the drafter with it, and the manifest's
    ``passes.drafter_pipeline`` records the pipeline the drafter was built with."""
    from specc.codegen.artifact import publish, stage_artifact, write_manifest
    from specc.codegen.artifact_trust import manifest_hash
    from specc.codegen.build import add_target_step, build_steps, wants_ragged_step
    from specc.models.loading import content_hash, load_tokenizer
    from specc.pairing import check_num_draft, resolve_pair
    from specc.passes.registry import check_pipeline
    from specc.runtime.engine import load
    from specc.search.deployments import get_deployment
    from specc.verify import (DEFAULT_TOLERANCE, calibration_prompts, force_ragged, load_prompts_file, run_stock_reference,
                              verify_system)

    say = progress or (lambda msg: None)
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= 1 << 16:
        raise UserError(f"verify tokens must be in 1..{1 << 16} (got {max_new_tokens!r})")
    check_pipeline("--passes", passes)
    check_pipeline("--drafter-passes", drafter_passes)
    pair = resolve_pair(model, drafter, method)
    check_num_draft(pair, num_draft)
    positions = pair.target.raw.get("max_position_embeddings")
    if isinstance(positions, int) and max_new_tokens + 1 > positions:
        raise UserError(f"--verify-tokens {max_new_tokens} exceeds the model's {positions} positions")
    dep = get_deployment(deployment)
    if dep.device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"deployment {dep.name} needs a CUDA GPU; none is available (use --deployment cpu)")
    choice_table = _linear_choice(dep, linear_choice)
    dtype, device = _dtype(dep.dtype), torch.device(dep.device)
    tolerance = DEFAULT_TOLERANCE[dep.dtype] if tolerance is None else tolerance
    out = Path(out)

    say(f"loading {pair.target.name}" + (f" + {pair.drafter.name} ({pair.method})" if pair.drafter else ""))
    method_impl = pair.impl
    drafter_raw = pair.drafter.raw if pair.drafter else None
    k = method_impl.num_draft(num_draft, drafter_raw)
    from specc.search.batching_choice import check_given, parse_two_level

    two_level = parse_two_level(two_level, k if method_impl.uses_drafter else 0)
    loaded = method_impl.load(pair, dtype, device)
    target, draft_module, spec = loaded.target, loaded.draft, loaded.draft_spec
    if drafter_passes is not None and draft_module is None:
        raise UserError(f"--drafter-passes: {pair.method} has no drafter network to compile "
                        f"({'no --drafter given' if pair.drafter is None else 'its drafts need no step of their own'})")
    check_given(two_level, dep.batch_size, _verifies_ragged(target, k))
    tokenizer = load_tokenizer(pair.target.path)
    target.setup_caches(1, 16)
    if draft_module is not None:
        draft_module.setup_caches(1, 16)

    vocab = int(pair.target.raw["vocab_size"])
    if prompts is None:
        prompts = load_prompts_file(prompts_file, tokenizer, vocab) if prompts_file else calibration_prompts(tokenizer, vocab)
    longest = max(len(p) for p in prompts)
    if isinstance(positions, int) and longest + max_new_tokens > positions:
        raise UserError(f"a calibration prompt of {longest} tokens plus {max_new_tokens} verify tokens exceeds "
                        f"the model's {positions} positions")
    count = getattr(progress, "counter", lambda label: None)  # specc.cli.progress: bars per prompt
    choice = None
    stock_runs: dict[int, list] = {}  # stock's runs by drafts per step, reused for token forcing
    if passes is None:
        from specc.search.choose import choose_pipeline

        measure = _stock_acceptance(pair, dep, memory, prompts, max_new_tokens, dtype, device, say, count, stock_runs)
        choice = choose_pipeline(pair, dep, memory, num_draft=num_draft, measure=measure,
                                 drafter_pipeline=drafter_passes)
        pipeline = choice.pipeline
        if method_impl.uses_drafter and not num_draft:
            k = choice.num_draft
    else:
        pipeline = passes
    own = None if drafter_passes is None else {"drafter": drafter_passes}
    say(f"tracing and running passes: {pipeline or '(none)'}"
        + ("" if own is None else f"; drafter: {drafter_passes or '(none)'}"))
    snapshots = pair.target.kind == "hybrid"  # GDN states keep one entry per verify-block node
    if snapshots:
        _reserve_block(target, k + 1)
    built = build_steps(target, draft_module, pipeline, spec, linear_choice=choice_table, role_pipelines=own)
    tree_section = _choose_tree(tree, pair, dep, pipeline, k, prompts, max_new_tokens, dtype, device, say,
                                (built.irs["target"], built.irs.get("drafter")))
    budget = tree_section["budget"] if tree_section else 0
    if snapshots and budget > k:  # the tree verify block is larger: every step keeps its entries
        _reserve_block(target, budget + 1)
        built = build_steps(target, draft_module, pipeline, spec, linear_choice=choice_table, role_pipelines=own)
    if budget:
        say(f"tracing the tree verify step ({budget} nodes)")
        add_target_step(built, target, pipeline, "target_tree", choice_table)
    if wants_ragged_step(target, k):
        say("tracing the ragged verify step")
        add_target_step(built, target, pipeline, "target_ragged", choice_table)
    pass_records, lowering, steps = built.pass_records, built.lowering, built.emitted
    # the ragged step at the same work: B rows of k + 1 tokens packed
    values = {"B": dep.batch_size, "Q": k + 1, "C": 1024, "N": 1, "T": dep.batch_size * (k + 1),
              "R": dep.batch_size}
    costs = {role: _step_costs(ir, values) for role, ir in built.irs.items()}

    manifest = {
        "specc_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": pair.method, "num_draft": k,
        "model": {"name": pair.target.name, "content_hash": content_hash(pair.target.path),
                  "architecture": pair.target.raw.get("model_type"), "vocab_size": pair.target.raw.get("vocab_size"),
                  "max_position_embeddings": pair.target.raw.get("max_position_embeddings"),
                  "eos_token_ids": list(pair.eos_token_ids)},
        "drafter": None if pair.drafter is None else {
            "name": pair.drafter.name, "kind": pair.drafter.kind, "content_hash": content_hash(pair.drafter.path),
            "strategy": method_impl.strategy, **method_impl.manifest_drafter(pair, loaded)},
        "deployment": dep.to_json(), "passes": {
            "pipeline": pipeline, "applied": pass_records,
            "drafter_pipeline": None if draft_module is None else (pipeline if own is None else drafter_passes)},
        "lowering": lowering, "step_costs_at": {"B": dep.batch_size, "Q": k + 1, "C": 1024}, "step_costs": costs,
        "tolerances": {"tie_margin": tolerance, "dtype": dep.dtype},
        "plugins": _plugins(pipeline, drafter_passes),
        "tree": tree_section,
        "linear_choice": None if choice_table is None else {
            "source": choice_table.source, "margin": choice_table.margin, "summary": choice_table.summary()},
        "prediction": None if choice is None else {
            key: choice.prediction.get(key) for key in ("tokens_per_s", "speedup", "step_s", "ar_step_s",
                                                         "expected_tokens_per_step", "acceptance_source", "source",
                                                         "choice_acceptance")},
    }
    say("emitting the compiled module")
    tmp = stage_artifact(out, steps, manifest, pair.target.path if tokenizer is not None else None)
    ragged_summary = None
    try:
        say(f"token forcing against stock on {len(prompts)} prompts x {max_new_tokens} tokens")
        engine = load(tmp, device, max_len=max(len(p) for p in prompts) + max_new_tokens + 1, warmup=False)
        runs = stock_runs.get(k) or run_stock_reference(pair, prompts, max_new_tokens, k or None, dtype, device,
                                                        progress=count("stock"))
        report = verify_system(engine, runs, tolerance, pair.eos_token_ids, progress=count("compiled, forced"))
        manifest = dict(engine.manifest, verification=report.to_json())
        if not report.passed:
            raise VerificationFailed(report.summary())
        acc = None
        if "target_ragged" in engine.steps:  # the packed verify step, forced on its own (rows of 0..k+1)
            say("token forcing through the ragged verify step")
            ragged = force_ragged(engine.steps["target"], engine.steps["target_ragged"], runs, tolerance, k + 1)
            manifest["verification"]["ragged"] = ragged.to_json()
            if not ragged.passed:
                raise VerificationFailed("ragged verify step: " + ragged.summary())
            ragged_summary = "ragged verify step: " + ragged.summary()
        if k and any(r.accepted_lengths for r in runs):
            from specc.search.acceptance import AcceptanceModel

            acc = AcceptanceModel.from_accepted_lengths([r.accepted_lengths for r in runs], k,
                                                        source=f"measured by stock on {len(runs)} calibration prompts")
            _remember_acceptance(pair, dep, memory, k, acc)
        if choice is not None and k and any(r.accepted_lengths for r in runs):
            # Stock's own steps on the calibration prompts measure acceptance: predict again with it.
            from specc.search.choose import choose_pipeline

            measured = choose_pipeline(pair, dep, memory, num_draft=k, acceptance=acc,
                                       drafter_pipeline=drafter_passes).prediction
            measured["acceptance_source"] = acc.source or "measured"
            measured["choice_acceptance"] = choice.prediction["choice_acceptance"]  # what chose k and the pipeline
            manifest["prediction"] = {key: measured.get(key) for key in manifest["prediction"]}
        if k and dep.batch_size > 1:
            say("pricing two-level verification and per-request k")
        manifest["batching"] = _choose_batching(pair, dep, (built.irs["target"], built.irs.get("drafter")), k, acc,
                                                two_level, target, budget)
        write_manifest(tmp, manifest)
        publish(tmp, out)
        digest = manifest_hash(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"compiled {pair.target.name}" + (f" + {pair.drafter.name}" if pair.drafter else "") + f" ({pair.method}"
        + (f", k={k}" if k else "") + f") for {dep.name} -> {out}",
        "passes: " + "; ".join(f"{role}: " + (", ".join(f"{r['name']}{'' if r['changed'] else ' (no change)'}"
                                                           for r in recs) or "none") for role, recs in pass_records.items()),
        "lowering: " + "; ".join(f"{role}: {sum(v['lowered'].values())} kernel calls"
                                 + (f", {sum(v['eager'].values())} eager" if v["eager"] else "")
                                 + (f", {_cublas_nodes(v)} linears with cuBLAS row ranges" if _cublas_nodes(v) else "")
                                 for role, v in lowering.items()),
        "bytes per step at B={B}, Q={Q}, C={C}: ".format(**manifest["step_costs_at"]) + "; ".join(
            f"{role} {c['bytes_read'] / 1e6:.2f} MB read ({c['weight_bytes'] / 1e6:.2f} MB weights)" for role, c in costs.items()),
        report.summary(),
        *([ragged_summary] if ragged_summary else []),
        f"manifest sha256 {digest} (pin it: specc run {out} --expect-hash {digest})",
    ]
    if tree_section:
        lines.insert(3, f"tree: {tree_section['budget']} nodes, depth {tree_section['depth']}" if budget else
                     "tree: off (the chain is predicted at least as fast)" if tree_section.get("candidates") else "tree: off")
    batching = manifest["batching"]
    lines.insert(3, "batching: " + ("two-level verification, k1 = {}".format(batching["two_level_k1"])
                                    if batching["two_level_k1"] else "per-request k" if batching["per_request_k"]
                                    else "goodput k per step" if batching.get("goodput_k") else "one level")
                 + f" ({batching['source']})")
    if choice is not None:
        p = manifest["prediction"]
        lines.insert(3, f"predicted on {dep.name}: {p['tokens_per_s']:,.1f} tok/s, {p['speedup']:.2f}x over AR "
                        f"(step {p['step_s'] * 1e3:.3f} ms, {p['expected_tokens_per_step']:.2f} tokens/step, "
                        f"acceptance {p['acceptance_source']}; chosen with acceptance {p['choice_acceptance']}; "
                        f"`specc cost` shows the gap report"
                        + ("" if dep.calibrated else "; an uncalibrated deployment's leads, often far from this "
                           "machine: `specc calibrate` measures it") + ")")
        if pair.drafter is not None and k and round(p["speedup"], 2) < 1:  # as the line above shows it
            lines.insert(4, f"predicted slower than AR ({p['speedup']:.2f}x): `specc compile` without --drafter "
                            "builds the AR artifact")
    return CompileResult(out, manifest, lines, digest)
