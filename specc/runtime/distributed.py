"""Tensor-parallel targets over torch.distributed: a launcher and a token-forcing check.

A target too large for one GPU runs on ``w`` ranks (one GPU each), every rank executing the
IR of its own shard (``specc.passes.shard_tensor_parallel``: column-parallel q/k/v and gate/up,
row-parallel o/down followed by ``all_reduce``, local KV heads, replicated embedding, norms and
lm_head). The drafter is not sharded: it stays replicated (every rank drafts the same tokens) or
runs on one rank.

    from specc.runtime.distributed import tp_forward_check
    check = tp_forward_check("path/to/checkpoint", world_size=2)   # starts 2 ranks (gloo on CPU)
    assert check.ok, check.summary()

What ``tp_forward_check`` does:

1. the **1-rank reference** (this process): load the model, greedy-decode ``num_tokens`` tokens
   after the prompt with the model's own forward, then token-force them (prefill on the prompt,
   verify blocks of ``block`` tokens through the KV cache) and keep the logits at every position;
2. **start** ``w`` ranks (``torch.multiprocessing``: fork on CPU, spawn on CUDA; gloo on CPU,
   NCCL on CUDA with ``NCCL_NVLS_ENABLE=0`` set before the process group is created; rank r uses
   ``cuda:r``). Each rank gets its shard of the verify step: by default (``load="sharded"``,
   :func:`load_tp_target`) it traces the model on the meta device, shards it with
   ``shard_tensor_parallel``, reads only its slices of the weights (safetensors ``get_slice``) and
   then runs the fusions (``fuse_qkv, fuse_gate_up, fuse_norm_linear, dce``); with
   ``load="full"`` it builds the whole model, fuses, shards and drops the model. It token-forces
   the same tokens the same way (prefill + verify steps of the sharded IR); the argmaxes of
   every rank and rank 0's logits go back to the parent;
3. compare: argmax identical at every position on every rank, logits allclose.

``run_tp`` is the general launcher (several jobs per start, optional step timing) that
``examples/bench_tp.py`` uses on GPUs. A job's model is a checkpoint path or
``{"config": <config.json dict>, "seed": s}`` for random weights in real shapes
(:func:`build_model`; identical on every rank of one device type).
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import math
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from specc.compiler import DEFAULT_PIPELINE

DEFAULT_PASSES = ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce")
# the single-device compiler's default pipeline (specc.compiler.DEFAULT_PIPELINE): what a rank
# runs before code generation with ``TPJob(compiled=True)``; the pass manager puts
# shard_tensor_parallel before fuse_rope_attention / fuse_residual_add, which must see its result
COMPILED_PASSES = tuple(DEFAULT_PIPELINE.split(","))
DEFAULT_PROMPT = (5, 17, 33, 2, 8, 9, 41)
# Environment every rank gets before the process group exists. NVLink SHARP (multicast) stays off
# on the lent H200 machines.
RANK_ENV = {"NCCL_NVLS_ENABLE": "0"}
MASTER_ADDR = "127.0.0.1"


# --------------------------------------------------------------------------- small helpers


def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port free on ``host`` right now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    from specc.ir import parse_dtype as _parse

    return _parse(name)


def default_backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed(rank: int, world_size: int, *, backend: str, port: int, addr: str = MASTER_ADDR,
                     timeout_s: float = 300.0) -> None:
    """Create the default process group (sets MASTER_ADDR/PORT and :data:`RANK_ENV` first)."""
    import torch.distributed as dist

    os.environ.update(RANK_ENV)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _random_param(name: str, index: int, shape, dtype: torch.dtype, device, seed: int, layers: int,
                  scaled_residual: bool = True) -> torch.Tensor:
    """Parameter ``index`` (in ``named_parameters`` order) of a randomly initialised model."""
    if len(shape) == 1:
        return torch.ones(shape, dtype=dtype, device=device)
    std = 1.0 if "embed" in name else 0.02
    if scaled_residual and ("o_proj" in name or "down_proj" in name):
        std = 0.02 / math.sqrt(2 * layers)
    gen = torch.Generator(device=device).manual_seed(seed * 100003 + index)
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=gen).to(dtype)


def _num_layers(names) -> int:
    return max(1, sum(1 for n in names if n.endswith("o_proj.weight")))


def random_init_(model: torch.nn.Module, seed: int, scaled_residual: bool = True) -> None:
    """Deterministic random weights: 1-D parameters 1.0, matrices N(0, 0.02) (o_proj/down_proj
    N(0, 0.02 / sqrt(2 L)) with ``scaled_residual``), embeddings N(0, 1). One generator per
    parameter, seeded from (seed, index), created on the parameter's device: every rank of one
    device type gets the same tensors as the reference (or slices of them, load_tp_target)."""
    named = list(model.named_parameters())
    layers = _num_layers(n for n, _ in named)
    with torch.no_grad():
        for i, (name, p) in enumerate(named):
            p.copy_(_random_param(name, i, tuple(p.shape), p.dtype, p.device, seed, layers, scaled_residual))


def build_model(source: Any, dtype: str | torch.dtype = "float32", device: Any = "cpu"):
    """A ``CausalLM`` from a checkpoint (path / zoo name / hub id) or from
    ``{"config": dict, "seed": int[, "scaled_residual": bool]}`` (random weights, real shapes,
    built on ``device`` directly: no host copy of a large model)."""
    from specc.models import CausalLM, load_model, model_config_from_hf

    dt = parse_dtype(dtype)
    device = torch.device(device)
    if isinstance(source, dict):
        cfg = model_config_from_hf(source["config"])
        if device.type == "cpu":
            model = CausalLM(cfg).to(dt)
        else:  # no host copy: allocate on the device (the meta detour costs a one-off import)
            with torch.device("meta"):
                model = CausalLM(cfg)
            model = model.to_empty(device=device).to(dt)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        random_init_(model, int(source.get("seed", 0)), bool(source.get("scaled_residual", True)))
        model.inv_freq = cfg.rope.inv_freq(cfg.head_dim).to(device)
        return model.eval()
    loaded = load_model(str(source), dtype=dt, device=device, with_tokenizer=False)
    if loaded.kind == "dflash":
        raise ValueError(f"{source}: a DFlash drafter is not a target")
    return loaded.model


def _source_config(source: Any) -> dict:
    if isinstance(source, dict):
        return source["config"]
    from specc.models.loading import load_config, resolve_checkpoint

    return load_config(resolve_checkpoint(str(source)))


class _CheckpointSlices:
    """Reads whole tensors or [a, b) slices of them from a checkpoint's safetensors files
    without loading the rest (``safe_open(...).get_slice``)."""

    def __init__(self, source: Any):
        from safetensors import safe_open

        from specc.models.loading import resolve_checkpoint

        path = resolve_checkpoint(str(source))
        self._open = safe_open
        self.where: dict[str, Path] = {}
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as h:
                for key in h.keys():
                    self.where[key] = f
        if not self.where:
            raise FileNotFoundError(f"{path}: no *.safetensors weights")

    def key(self, name: str) -> str:
        for k in (f"model.{name}", name):
            if k in self.where:
                return k
        raise KeyError(f"{name}: not in the checkpoint")

    def read(self, name: str, spec: dict | None) -> torch.Tensor:
        key = self.key(name)
        with self._open(str(self.where[key]), framework="pt") as h:
            if spec is None:
                return h.get_tensor(key)
            sl = h.get_slice(key)
            parts = []
            for a, b in spec["ranges"]:
                parts.append(sl[a:b] if spec["dim"] == 0 else sl[:, a:b])
            return parts[0] if len(parts) == 1 else torch.cat(parts, spec["dim"])


def load_tp_target(source: Any, world_size: int, rank: int, *, dtype: str | torch.dtype = "float32", device: Any = "cpu",
                   max_len: int = 256, passes: Sequence[str] = DEFAULT_PASSES, check: bool = True):
    """This rank's verify step without ever holding the full model: build the model on the meta
    device, trace, shard (``shard_tensor_parallel``), then materialise only this rank's slices
    (from the checkpoint's safetensors with ``get_slice``, or for ``{"config", "seed"}`` sources
    by generating one full parameter at a time on ``device`` and keeping the slice), allocate
    local KV caches for 1 row of ``max_len``, and run ``passes`` (fusions) on the real tensors.
    Returns (ir, stats of shard_tensor_parallel)."""
    from specc.ir import trace
    from specc.models import CausalLM, model_config_from_hf
    from specc.passes import PassManager
    from specc.passes.shard_tensor_parallel import tp_spec

    dt, device = parse_dtype(dtype), torch.device(device)
    raw = _source_config(source)
    cfg = model_config_from_hf(raw)
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to(dt)
    model.setup_caches(1, max_len, dtype=dt, device="meta")
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    ir = trace(model, "verify")
    del model
    stats: dict[str, Any] = {}
    if world_size > 1:
        report = PassManager(["shard_tensor_parallel"], check=check,
                             options={"tp_world_size": world_size, "tp_rank": rank}).run(ir)
        stats = report.stats("shard_tensor_parallel")
    spec = tp_spec(ir) or {"params": {}, "caches": {}}
    reader = None if isinstance(source, dict) else _CheckpointSlices(source)
    layers = _num_layers(order)
    with torch.no_grad():
        for name, p in list(ir.gm.named_parameters()):
            s = spec["params"].get(name)
            if reader is not None:
                t = reader.read(name, s)
            else:
                full = _random_param(name, order[name], tuple(s["full_shape"]) if s else tuple(p.shape), dt, device,
                                     int(source.get("seed", 0)), layers, bool(source.get("scaled_residual", True)))
                t = full if s is None else torch.cat([full.narrow(s["dim"], a, b - a) for a, b in s["ranges"]],
                                                     s["dim"]).contiguous()
                del full
            if tuple(t.shape) != tuple(p.shape):
                raise RuntimeError(f"{name}: loaded {tuple(t.shape)}, the sharded graph needs {tuple(p.shape)}")
            _set_attr(ir.gm, name, torch.nn.Parameter(t.to(device=device, dtype=dt), requires_grad=False))
        for node in ir.graph.nodes:
            if node.op != "get_attr":
                continue
            obj = ir.get_tensor(node)
            if isinstance(obj, torch.nn.Parameter) or not isinstance(obj, torch.Tensor) or obj.device.type != "meta":
                continue
            if node.target == "inv_freq":
                _set_attr(ir.gm, node.target, cfg.rope.inv_freq(cfg.head_dim).to(device))
            else:  # a KV cache
                _set_attr(ir.gm, node.target, torch.zeros(obj.shape, dtype=obj.dtype, device=device))
    left = [n for n, t in list(ir.gm.named_parameters()) + list(ir.gm.named_buffers()) if t.device.type == "meta"]
    if left:
        raise RuntimeError(f"tensors left on the meta device: {left[:3]}")
    ir.refresh()
    if passes:
        PassManager(list(passes), check=check).run(ir)
    return ir, stats


def _set_attr(module: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if isinstance(value, torch.nn.Parameter):
        owner._parameters[leaf] = value
    else:
        owner._buffers[leaf] = value


def _step(fn, ids: Sequence[int], start: int, device) -> torch.Tensor:
    t = torch.tensor([list(ids)], device=device)
    out = fn(t, torch.arange(start, start + len(ids), device=device)[None], torch.tensor([start], device=device))
    return out[0] if isinstance(out, tuple) else out


@torch.inference_mode()
def greedy_tokens(fn, prompt: Sequence[int], num_tokens: int, device="cpu") -> list[int]:
    """Plain greedy decoding with a step function (model or IR): prefill, then one token a step."""
    logits = _step(fn, prompt, 0, device)
    tokens = [int(logits[0, -1].argmax())]
    pos = len(prompt)
    while len(tokens) < num_tokens:
        logits = _step(fn, tokens[-1:], pos, device)
        tokens.append(int(logits[0, -1].argmax()))
        pos += 1
    return tokens


@torch.inference_mode()
def forced_logits(fn, prompt: Sequence[int], tokens: Sequence[int], block: int = 4, device="cpu") -> torch.Tensor:
    """Token forcing: logits [len(tokens), V] (fp32, CPU) predicting each of ``tokens`` when the
    step function is fed the prompt (prefill, one step) and then the tokens in verify blocks of
    ``block`` through the KV cache (the same schedule as EagerSpeculativeDecoder.forced_argmax)."""
    tokens = list(tokens)
    out = [_step(fn, prompt, 0, device)[0, -1:].float().cpu()]
    pos = len(prompt)
    for start in range(0, len(tokens) - 1, block):
        chunk = tokens[start:start + block][: len(tokens) - 1 - start]
        out.append(_step(fn, chunk, pos, device)[0].float().cpu())
        pos += len(chunk)
    return torch.cat(out)[: len(tokens)]


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_steps(fn, *, qs: Sequence[int], context: int, repeats: int = 20, warmup: int = 3, device="cpu",
               vocab: int = 2, distributed: bool = False) -> dict[int, dict[str, float]]:
    """Median wall time (s) of one step at Q new tokens after ``context`` cached positions, for
    each Q in ``qs``. With ``distributed`` every repetition starts after a barrier (all ranks run
    the step together; the collectives inside would wait otherwise)."""
    import torch.distributed as dist

    out = {}
    for q in qs:
        ids = [(7 * i + 3) % max(vocab, 2) for i in range(q)]
        times = []
        for r in range(warmup + repeats):
            if distributed:
                dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            _step(fn, ids, context, device)
            _sync(device)
            if r >= warmup:
                times.append(time.perf_counter() - t0)
        out[int(q)] = {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats}
    return out


def compile_step(ir, max_len: int):
    """specc's generated step for an IR (lowered to the kernel ABI, emitted as Python source,
    bound to the IR's tensors): the same code ``specc compile`` writes, in memory. A sharded IR
    keeps its ``all_reduce`` nodes as calls into torch.distributed."""
    from specc.codegen.emit import emit_step
    from specc.codegen.lower import lower
    from specc.runtime.compiled import instantiate

    gm, _ = lower(ir.gm)
    step = instantiate(emit_step(gm, "TargetStep"))
    step.setup_caches(1, max_len)
    return step


@torch.inference_mode()
def time_steps_graphed(fn, *, qs: Sequence[int], context: int, repeats: int = 20, warmup: int = 3, device="cuda",
                       vocab: int = 2, distributed: bool = False) -> dict[int, dict[str, float]]:
    """:func:`time_steps` with each step captured in a CUDA graph and timed by CUDA events (the
    time a served step takes, without Python launch overhead). With ``distributed`` all ranks
    capture together and every replay starts after a barrier; NCCL collectives are captured in
    the graph. On the CPU this is :func:`time_steps`."""
    import torch.distributed as dist

    if torch.device(device).type != "cuda":
        return time_steps(fn, qs=qs, context=context, repeats=repeats, warmup=warmup, device=device, vocab=vocab,
                          distributed=distributed)
    out = {}
    for q in qs:
        ids = torch.tensor([[(7 * i + 3) % max(vocab, 2) for i in range(q)]], device=device)
        args = (ids, torch.arange(context, context + q, device=device)[None], torch.tensor([context], device=device))
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(max(warmup, 1)):
                fn(*args)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if distributed:
            dist.barrier()
        with torch.cuda.graph(graph):
            fn(*args)
        times = []
        for r in range(warmup + repeats):
            if distributed:
                dist.barrier()
            _sync(device)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            if r >= warmup:
                times.append(a.elapsed_time(b) / 1e3)
        del graph
        out[int(q)] = {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats,
                       "cuda_graph": True}
    return out


def trace_target(model, passes: Sequence[str] = DEFAULT_PASSES, *, world_size: int = 1, rank: int = 0,
                 check: bool = True):
    """Trace ``model``'s verify step and run ``passes`` (+ ``shard_tensor_parallel`` when
    ``world_size`` > 1). Returns (ir, report). Caches must be set up on the model first."""
    from specc.ir import trace
    from specc.passes import PassManager

    ir = trace(model, "verify")
    pipeline = list(passes) + (["shard_tensor_parallel"] if world_size > 1 else [])
    report = PassManager(pipeline, check=check, options={"tp_world_size": world_size, "tp_rank": rank}).run(ir)
    return ir, report


def weight_summary(ir) -> dict[str, Any]:
    """What one rank holds and reads: bytes of the GraphModule's parameters; the bytes of the
    weight matrices of the decoder layers' linears (``linear``, ``norm_linear``, ...: the sharded
    ones; a fused norm's vector is not counted); the weight bytes one step reads by the metadata
    (at B = Q = 1); the all_reduce count; and the sum of the (replicated) embedding table, equal
    on every rank and the reference when they built the same weights."""
    import sympy

    from specc.ir import evaluate

    params = sum(p.numel() * p.element_size() for p in ir.gm.parameters())
    layer_linears = 0
    step = []
    for node in ir.graph.nodes:
        m = ir.meta(node)
        step.append(m.weight_bytes)
        if "linear" in m.kind and m.scope.startswith("layers."):
            for name in m.weights:
                t = ir.get_tensor(name)
                if t.dim() == 2:
                    layer_linears += t.numel() * t.element_size()
    emb = [ir.get_tensor(n.args[1]) for n in ir.calls("embedding")]
    fingerprint = float(emb[0].detach().double().sum()) if emb and emb[0].device.type != "meta" else None
    return {"parameter_bytes": int(params), "layer_linear_weight_bytes": int(layer_linears),
            "step_weight_bytes": int(evaluate(sympy.Add(*step), {"B": 1, "Q": 1, "C": 0, "N": 1})),
            "all_reduce": ir.count("all_reduce"), "embedding_fingerprint": fingerprint}


# --------------------------------------------------------------------------- jobs and the launcher


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

    from specc.compiler import DEFAULT_PIPELINE, build_steps
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop

    if job.method not in ("ar-draft", "pard", "dflash"):
        raise ValueError(f"TPSpecJob.method must be 'ar-draft', 'pard' or 'dflash', got {job.method!r}")
    start = time.perf_counter()
    target = build_model(job.target, job.dtype, device)
    spec, pard_token = None, None
    if job.method == "dflash":  # the drafter reads the target's (replicated) embedding and LM head
        from specc.models.dflash import DFlashDrafter
        from specc.models.registry import load_model

        if isinstance(job.drafter, dict):
            raise ValueError("a DFlash drafter must be a checkpoint (random DFlash sources are not built here)")
        draft = load_model(str(job.drafter), dtype=parse_dtype(job.dtype), device=device, with_tokenizer=False).model
        spec = draft.spec
        target.capture_layers = tuple(spec.target_layer_ids)
        drafter = DFlashDrafter(draft, target.embed_tokens, target.lm_head)
    else:
        drafter = build_model(job.drafter, job.dtype, device)
        if job.method == "pard":
            pard_token = drafter.config.raw.get("pard_token")
            if pard_token is None:
                raise ValueError("a PARD drafter needs pard_token in its config")
    target.setup_caches(1, 16)  # tracing needs caches; the loop allocates its own
    drafter.setup_caches(1, 16)
    built = build_steps(target, drafter, job.pipeline or DEFAULT_PIPELINE, spec, tp=(world, rank))
    del target
    steps = {"target": instantiate(built.emitted["target"]), "drafter": instantiate(built.emitted["drafter"], spec)}
    max_len = len(job.prompt) + job.max_new_tokens + 2 * job.num_draft + 2
    loop = build_loop(steps, job.method, job.num_draft, max_len, pard_token)
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


def _worker(rank: int, world: int, port: int, device_type: str, backend: str, jobs: list, result_path: str,
            threads: int) -> None:
    import torch.distributed as dist

    os.environ.update(RANK_ENV)  # before any NCCL communicator exists
    if threads > 0:
        torch.set_num_threads(threads)
    if device_type == "cuda":  # rank r on cuda:r (gloo may share GPUs: r mod the GPU count)
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    init_distributed(rank, world, backend=backend, port=port)
    try:
        results = [(_run_spec_job if isinstance(job, TPSpecJob) else _run_job)(job, rank, world, device, backend)
                   for job in jobs]
        if rank == 0:
            torch.save(results, result_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_tp(jobs: Sequence[TPJob | TPSpecJob], world_size: int = 2, *, device: str = "cpu", backend: str | None = None,
           port: int | None = None, threads: int | None = None, start_method: str | None = None) -> list:
    """Start ``world_size`` ranks that each run every job (:class:`TPJob`: token forcing and
    timing of the sharded target; :class:`TPSpecJob`: speculative decoding with it); returns
    rank 0's :class:`TPResult` / :class:`TPSpecResult` per job. CPU: gloo, ``threads`` intra-op threads per rank (default: the
    cores shared out). CUDA: NCCL, rank r on cuda:r, NCCL_NVLS_ENABLE=0.

    ``start_method``: "spawn" (a fresh interpreter per rank; required with CUDA) or "fork" (the
    ranks inherit this process's imports: seconds faster, the default for CPU on Linux)."""
    import torch.multiprocessing as mp

    device_type = torch.device(device).type
    if start_method is None:
        start_method = "fork" if device_type == "cpu" and "fork" in mp.get_all_start_methods() else "spawn"
    if start_method == "fork":
        if device_type == "cuda":
            raise ValueError("CUDA ranks must be spawned, not forked")
        import specc.ir  # noqa: F401  imported once here, inherited by the forked ranks
        import specc.models  # noqa: F401
        import specc.passes  # noqa: F401
    backend = backend or default_backend(device_type)
    if device_type == "cuda" and backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeError(f"{world_size} NCCL ranks need {world_size} GPUs, this machine has "
                           f"{torch.cuda.device_count()} (backend='gloo' can put several ranks on one GPU)")
    port = port or free_port()
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size) if device_type == "cpu" else 0
    os.environ.update(RANK_ENV)  # inherited by the ranks
    with tempfile.TemporaryDirectory(prefix="specc-tp-") as tmp:
        result_path = str(Path(tmp) / "results.pt")
        mp.start_processes(_worker, args=(world_size, port, device_type, backend, list(jobs), result_path, threads),
                           nprocs=world_size, join=True, start_method=start_method)
        return torch.load(result_path, weights_only=False)


# --------------------------------------------------------------------------- the check


@dataclasses.dataclass
class Reference:
    """The 1-rank run: greedy tokens, forced logits/argmax, top-2 margins, weights, step times."""

    tokens: list[int]
    logits: torch.Tensor
    weights: dict[str, int]
    step_times: dict | None = None

    @property
    def argmax(self) -> list[int]:
        return self.logits.argmax(-1).tolist()

    @property
    def margins(self) -> list[float]:
        top = self.logits.topk(2, dim=-1).values
        return (top[:, 0] - top[:, 1]).tolist()


def reference_run(source: Any, prompt: Sequence[int], num_tokens: int, *, block: int = 4, dtype: str = "float32",
                  device: str = "cpu", passes: Sequence[str] = DEFAULT_PASSES, timing: dict | None = None,
                  tokens: Sequence[int] | None = None, compiled: bool = False) -> Reference:
    """The 1-rank oracle: greedy tokens and forced logits from the model's own forward (its weights
    summary and, with ``timing``, step times from its traced IR with ``passes``, unsharded; with
    ``compiled`` from the generated step of that IR, CUDA-graphed on the GPU)."""
    dev = torch.device(device)
    model = build_model(source, dtype, dev)
    n = len(tokens) if tokens is not None else num_tokens
    job = TPJob(source, list(prompt), [0] * n, block, dtype, tuple(passes), timing=timing)
    model.setup_caches(1, job.cache_len())
    toks = list(tokens) if tokens is not None else greedy_tokens(model, prompt, num_tokens, dev)
    for layer in model.layers:
        layer.self_attn.cache_k.zero_()
        layer.self_attn.cache_v.zero_()
    logits = forced_logits(model, prompt, toks, block, dev)
    ir, _ = trace_target(model, passes)
    weights = weight_summary(ir)
    times = None
    if timing:
        fn = compile_step(ir, job.cache_len()) if compiled else ir
        timer = time_steps_graphed if compiled else time_steps
        times = timer(fn, qs=list(timing.get("qs", [1, block])), context=int(timing.get("context", 0)),
                      repeats=int(timing.get("repeats", 20)), warmup=int(timing.get("warmup", 3)), device=dev,
                      vocab=model.config.vocab_size)
        del fn
    del ir, model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return Reference(toks, logits, weights, times)


@dataclasses.dataclass
class TPCheck:
    """Sharded vs 1-rank token forcing for one model."""

    name: str
    world_size: int
    reference: Reference
    result: TPResult
    atol: float
    rtol: float
    tie_tol: float

    @property
    def mismatches(self) -> list[tuple[int, int]]:
        """(rank, position) where a rank's argmax differs from the reference's."""
        ref = self.reference.argmax
        return [(r, i) for r, am in enumerate(self.result.argmax) for i, (a, b) in enumerate(zip(am, ref)) if a != b] + \
            [(r, -1) for r, am in enumerate(self.result.argmax) if len(am) != len(ref)]

    @property
    def ties(self) -> list[tuple[int, int]]:
        """Mismatches at positions where the reference's top-2 margin is below ``tie_tol``."""
        m = self.reference.margins
        return [(r, i) for r, i in self.mismatches if i >= 0 and m[i] < self.tie_tol]

    @property
    def max_abs_diff(self) -> float:
        return float((self.result.logits - self.reference.logits).abs().max())

    @property
    def logits_close(self) -> bool:
        return bool(torch.allclose(self.result.logits, self.reference.logits, atol=self.atol, rtol=self.rtol))

    @property
    def argmax_equal(self) -> bool:
        return not self.mismatches

    @property
    def ok(self) -> bool:
        return self.argmax_equal and self.logits_close

    def summary(self) -> str:
        w = self.result.weights
        return (f"{self.name}: world {self.world_size} ({self.result.backend}), {len(self.reference.tokens)} forced tokens, "
                f"argmax {'identical' if self.argmax_equal else f'differs at {self.mismatches} (ties {self.ties})'}, "
                f"max |logit diff| {self.max_abs_diff:.3g} ({'allclose' if self.logits_close else 'NOT allclose'} at "
                f"atol {self.atol:g} rtol {self.rtol:g}); parameter bytes per rank "
                f"{[x['parameter_bytes'] for x in w]} vs {self.reference.weights['parameter_bytes']} on 1 rank")

    def to_json(self) -> dict:
        return {"name": self.name, "world_size": self.world_size, "backend": self.result.backend,
                "tokens": self.reference.tokens, "reference_argmax": self.reference.argmax,
                "argmax": self.result.argmax, "mismatches": self.mismatches, "ties": self.ties,
                "max_abs_logit_diff": self.max_abs_diff, "logits_close": self.logits_close, "atol": self.atol,
                "rtol": self.rtol, "weights_per_rank": self.result.weights, "reference_weights": self.reference.weights,
                "pass_stats": self.result.pass_stats, "ok": self.ok}


def tp_forward_check_many(sources: Sequence[Any], world_size: int = 2, *, prompt: Sequence[int] | None = None,
                          num_tokens: int = 12, block: int = 4, dtype: str = "float32", device: str = "cpu",
                          passes: Sequence[str] = DEFAULT_PASSES, atol: float = 1e-4, rtol: float = 1e-4,
                          tie_tol: float = 1e-3, port: int | None = None,
                          tokens: Sequence[Sequence[int] | None] | None = None,
                          load: str | Sequence[str] = "sharded", compiled: bool = False) -> list[TPCheck]:
    """:func:`tp_forward_check` for several models with ONE start of the ranks (``tokens``: per
    source, tokens to force instead of the 1-rank greedy ones, or None; ``load``: one mode or
    one per source; ``compiled``: the ranks run specc's generated steps, see :class:`TPJob`)."""
    refs, jobs = [], []
    for i, src in enumerate(sources):
        p = list(prompt if prompt is not None else DEFAULT_PROMPT)
        forced = tokens[i] if tokens is not None else None
        ref = reference_run(src, p, num_tokens, block=block, dtype=dtype, device=device, passes=passes, tokens=forced)
        refs.append(ref)
        name = str(src) if not isinstance(src, dict) else f"random {src['config'].get('model_type', '')}"
        mode = load if isinstance(load, str) else load[i]
        jobs.append(TPJob(src, p, ref.tokens, block, dtype, tuple(passes), name=name, load=mode, compiled=compiled))
    results = run_tp(jobs, world_size, device=device, port=port)
    return [TPCheck(job.name, world_size, ref, res, atol, rtol, tie_tol) for job, ref, res in zip(jobs, refs, results)]


def tp_forward_check(source: Any, world_size: int = 2, **kwargs) -> TPCheck:
    """Token forcing of the ``world_size``-way sharded target against the 1-rank model.

    source: a checkpoint path (or ``{"config": ..., "seed": ...}``). kwargs: ``prompt``
    (token ids; default a fixed 7-token prompt), ``num_tokens`` (12: greedy tokens of the 1-rank
    run to force), ``tokens`` (a list per source: force these instead), ``block`` (4: verify block size), ``dtype`` ("float32"), ``device`` ("cpu":
    gloo ranks; "cuda": NCCL, one GPU per rank), ``passes`` (before sharding), ``atol``/``rtol``
    (logits allclose), ``tie_tol`` (top-2 margin under which a mismatch is a numerical tie),
    ``port``, ``load`` ("sharded": ranks materialise only their slices; "full": each rank
    builds the whole model, fuses, then shards), ``compiled`` (False: the ranks run their traced
    IR; True: specc's generated steps, with ``passes=COMPILED_PASSES``). Returns a
    :class:`TPCheck` (``.ok``, ``.mismatches``, ``.summary()``)."""
    return tp_forward_check_many([source], world_size, **kwargs)[0]


def tp_speculative_check(target: Any, drafter: Any, world_size: int = 2, *, prompt: Sequence[int] | None = None,
                         max_new_tokens: int = 16, method: str = "ar-draft", num_draft: int = 3, dtype: str = "float32",
                         device: str = "cpu", port: int | None = None) -> dict:
    """Speculative decoding with the target sharded over ``world_size`` ranks (drafter
    replicated, generated steps, the device loop) against plain greedy decoding of the 1-rank
    model: returns ``{"reference": tokens, "ranks": [tokens per rank], "equal": bool, "tau":
    [...], "result": TPSpecResult}``; ``equal`` is True when every rank produced exactly the
    reference tokens."""
    p = list(prompt if prompt is not None else DEFAULT_PROMPT)
    model = build_model(target, dtype, torch.device(device if torch.device(device).type == "cpu" else "cuda:0"))
    model.setup_caches(1, len(p) + max_new_tokens + 1)
    reference = greedy_tokens(model, p, max_new_tokens, next(model.parameters()).device)
    del model
    gc.collect()
    job = TPSpecJob(target, drafter, p, max_new_tokens, method, num_draft, dtype)
    res = run_tp([job], world_size, device=device, port=port)[0]
    return {"reference": reference, "ranks": res.tokens, "equal": all(t == reference for t in res.tokens),
            "tau": res.tau, "result": res}


__all__ = [
    "COMPILED_PASSES", "DEFAULT_PASSES", "RANK_ENV", "compile_step", "time_steps_graphed", "Reference", "TPCheck", "TPJob", "TPResult", "build_model", "forced_logits",
    "free_port", "greedy_tokens", "init_distributed", "load_tp_target", "random_init_", "reference_run", "run_tp", "time_steps",
    "tp_forward_check", "tp_forward_check_many", "tp_speculative_check", "trace_target", "weight_summary",
    "TPSpecJob", "TPSpecResult",
]
