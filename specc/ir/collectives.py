"""Collective ops of tensor-parallel step functions: eager bodies, IR rules and cost terms.

The ``shard_tensor_parallel`` pass (specc/passes/shard_tensor_parallel.py) splits a target's
linears Megatron-style over ``world`` ranks; every row-parallel linear (o_proj, down_proj) leaves
each rank with a *partial sum* of the hidden state, which an ``all_reduce`` node adds up:

    all_reduce(x, world_size) -> x summed over the ranks of the default process group

Eager body: when ``torch.distributed`` has an initialised process group of more than one rank,
the op all-reduces (SUM) a clone of ``x`` (the input stays untouched, like every other op) and
returns it; otherwise it is the identity (a sharded graph run without a group, or a world of 1).
A graph sharded for ``world_size`` ranks refuses to run in a group of another size.

IR rule (kind ``all_reduce``): the output has the input's shape and dtype. For a message of
``N = x.nbytes`` bytes a ring all-reduce over ``w`` ranks runs ``2 (w - 1)`` steps
(reduce-scatter then all-gather), each moving ``N / w`` bytes per rank, so every rank sends and
receives

    collective_bytes = 2 (w - 1) / w * N                                  (all_reduce_traffic)

The node's ``bytes_read`` (what the rank sends out of its memory) and ``bytes_written`` (what it
receives into its memory) are both ``collective_bytes``; ``flops`` are the ``(w - 1) / w * numel``
additions of the reduce-scatter. ``attrs`` carry what the cost model needs to price the link:
``world_size``, ``reduce_op`` ("sum"), ``message_bytes`` (N), ``collective_bytes``,
``ring_steps`` (2 (w - 1)). At ``w = 1`` every cost is 0.

Cost-model term (:func:`all_reduce_time`): the ring all-reduce of a message of ``N`` bytes over
``w`` ranks whose links carry ``link_bandwidth`` bytes/s per direction per rank, with a fixed
``latency`` seconds per ring step:

    t = 2 (w - 1) / w * N / link_bandwidth + 2 (w - 1) * latency

Pass the *message* bytes (``attrs["message_bytes"]``, the tensor's size), not
``collective_bytes`` (the 2 (w - 1) / w factor is applied inside). The bandwidth and latency are
deployment facts (NVLink / PCIe / network, measured by NCCL's bus bandwidth tests or
``examples/bench_tp.py``), never constants of the model.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from specc.ir.meta import TensorMeta
from specc.ir.rules import Cost, OpCall, register_op

__all__ = ["all_reduce", "all_reduce_traffic", "all_reduce_time", "collective_time", "group_world_size"]


def group_world_size() -> int:
    """World size of the initialised default process group, 1 when there is none."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


@torch.fx.wrap
def all_reduce(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """Sum ``x`` over the ranks of the default process group (identity without one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return x
    group = dist.get_world_size()
    if group == 1:
        return x
    if group != world_size:
        raise RuntimeError(f"this graph was sharded for {world_size} ranks, the process group has {group}")
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_traffic(nbytes, world: int):
    """Bytes each rank sends (and receives) in a ring all-reduce of an ``nbytes`` message:
    ``2 (world - 1) / world * nbytes`` (a sympy expression when ``nbytes`` is one)."""
    world = int(world)
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    if isinstance(nbytes, sympy.Basic):
        return sympy.Rational(2 * (world - 1), world) * nbytes
    return 2.0 * (world - 1) / world * float(nbytes)


def all_reduce_time(nbytes, world: int, link_bandwidth: float, latency: float = 0.0):
    """Seconds of a ring all-reduce of a message of ``nbytes`` bytes over ``world`` ranks.

    ``link_bandwidth``: bytes/s each rank can send (and at the same time receive) to its ring
    neighbour; ``latency``: fixed cost of one of the ``2 (world - 1)`` ring steps (seconds).

        t = 2 (w - 1) / w * nbytes / link_bandwidth + 2 (w - 1) * latency

    0 for a world of 1. ``nbytes`` may be a sympy expression (then so is the result).
    """
    world = int(world)
    if world <= 1:
        return 0
    if link_bandwidth <= 0:
        raise ValueError(f"link bandwidth must be positive, got {link_bandwidth}")
    return all_reduce_traffic(nbytes, world) / link_bandwidth + 2 * (world - 1) * latency


def collective_time(meta, link_bandwidth: float, latency: float = 0.0):
    """Link time of a collective node from its NodeMeta (``all_reduce`` kind): the cost model's
    hook. Returns 0 for other kinds."""
    if meta.kind != "all_reduce":
        return 0
    return all_reduce_time(meta.attrs["message_bytes"], meta.attrs["world_size"], link_bandwidth, latency)


@register_op(all_reduce, "all_reduce")
def _all_reduce_rule(op: OpCall) -> Cost:
    """sum a tensor over the tensor-parallel ranks (ring all-reduce; output = input shape)"""
    x = op.tensor(0, "x")
    world = op.arg(1, "world_size")
    op.check(isinstance(world, int) and not isinstance(world, bool) and world >= 1,
             f"world_size must be a positive int, got {world!r}")
    out = TensorMeta(x.shape, x.dtype)
    message = x.nbytes
    traffic = all_reduce_traffic(message, world)
    return Cost(
        out,
        flops=sympy.Rational(world - 1, world) * x.numel,
        reads={0: traffic},
        written=traffic,
        attrs={"world_size": world, "reduce_op": "sum", "message_bytes": message, "collective_bytes": traffic,
               "ring_steps": 2 * (world - 1)},
    )
