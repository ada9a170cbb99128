"""The one build path: trace -> passes -> lower -> emit.

``specc compile`` (:func:`build_steps`), the search (:func:`build_step` per role and candidate)
and tensor-parallel ranks (:func:`trace_step` + :func:`run_passes`, :func:`emit_ir`) all build
steps here; what they add around it (publishing, caching, sharded loading) stays with them.

    built = build_steps(target, drafter, DEFAULT_PIPELINE, spec)
    built.irs["target"], built.pass_records["target"], built.lowering["target"], built.emitted["target"]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from specc.codegen.emit import emit_step
from specc.codegen.lower import lower
from specc.errors import UserError
from specc.ir.trace import trace
from specc.passes.manager import PassManager, PipelineReport
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.passes.base import PassError
from specc.passes.registry import PipelineError

# the traced step of each role; "target_tree": the target's tree verify step (tree artifacts);
# "target_ragged": the target's packed verify of rows with their own draft counts (ragged verify)
ROLE_STEP = {"target": "verify", "drafter": "draft", "target_tree": "tree_verify", "target_ragged": "ragged_verify"}
ROLE_CLASS = {"target": "TargetStep", "drafter": "DraftStep", "target_tree": "TreeTargetStep",
              "target_ragged": "RaggedTargetStep"}  # emitted classes
# class attributes of a role's emitted class: a step takes the ragged row descriptor iff
# ``getattr(step, "ragged_rows", False)`` (as the model definition CausalLM says of itself)
ROLE_ATTRS = {"target_ragged": {"ragged_rows": True}}


@dataclasses.dataclass
class BuiltSteps:
    irs: dict
    emitted: dict
    pass_records: dict
    lowering: dict


@dataclasses.dataclass
class BuiltStep:
    """One role's step: the IR after the passes, the pass report, the lowering summary
    ({"lowered": {kind: n}, "eager": {kind: n}}) and the emitted source + tensors."""

    ir: Any
    report: PipelineReport | None
    lowering: dict
    emitted: Any


def share_equal_weights(step, base) -> int:
    """Point ``step``'s weights at ``base``'s tensors where they have the same name and equal
    contents (EmittedSteps of one target: each build concatenates its fused weights anew, and
    the artifact stores a tensor once per storage). Returns how many were shared."""
    import torch

    shared = 0
    for name, tensor in step.weights.items():
        other = base.weights.get(name)
        if other is None or other is tensor or other.shape != tensor.shape or other.dtype != tensor.dtype \
                or other.device != tensor.device or tensor.device.type == "meta":
            continue
        if torch.equal(other, tensor):
            step.weights[name] = other
            shared += 1
    return shared


def trace_step(module, role: str = "target"):
    """The IR of ``role``'s step of ``module`` (target: verify, which also serves prefill and AR;
    drafter: draft). Caches must be set up on the module first."""
    return trace(module, ROLE_STEP[role])


def run_passes(ir, pipeline: str | Iterable[str], *, options: dict | None = None, check: bool = True,
               lint: bool = False) -> PipelineReport | None:
    """Run ``pipeline`` on ``ir`` in place (None when it is empty); ``check``: the pass manager
    lints and checks each pass's postconditions; ``lint``: lint the result once at the end."""
    report = PassManager(pipeline, check=check, options=options or {}).run(ir) if pipeline else None
    if lint:
        ir.lint()
    return report


def emit_ir(ir, role: str = "target", cache_extra_len: int = 0, linear_choice=None):
    """Lower ``ir`` to the kernel ABI and emit it: (EmittedStep, lowering summary).
    ``linear_choice``: a measured ``LinearChoice`` (cuBLAS where it was faster; the summary's
    ``linear_impl`` records it), None for the Triton linears everywhere."""
    gm, low = lower(ir.gm, linear_choice)
    emitted = emit_step(gm, ROLE_CLASS[role], cache_extra_len=cache_extra_len, class_attrs=ROLE_ATTRS.get(role))
    summary = {"lowered": low.lowered, "eager": low.eager}
    if low.linear_impl is not None:
        summary["linear_impl"] = low.linear_impl
    return emitted, summary


def build_step(module, role: str, pipeline: str | Iterable[str], *, options: dict | None = None, check: bool = True,
               lint: bool = False, cache_extra_len: int = 0, linear_choice=None) -> BuiltStep:
    """trace -> passes -> lower -> emit for one role."""
    ir = trace_step(module, role)
    report = run_passes(ir, pipeline, options=options, check=check, lint=lint)
    emitted, lowering = emit_ir(ir, role, cache_extra_len, linear_choice)
    return BuiltStep(ir, report, lowering, emitted)


def build_steps(target, draft_module=None, pipeline: str = DEFAULT_PIPELINE, spec=None,
                tp: tuple[int, int] | None = None, tree: bool = False, linear_choice=None,
                pass_options: dict | None = None, role_pipelines: dict | None = None) -> BuiltSteps:
    """Trace the target's verify step (it also serves prefill and AR: same graph, other Q) and
    the drafter's draft step, run the pass pipeline on each, lower and emit them.

    ``tp=(world_size, rank)``: the target's step is this rank's shard (``shard_tensor_parallel``
    joins its pipeline; the pass manager orders it before the fusions that need its result);
    the drafter stays whole (replicated on every rank).

    ``tree``: also the target's tree verify step (role ``target_tree``: the same weights and
    state, plus the tree mask input), for tree verification.

    ``linear_choice``: a measured ``codegen.linear_choice.LinearChoice`` for every role's linears.

    ``pass_options``: options every role's passes read (``{"pack_version": 2}``).

    ``role_pipelines``: a role's own pipeline instead of ``pipeline`` (``{"drafter": "..."}``:
    e.g. 12-bit weights for the target only, which ``specc bench --drafter-passes`` times)."""
    modules = {"target": target}
    if draft_module is not None:
        modules["drafter"] = draft_module
    if tree:
        modules["target_tree"] = target
    irs, records, lowering, emitted = {}, {}, {}, {}
    for role, module in modules.items():
        role_pipeline, options = (role_pipelines or {}).get(role, pipeline), dict(pass_options or {})
        if tp is not None and role in ("target", "target_tree") and tp[0] > 1:
            role_pipeline = ",".join(p for p in (role_pipeline, "shard_tensor_parallel") if p)
            options.update(tp_world_size=int(tp[0]), tp_rank=int(tp[1]))
        extra = spec.block_size if role == "drafter" and spec is not None else 0
        ir = trace_step(module, role)
        irs[role] = ir
        try:
            report = run_passes(ir, role_pipeline, options=options, check=True)
        except (PipelineError, PassError) as exc:
            raise UserError(str(exc).splitlines()[0]) from exc
        records[role] = [] if report is None else [
            {"name": r.name, "changed": r.changed, "stats": r.stats} for r in report.records]
        emitted[role], lowering[role] = emit_ir(ir, role, extra, linear_choice)
    return BuiltSteps(irs, emitted, records, lowering)


def wants_ragged_step(target, k: int) -> bool:
    """Whether a speculative build gets a ragged verify step (role ``target_ragged``): the
    method drafts chains (k > 0) and the target is a dense CausalLM (hybrid targets have no
    ragged forward). Two-level verification and per-request draft lengths need it."""
    from specc.models.decoder import CausalLM

    return bool(k) and isinstance(target, CausalLM)


def add_target_step(built: BuiltSteps, target, pipeline, role: str, linear_choice=None) -> None:
    """Build another step of the target (role ``target_tree``: tree verify; ``target_ragged``:
    the packed verify of rows with their own draft counts) into ``built``. Weights equal to the
    target step's (the fused q/k/v and gate/up concatenations each build makes again) are the
    target's tensors, so an artifact stores them once and a process holds them once."""
    target.setup_caches(1, 16)
    try:
        step = build_step(target, role, pipeline, linear_choice=linear_choice)
    except (PipelineError, PassError) as exc:
        raise UserError(str(exc).splitlines()[0]) from exc
    share_equal_weights(step.emitted, built.emitted["target"])
    built.irs[role], built.emitted[role] = step.ir, step.emitted
    built.lowering[role] = step.lowering
    built.pass_records[role] = [] if step.report is None else [
        {"name": r.name, "changed": r.changed, "stats": r.stats} for r in step.report.records]
