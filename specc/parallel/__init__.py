"""Tensor parallelism: sharded targets over torch.distributed, a launcher, token-forcing checks.

A target too large for one GPU runs on ``w`` ranks (one GPU each), every rank executing the
IR of its own shard (``specc.passes.shard_tensor_parallel``: column-parallel q/k/v and gate/up,
row-parallel o/down followed by ``all_reduce``, local KV heads, replicated embedding, norms and
lm_head). The drafter is not sharded: it stays replicated (every rank drafts the same tokens) or
runs on one rank.

    from specc.parallel import tp_forward_check
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

Modules: ``launch.py`` (process group, ranks, :func:`run_tp`), ``loading.py`` (:func:`build_model`,
:func:`load_tp_target`, random weights), ``steps.py`` (trace/compile/time a step, token forcing),
``jobs.py`` (:class:`TPJob`, :class:`TPSpecJob`: what a rank runs), ``checks.py`` (the 1-rank
reference and :func:`tp_forward_check` / :func:`tp_speculative_check`). Names load lazily.
"""

_LAZY = {
    "MASTER_ADDR": "launch", "RANK_ENV": "launch", "default_backend": "launch", "free_port": "launch",
    "init_distributed": "launch", "run_tp": "launch",
    "build_model": "loading", "load_tp_target": "loading", "parse_dtype": "loading", "random_init_": "loading",
    "COMPILED_PASSES": "steps", "DEFAULT_PASSES": "steps", "DEFAULT_PROMPT": "steps", "compile_step": "steps",
    "forced_logits": "steps", "greedy_tokens": "steps", "time_steps": "steps", "time_steps_graphed": "steps",
    "trace_target": "steps", "weight_summary": "steps",
    "TPJob": "jobs", "TPResult": "jobs", "TPSpecJob": "jobs", "TPSpecResult": "jobs",
    "Reference": "checks", "TPCheck": "checks", "reference_run": "checks", "tp_forward_check": "checks",
    "tp_forward_check_many": "checks", "tp_speculative_check": "checks",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"specc.parallel.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'specc.parallel' has no attribute {name!r}")
