"""Steps of a tensor-parallel rank: trace + passes (:func:`trace_target`), generated code
(:func:`compile_step`), greedy decoding and token forcing with a step, step timing."""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import torch

from specc.passes.pipelines import DEFAULT_PIPELINE, TP_TRACED_PASSES

DEFAULT_PASSES = TP_TRACED_PASSES
# the single-device compiler's default pipeline (specc.passes.pipelines.DEFAULT_PIPELINE): what a rank
# runs before code generation with ``TPJob(compiled=True)``; the pass manager puts
# shard_tensor_parallel before fuse_rope_attention / fuse_residual_add, which must see its result
COMPILED_PASSES = tuple(DEFAULT_PIPELINE.split(","))
DEFAULT_PROMPT = (5, 17, 33, 2, 8, 9, 41)


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
    from specc.codegen.build import emit_ir
    from specc.runtime.compiled import instantiate

    emitted, _ = emit_ir(ir, "target")
    step = instantiate(emitted)
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

    from specc.runtime.graphs import capture

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
        with capture(graph):
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
    from specc.codegen.build import trace_step
    from specc.passes import PassManager

    ir = trace_step(model, "target")
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
