"""What every rank runs: :class:`TPJob` (token forcing and timing of the sharded target) and
:class:`TPSpecJob` (speculative decoding with it), and what rank 0 reports back."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Any

import torch

from specc.parallel.loading import _source_config, build_model, load_tp_target, parse_dtype
from specc.parallel.steps import (
    DEFAULT_PASSES, _sync, compile_step, forced_logits, time_steps, time_steps_graphed, trace_target, weight_summary,
)


@dataclasses.dataclass
class TPJob:
    """One model to run on every rank.

    source:  checkpoint path (or zoo name / hub id) or {"config": dict, "seed": int}.
    prompt / tokens: token forcing input (tokens from the 1-rank run); empty tokens skips forcing.
    timing:  None, or {"qs": [1, 4], "context": 1024, "repeats": 20, "warmup": 3} for step times,
             plus an all_reduce micro-benchmark at the hidden size for each Q.
    load:    "sharded" (default): :func:`load_tp_target`, the rank never holds the full model
             (meta model -> shard -> materialise its slices -> fusions); "full": build the whole
             model on the rank, trace, fuse, then shard (the pass order of a single-device compile).
    compiled: False (default): the rank runs its traced IR (torch ops); True: specc's generated
             step of its shard (:func:`compile_step`, Triton kernels on the GPU; ``passes``
             should then be :data:`COMPILED_PASSES`), timed as CUDA graphs on the GPU.
    """

    source: Any
    prompt: list[int]
    tokens: list[int]
    block: int = 4
    dtype: str = "float32"
    passes: tuple[str, ...] = DEFAULT_PASSES
    max_len: int = 0
    timing: dict | None = None
    check: bool = True
    name: str = ""
    load: str = "sharded"
    compiled: bool = False

    def cache_len(self) -> int:
        need = len(self.prompt) + len(self.tokens) + self.block + 1
        if self.timing:
            need = max(need, int(self.timing.get("context", 0)) + max(self.timing.get("qs", [1])) + 1)
        return max(self.max_len, need)


@dataclasses.dataclass
class TPResult:
    """What rank 0 reports for one job."""

    name: str
    world_size: int
    backend: str
    device: str
    argmax: list[list[int]]  # per rank
    logits: torch.Tensor | None  # rank 0's [n, V] fp32
    rank_logit_diff: list[float]  # per rank: max |its logits - rank 0's|
    weights: list[dict[str, int]]  # per rank, weight_summary
    pass_stats: dict[str, Any]
    step_times: list[dict] | None = None  # per rank
    all_reduce_times: list[dict] | None = None  # per rank
    seconds: float = 0.0
    load: str = "sharded"
    step: str = ""  # the class each rank ran: the traced IR's GraphModule (e.g. "VerifyStep") or "TargetStep" (generated)


@dataclasses.dataclass
class TPSpecJob:
    """Speculative decoding on every rank: the target sharded over the ranks, the drafter
    replicated (every rank drafts the same tokens from the same weights and, since every rank
    computes the same full logits, accepts the same tokens: no communication beyond the
    target's all-reduces).

    target / drafter: sources as for :class:`TPJob` (the drafter a causal LM: ``method``
    "ar-draft", or "pard" with ``pard_token`` in its config; or a DFlash checkpoint, "dflash": it
    reads the target's hidden states, whole on every rank after the all-reduces, and the
    target's replicated embedding and LM head); each rank builds both, compiles
    them with ``pipeline`` (default: the compiler's) and ``tp=(world, rank)`` for the target,
    and runs the device loop (:func:`specc.runtime.engine.build_loop`) from ``prompt`` for
    ``max_new_tokens`` greedy tokens."""

    target: Any
    drafter: Any
    prompt: list[int]
    max_new_tokens: int = 16
    method: str = "ar-draft"
    num_draft: int = 3
    dtype: str = "float32"
    pipeline: str = ""
    name: str = ""


@dataclasses.dataclass
class TPSpecResult:
    """What rank 0 reports for one :class:`TPSpecJob`: every rank's tokens and loop statistics."""

    name: str
    world_size: int
    tokens: list[list[int]]  # per rank
    tau: list[float]  # per rank
    steps: list[int]  # per rank
    target_all_reduce: int  # all_reduce nodes in this rank's target step
    seconds: float = 0.0
    tokens_per_s: list[float] | None = None  # per rank, a timed generation after a warm-up one


def _run_spec_job(job: TPSpecJob, rank: int, world: int, device: torch.device, backend: str) -> TPSpecResult | None:
    import torch.distributed as dist

    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop

    from specc.methods import get_method
    from specc.models.registry import load_model

    impl = get_method(job.method)
    if not impl.uses_drafter:
        raise ValueError(f"TPSpecJob.method must speculate with a drafter, got {job.method!r}")
    start = time.perf_counter()
    target = build_model(job.target, job.dtype, device)
    if isinstance(job.drafter, dict):  # random weights in a real shape: a causal drafter
        draft = build_model(job.drafter, job.dtype, device)
        section = {"pard_token": job.drafter["config"].get("pard_token")}
    else:
        loaded_draft = load_model(str(job.drafter), dtype=parse_dtype(job.dtype), device=device, with_tokenizer=False)
        draft, section = loaded_draft.model, {"pard_token": loaded_draft.raw_config.get("pard_token")}
    try:  # the method wires the pair (DFlash: the target's embedding and LM head, captured layers)
        loaded = impl.bind(target, draft)
    except (AttributeError, TypeError) as exc:
        raise ValueError(f"method {job.method} cannot use drafter {job.drafter!r}: {exc}") from exc
    target, drafter, spec = loaded.target, loaded.draft, loaded.draft_spec
    if spec is not None:
        section["dflash"] = {"block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
                             "target_layer_ids": list(spec.target_layer_ids)}
    target.setup_caches(1, 16)  # tracing needs caches; the loop allocates its own
    drafter.setup_caches(1, 16)
    built = build_steps(target, drafter, job.pipeline or DEFAULT_PIPELINE, spec, tp=(world, rank))
    del target
    steps = {"target": instantiate(built.emitted["target"]), "drafter": instantiate(built.emitted["drafter"], spec)}
    max_len = len(job.prompt) + job.max_new_tokens + 2 * job.num_draft + 2
    loop = build_loop(steps, impl.strategy, job.num_draft, max_len, drafter_section=section)
    prompt = torch.tensor([job.prompt], device=device)
    result = loop.generate(prompt, job.max_new_tokens, ())  # also captures the CUDA graphs
    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    again = loop.generate(prompt, job.max_new_tokens, ())
    _sync(device)
    elapsed = time.perf_counter() - t0
    if again.tokens != result.tokens:
        raise RuntimeError(f"rank {rank}: a second generation from the same prompt gave other tokens")
    mine = {"tokens": list(result.tokens), "tau": float(result.stats.tau), "steps": int(result.stats.steps),
            "tokens_per_s": len(again.tokens) / elapsed if elapsed > 0 else 0.0}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    reduces = built.irs["target"].count("all_reduce")
    del loop, steps, built, drafter
    gc.collect()
    if rank != 0:
        return None
    return TPSpecResult(name=job.name or "speculative", world_size=world, tokens=[g["tokens"] for g in gathered],
                        tau=[g["tau"] for g in gathered], steps=[g["steps"] for g in gathered],
                        target_all_reduce=reduces, seconds=time.perf_counter() - start,
                        tokens_per_s=[g["tokens_per_s"] for g in gathered])


def _run_job(job: TPJob, rank: int, world: int, device: torch.device, backend: str) -> TPResult | None:
    import torch.distributed as dist

    from specc.models import model_config_from_hf

    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cfg = model_config_from_hf(_source_config(job.source))
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    if job.load == "sharded":
        ir, pass_stats = load_tp_target(job.source, world, rank, dtype=job.dtype, device=device,
                                        max_len=job.cache_len(), passes=job.passes, check=job.check)
    elif job.load == "full":
        model = build_model(job.source, job.dtype, device)
        model.setup_caches(1, job.cache_len())
        ir, report = trace_target(model, job.passes, world_size=world, rank=rank, check=job.check)
        pass_stats = report.stats("shard_tensor_parallel")
        del model  # the IR holds this rank's shards and the replicated tensors only
    else:
        raise ValueError(f"unknown load mode {job.load!r} (sharded | full)")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    ir.reset_caches()
    fn = compile_step(ir, job.cache_len()) if job.compiled else ir
    timer = time_steps_graphed if job.compiled else time_steps
    step_kind = type(fn).__name__ if job.compiled else type(ir.gm).__name__
    if job.tokens:
        logits = forced_logits(fn, job.prompt, job.tokens, job.block, device)
        argmax = logits.argmax(-1)
    else:
        logits, argmax = None, torch.zeros(0, dtype=torch.long)
    gathered = [None] * world
    summary = weight_summary(ir)
    summary["peak_device_bytes"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    dist.all_gather_object(gathered, {"argmax": argmax.tolist(), "weights": summary, "logits": logits})
    step_times = reduce_times = None
    if job.timing:
        t = job.timing
        qs, ctx_len = list(t.get("qs", [1, job.block])), int(t.get("context", 0))
        mine = timer(fn, qs=qs, context=ctx_len, repeats=int(t.get("repeats", 20)),
                     warmup=int(t.get("warmup", 3)), device=device, vocab=vocab, distributed=True)
        ar = {}
        for q in qs:
            x = torch.randn(1, q, hidden, device=device).to(parse_dtype(job.dtype))
            times = []
            for r in range(int(t.get("warmup", 3)) + int(t.get("repeats", 20))):
                dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                dist.all_reduce(x)
                _sync(device)
                if r >= int(t.get("warmup", 3)):
                    times.append(time.perf_counter() - t0)
            ar[int(q)] = {"median_s": statistics.median(times), "bytes": x.numel() * x.element_size()}
        both = [None] * world
        dist.all_gather_object(both, {"steps": mine, "all_reduce": ar})
        step_times = [b["steps"] for b in both]
        reduce_times = [b["all_reduce"] for b in both]
    del ir, fn
    gc.collect()
    if rank != 0:
        return None
    return TPResult(name=job.name or str(job.source if not isinstance(job.source, dict) else "random"), load=job.load,
                    world_size=world, backend=backend, device=str(device),
                    argmax=[g["argmax"] for g in gathered], logits=logits,
                    rank_logit_diff=[float((g["logits"] - logits).abs().max()) if logits is not None and len(logits)
                                     else 0.0 for g in gathered],
                    weights=[g["weights"] for g in gathered], pass_stats=pass_stats,
                    step_times=step_times, all_reduce_times=reduce_times, seconds=time.perf_counter() - start,
                    step=step_kind)
