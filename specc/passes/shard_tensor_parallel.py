"""shard_tensor_parallel: split a target step over tensor-parallel ranks (Megatron-style).

Options (``PassContext.option``, or the constructor; else the environment variables
``SPECC_TP_WORLD_SIZE`` / ``SPECC_TP_RANK``, for ``specc ir``): ``tp_world_size`` (ranks, >= 1)
and ``tp_rank`` (this rank, 0 <= rank < world). The pass rewrites the IR of ONE rank:

- **column-parallel** linears (their output features are split): the q/k/v projections and the
  MLP's gate/up projections, plain ``linear`` or ``norm_linear`` (after ``fuse_norm_linear``),
  separate or fused (after ``fuse_qkv`` / ``fuse_gate_up``: the weight is the concatenation
  [q; k; v] or [gate; up] followed by a ``split``, so each part is sliced on its own and the split
  sections shrink). Rank r keeps query heads ``[r Hq/w, (r + 1) Hq/w)``, kv heads
  ``[r Hkv/w, (r + 1) Hkv/w)`` (the kv heads its query heads use under GQA) and intermediate
  features ``[r I/w, (r + 1) I/w)``;
- **row-parallel** linears (their input features are split): o_proj (input = this rank's heads)
  and down_proj (input = this rank's intermediate features), each followed by a new
  ``all_reduce`` node (specc.ir.collectives) that sums the ranks' partial outputs. A row bias
  is kept on rank 0 only, so it is added once;
- **attention over the local heads**: the ``view``s that split q/k/v into heads are rewritten to
  the local head counts, and the attention's KV cache tensors (``get_attr`` of
  ``layers.N.self_attn.cache_k`` / ``cache_v``) are replaced on the GraphModule by caches that
  hold this rank's kv heads only (``[Bmax, Hkv/w, S, D]``, sliced from the old ones, so cached
  context survives);
- everything else is **replicated**: embedding, rms_norms (also Qwen3's per-head q/k norms, which
  act on head_dim), rope, residual adds, final norm and lm_head. Every rank computes the full
  logits; nothing has to be gathered.

The sliced weights replace the parameters under their own names on the GraphModule (the traced
model keeps its full tensors; drop it to free them), so per-rank ``weight_bytes`` in the metadata
are 1/w of the sharded linears'. Two all_reduces per decoder layer; the pass runs before
``pack_weights_12bit`` (it shards bf16 weights, packing happens per rank).

Requirements, checked before anything changes: Hq, Hkv and every sharded feature count divisible
by w (Qwen3-8B: 32/8 heads, 12288 features: w in 1, 2, 4, 8). World 1 changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.fx
from torch import nn

from specc.ir import IR, SCOPE_KEY, collectives  # noqa: F401  (collectives registers the all_reduce rule)
from specc.ir.collectives import all_reduce
from specc.passes.base import Pass, PassContext, PassError, PassResult
from specc.passes.registry import register_pass

NAME = "shard_tensor_parallel"
SPEC_KEY = "specc_tensor_parallel"  # ir.gm.meta key of the shard map (see tp_spec)
ENV_WORLD, ENV_RANK = "SPECC_TP_WORLD_SIZE", "SPECC_TP_RANK"  # fallback when no option is given
COLUMN_KINDS = ("linear", "norm_linear")
# (weight, bias) argument positions of the linear kinds the pass slices
_WEIGHT_ARGS = {"linear": (1, 2), "norm_linear": (3, 4)}
# ops between a q/k/v projection and the attention that keep the head layout
_HEAD_PATH = ("view", "rms_norm", "rope")


def _fail(message: str):
    raise PassError(f"{NAME}: {message}", NAME)


@dataclasses.dataclass
class _Part:
    """One output block of a column-parallel linear: q, k, v, gate or up."""

    role: str
    units: int  # heads (q/k/v) or features (gate/up), globally
    unit_size: int  # head_dim for heads, 1 for features


@dataclasses.dataclass
class _Column:
    node: torch.fx.Node
    split: torch.fx.Node | None
    parts: dict[int, _Part] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Plan:
    columns: dict[torch.fx.Node, _Column]
    rows: list[tuple[torch.fx.Node, str]]  # (linear, "o_proj" | "down_proj")
    views: list[tuple[torch.fx.Node, int, int]]  # (view, global heads, head_dim)
    caches: list[tuple[torch.fx.Node, int]]  # (cache get_attr, global kv heads)
    attentions: list[torch.fx.Node]


def _kind(ir: IR, node: Any) -> str | None:
    return ir.meta(node).kind if isinstance(node, torch.fx.Node) else None


def _weight_bias(ir: IR, node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node | None]:
    wi, bi = _WEIGHT_ARGS[_kind(ir, node)]
    w = node.args[wi] if len(node.args) > wi else node.kwargs.get("weight")
    b = node.args[bi] if len(node.args) > bi else node.kwargs.get("bias")
    if not (isinstance(w, torch.fx.Node) and _kind(ir, w) == "weight"):
        _fail(f"%{node.name}: its weight is not a parameter (get_attr); cannot slice it")
    if b is not None and not (isinstance(b, torch.fx.Node) and _kind(ir, b) == "weight"):
        _fail(f"%{node.name}: its bias is not a parameter (get_attr); cannot slice it")
    return w, b


def _only_user(node: torch.fx.Node, expected: torch.fx.Node, what: str) -> None:
    if list(node.users) != [expected]:
        _fail(f"%{node.name} ({what}) is used outside the sharded path ({sorted(u.name for u in node.users)})")


def _producer(ir: IR, value: torch.fx.Node, views: list | None, consumer: torch.fx.Node):
    """Walk back from an attention q/k/v (or silu_mul gate/up) argument to the linear producing
    it: (linear node, (split node, index) or None). Collects the views passed on the way."""
    node, user = value, consumer
    while _kind(ir, node) in _HEAD_PATH:
        _only_user(node, user, ir.meta(node).kind)
        if _kind(ir, node) == "view" and views is not None:
            views.append(node)
        node, user = node.args[0], node
    kind = _kind(ir, node)
    if kind in COLUMN_KINDS:
        _only_user(node, user, kind)
        return node, None
    if kind == "getitem" and _kind(ir, node.args[0]) == "split":
        _only_user(node, user, "getitem")
        split = node.args[0]
        lin = split.args[0]
        if _kind(ir, lin) not in COLUMN_KINDS:
            _fail(f"%{split.name} splits %{getattr(lin, 'name', lin)} ({_kind(ir, lin)}), not a linear")
        _only_user(lin, split, _kind(ir, lin))
        return lin, (split, node.args[1])
    _fail(f"cannot find the linear producing %{value.name} for %{consumer.name} (reached %{node.name}, {kind}); "
          "run shard_tensor_parallel before passes that replace linears (pack_weights_12bit)")


def _row_consumer(ir: IR, node: torch.fx.Node, what: str) -> torch.fx.Node:
    users = [u for u in node.users]
    if len(users) != 1 or _kind(ir, users[0]) != "linear" or users[0].args[0] is not node:
        _fail(f"%{node.name} ({what}) should feed exactly one linear as its input, feeds "
              f"{[(u.name, _kind(ir, u)) for u in users]}")
    return users[0]


def _plan(ir: IR, world: int) -> _Plan:
    columns: dict[torch.fx.Node, _Column] = {}
    views: list[tuple[torch.fx.Node, int, int]] = []
    caches: list[tuple[torch.fx.Node, int]] = []
    rows: list[tuple[torch.fx.Node, str]] = []

    def claim(value, consumer, role, units, unit_size, collect_views):
        found: list = []
        lin, piece = _producer(ir, value, found if collect_views else None, consumer)
        col = columns.setdefault(lin, _Column(lin, piece[0] if piece else None))
        index = piece[1] if piece else 0
        if (col.split is None) != (piece is None) or index in col.parts:
            _fail(f"%{lin.name} feeds %{consumer.name} in an unexpected way")
        col.parts[index] = _Part(role, units, unit_size)
        return found

    attentions = ir.calls("attention")
    for att in attentions:
        a = ir.meta(att).attrs
        hq, hkv, d = a["num_heads"], a["num_kv_heads"], a["head_dim"]
        if hq % world or hkv % world:
            _fail(f"%{att.name}: {hq} query / {hkv} kv heads are not divisible by world size {world} "
                  "(replicating kv heads is not supported)")
        for i, role, heads in ((0, "q", hq), (1, "k", hkv), (2, "v", hkv)):
            for view in claim(att.args[i], att, role, heads, d, True):
                views.append((view, heads, d))
        for i in (3, 4):
            cache = att.args[i]
            if _kind(ir, cache) != "kv_cache":
                _fail(f"%{att.name}: argument {i} is not a KV cache get_attr")
            _only_user(cache, att, "kv_cache")
            caches.append((cache, hkv))
        rows.append((_row_consumer(ir, att, "attention"), "o_proj"))
    for act in ir.calls("silu_mul"):
        features = ir.meta(act).shape[-1]
        if int(features) % world:
            _fail(f"%{act.name}: {features} intermediate features are not divisible by world size {world}")
        claim(act.args[0], act, "gate", int(features), 1, False)
        claim(act.args[1], act, "up", int(features), 1, False)
        rows.append((_row_consumer(ir, act, "silu_mul"), "down_proj"))

    for col in columns.values():
        if col.split is not None:
            sections = list(col.split.args[1])
            if sorted(col.parts) != list(range(len(sections))):
                _fail(f"%{col.split.name}: pieces {sorted(set(range(len(sections))) - set(col.parts))} of the fused "
                      f"%{col.node.name} do not feed an attention or silu_mul; cannot shard it")
            if col.split.kwargs.get("dim", col.split.args[2] if len(col.split.args) > 2 else 0) not in (-1, 2):
                _fail(f"%{col.split.name}: split is not over the feature dim")
            for i, part in col.parts.items():
                if int(sections[i]) != part.units * part.unit_size:
                    _fail(f"%{col.split.name}: section {i} has {sections[i]} features, the {part.role} part "
                          f"needs {part.units} x {part.unit_size}")
        else:
            part = col.parts[0]
            out = int(ir.meta(col.node).attrs["out_features"])
            if out != part.units * part.unit_size:
                _fail(f"%{col.node.name}: {out} output features, the {part.role} part needs {part.units} x {part.unit_size}")
    return _Plan(columns, rows, views, caches, attentions)


def _row_ranges(col: _Column, world: int, rank: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of the weight rows (output features) rank ``rank`` keeps of a column
    linear: one per part (q, k, v / gate, up), in order."""
    ranges, offset = [], 0
    for i in sorted(col.parts):
        part = col.parts[i]
        size = part.units * part.unit_size
        local = size // world
        ranges.append((offset + rank * local, offset + (rank + 1) * local))
        offset += size
    return ranges


def _take(t: torch.Tensor, dim: int, ranges: list[tuple[int, int]]) -> torch.Tensor:
    parts = [t.narrow(dim, a, b - a) for a, b in ranges]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim)).contiguous().clone()


def _set_tensor(ir: IR, target: str, tensor: torch.Tensor, parameter: bool) -> None:
    """Replace the GraphModule attribute ``target`` (a parameter or a buffer) by ``tensor``."""
    owner_name, _, leaf = target.rpartition(".")
    owner: nn.Module = ir.gm.get_submodule(owner_name) if owner_name else ir.gm
    if parameter:
        if leaf in owner._buffers:
            del owner._buffers[leaf]
        owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    else:
        if leaf in owner._parameters:
            del owner._parameters[leaf]
        owner._buffers[leaf] = tensor
        owner._non_persistent_buffers_set.add(leaf)


@register_pass
class ShardTensorParallel(Pass):
    """Split q/k/v, gate/up (column) and o/down (row + all_reduce) linears and the KV caches over tensor-parallel ranks."""

    name = NAME
    after = ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear")
    before = ("pack_weights_12bit",)

    def __init__(self, world_size: int | None = None, rank: int | None = None):
        self.world_size, self.rank = world_size, rank
        self._done: tuple[int, int] | None = None

    def requires(self, ir: IR) -> bool | str:
        if ir.model_kind != "causal_lm":
            return f"only Llama/Qwen3-style causal LM steps are sharded, not {ir.model_kind}"
        if not ir.count("attention") and not ir.count("rope_attention"):
            return "no attention in this step"
        if ir.count("all_reduce"):
            return "this step is already sharded (it has all_reduce nodes)"
        return True

    def _options(self, ctx: PassContext) -> tuple[int, int]:
        world = ctx.option("tp_world_size", self.world_size)
        rank = ctx.option("tp_rank", self.rank)
        if world is None:  # the command line has no pass options: `SPECC_TP_WORLD_SIZE=2 specc ir ...`
            world, rank = os.environ.get(ENV_WORLD), os.environ.get(ENV_RANK, rank)
        if world is None:
            _fail(f"set the option tp_world_size (and tp_rank), e.g. PassManager([...], "
                  f"options={{'tp_world_size': 2, 'tp_rank': 0}}), or {ENV_WORLD} / {ENV_RANK} for `specc ir`")
        world, rank = int(world), int(rank or 0)
        if world < 1 or not 0 <= rank < world:
            _fail(f"need tp_world_size >= 1 and 0 <= tp_rank < tp_world_size, got world {world}, rank {rank}")
        return world, rank

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        world, rank = self._options(ctx)
        self._done = (world, rank)
        if world == 1:
            ctx.note(f"{NAME}: tp_world_size is 1, nothing to shard")
            return PassResult(False, {"world_size": 1, "rank": 0})
        if ir.count("rope_attention"):
            _fail("this step's attention is already fused with rope (fuse_rope_attention): run "
                  "shard_tensor_parallel before it (a PassManager orders the two itself)")
        plan = _plan(ir, world)  # every check happens here, before the graph changes
        graph = ir.graph
        # target -> (dim, [start, stop) ranges, full shape): what this rank keeps of each parameter
        slices: dict[str, tuple[int, list[tuple[int, int]], tuple[int, ...]]] = {}

        def slice_param(node: torch.fx.Node, dim: int, ranges: list[tuple[int, int]]) -> None:
            full = tuple(ir.get_tensor(node).shape)
            if node.target in slices and slices[node.target][:2] != (dim, ranges):
                _fail(f"parameter {node.target} is used by two linears sharded differently")
            slices[node.target] = (dim, ranges, full)

        for col in plan.columns.values():
            w, b = _weight_bias(ir, col.node)
            ranges = _row_ranges(col, world, rank)
            slice_param(w, 0, ranges)
            if b is not None:
                slice_param(b, 0, ranges)
        for lin, _ in plan.rows:
            w, b = _weight_bias(ir, lin)
            cols = int(ir.meta(lin).attrs["in_features"]) // world
            slice_param(w, 1, [(rank * cols, (rank + 1) * cols)])
        # every reader of a sliced parameter must be one of the linears sharded the same way
        sharded = set(plan.columns) | {lin for lin, _ in plan.rows}
        for node in graph.nodes:
            if node.op == "get_attr" and node.target in slices:
                for user in node.users:
                    if user not in sharded:
                        _fail(f"parameter {node.target} is also read by %{user.name}, which is not sharded")

        # ---- rewrite (nothing below can fail on a valid plan)
        with torch.no_grad():
            for target, (dim, ranges, _) in slices.items():
                _set_tensor(ir, target, _take(ir.get_tensor(target).detach(), dim, ranges), parameter=True)
        for col in plan.columns.values():
            if col.split is not None:
                sections = [int(s) // world for s in col.split.args[1]]
                col.split.args = (col.split.args[0], sections, *col.split.args[2:])
        for view, heads, d in plan.views:
            _rewrite_view(ir, view, heads, heads // world, d)
        cache_slices: dict[str, tuple[int, list[tuple[int, int]], tuple[int, ...]]] = {}
        for cache, hkv in plan.caches:
            if cache.target in cache_slices:
                continue
            local = hkv // world
            full = ir.get_tensor(cache)
            cache_slices[cache.target] = (1, [(rank * local, (rank + 1) * local)], tuple(full.shape))
            with torch.no_grad():  # cached context survives: keep this rank's kv heads
                _set_tensor(ir, cache.target, _take(full, *cache_slices[cache.target][:2]), parameter=False)
        reduces = 0
        for lin, role in plan.rows:
            _, b = _weight_bias(ir, lin)
            if b is not None and rank != 0:  # the bias is added once: by rank 0's partial sum
                args = list(lin.args)
                args[2] = None
                lin.args = tuple(args)
                if not b.users:
                    graph.erase_node(b)
            with graph.inserting_after(lin):
                red = graph.create_node("call_function", all_reduce, (lin, world), name=f"{lin.name}_all_reduce")
            red.meta[SCOPE_KEY] = lin.meta.get(SCOPE_KEY, "")
            lin.replace_all_uses_with(red, delete_user_cb=lambda user, red=red: user is not red)
            reduces += 1
        ir.gm.meta[SPEC_KEY] = {
            "world_size": world, "rank": rank,
            "params": {t: {"dim": d, "ranges": [list(r) for r in rs], "full_shape": list(full)}
                       for t, (d, rs, full) in slices.items()},
            "caches": {t: {"dim": d, "ranges": [list(r) for r in rs], "full_shape": list(full)}
                       for t, (d, rs, full) in cache_slices.items()},
        }
        if ir.title:
            ir.title = f"{ir.title}, tensor parallel rank {rank} of {world}"
        ir.refresh()
        ctx.note(f"{NAME}: rank {rank} of {world}: {len(plan.columns)} column-parallel and {len(plan.rows)} "
                 f"row-parallel linears, {reduces} all_reduce")
        return PassResult(True, {"world_size": world, "rank": rank, "attention": len(plan.attentions),
                                 "column_linears": len(plan.columns), "row_linears": len(plan.rows),
                                 "all_reduce": reduces, "views": len(plan.views), "caches": len(cache_slices),
                                 "weights": len(slices)})

    def ensures(self, ir: IR) -> bool | str:
        if self._done is None or self._done[0] == 1:
            return True
        world = self._done[0]
        for att in ir.calls("attention"):
            out = _row_consumer(ir, att, "attention")
            users = list(out.users)
            if len(users) != 1 or _kind(ir, users[0]) != "all_reduce":
                return f"%{out.name} (row-parallel after %{att.name}) is not followed by an all_reduce"
        for act in ir.calls("silu_mul"):
            down = _row_consumer(ir, act, "silu_mul")
            users = list(down.users)
            if len(users) != 1 or _kind(ir, users[0]) != "all_reduce":
                return f"%{down.name} (row-parallel after %{act.name}) is not followed by an all_reduce"
        for red in ir.calls("all_reduce"):
            if ir.meta(red).attrs["world_size"] != world:
                return f"%{red.name} reduces over {ir.meta(red).attrs['world_size']} ranks, not {world}"
        return True


def _rewrite_view(ir: IR, view: torch.fx.Node, heads: int, local: int, head_dim: int) -> None:
    """``view(x, B, Q, heads, D)`` -> ``view(x, B, Q, local, D)`` (the heads dim is the
    second-to-last; a -1 there needs no change)."""
    shape = ir.meta(view).shape
    if len(shape) < 2 or int(shape[-1]) != head_dim or int(shape[-2]) != heads:
        _fail(f"%{view.name}: expected a view to [..., {heads}, {head_dim}], got {list(shape)}")
    nested = len(view.args) == 2 and isinstance(view.args[1], (tuple, list))
    sizes = list(view.args[1]) if nested else list(view.args[1:])
    pos = len(sizes) - 2
    value = sizes[pos]
    if isinstance(value, int) and value == -1:
        return
    if not (isinstance(value, int) and value == heads):
        _fail(f"%{view.name}: the heads size {value!r} is not the constant {heads}")
    sizes[pos] = local
    view.args = (view.args[0], type(view.args[1])(sizes)) if nested else (view.args[0], *sizes)


def tp_spec(ir: IR) -> dict | None:
    """What the pass recorded on ``ir`` (None if it did not shard it): ``world_size``, ``rank``,
    and per sliced parameter / KV cache (by qualified name) ``{"dim", "ranges", "full_shape"}``:
    the rank's tensor is the concatenation along ``dim`` of ``full[a:b]`` for each [a, b) range.
    A loader can materialise a rank's weights from a checkpoint with this alone (slices only),
    as ``specc.parallel.loading.load_tp_target`` does."""
    return ir.gm.meta.get(SPEC_KEY)


def shard(ir: IR, world_size: int, rank: int, *, check: bool = True) -> dict:
    """Shard ``ir`` in place for ``rank`` of ``world_size``; returns the pass stats (a shorthand
    for running the pass alone in a PassManager with the two options)."""
    from specc.passes.manager import PassManager

    report = PassManager([ShardTensorParallel()], check=check,
                         options={"tp_world_size": world_size, "tp_rank": rank}).run(ir)
    return report.stats(NAME)


__all__ = ["SPEC_KEY", "ShardTensorParallel", "shard", "tp_spec"]
