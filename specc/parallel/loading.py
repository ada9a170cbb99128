"""A tensor-parallel rank's model: whole (:func:`build_model`, random or from a checkpoint) or only
its shard of the verify step (:func:`load_tp_target`, reading only its slices of the weights)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import torch

from specc.parallel.steps import DEFAULT_PASSES


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    from specc.ir import parse_dtype as _parse

    return _parse(name)


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
    from specc.codegen.build import trace_step
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
    ir = trace_step(model, "target")
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
