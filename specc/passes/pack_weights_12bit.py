"""pack_weights_12bit: store linear weights in the lossless 12-bit format (bf12).

Every ``linear`` / ``norm_linear`` whose weight is bf16 becomes a ``packed_linear`` reading the
weight's bf12 planes (``specc.formats.bf12``: 1.5 bytes/weight + a sparse exact escape table)
instead of the bf16 matrix. The weights are bit-exact (``Packed12.unpack()`` returns the
original bf16 bits), so the rewritten step computes the same function; on the GPU the fused
decode + GEMV/GEMM kernel (``specc.codegen.kernels.linear_bf12``) reads 25% fewer bytes.

Options (``PassContext.option``): ``pack_include`` / ``pack_exclude``: substrings of weight
names selecting the linears (default: all), so the cost model can pack a subset (e.g. only the
MLP, or everything but ``lm_head``); ``pack_base``: "row" (default) or "tensor";
``pack_version``: the bf12 layout, 3 (default: layout 2's bytes in 16-row x 64-weight tiles,
for the weights whose shape allows it, ``bf12.tileable``; layout 2 for the others), 2 or 1. All
are exact. Layouts 2 and 3 are read at 1 .. 32 rows by the tensor-core kernel
``specc.codegen.kernels.linear_bf12_mma`` (one launch) and above by the Triton kernel
``specc.codegen.kernels.linear_bf12_v2``. On the H100, in one process, the packed Qwen3-8B AR step
is 0.889x the unpacked one in layout 3 (0.940x in layout 2) and the Q = 16 verify 0.881x (0.944x;
docs/benchmarks/run21.md). Above 32 rows the Triton kernel is 3.5x slower per layer at 64 rows,
so the cost model does not pack there (docs/benchmarks/run20.md). ``specc calibrate`` times the
layout this pass gives each shape (:func:`layout_for`). Weights without values (the meta device:
``specc cost``) pack to meta planes of the layout's sizes with an estimated escape table
(``specc.formats.bf12.packed_meta``). ``fuse_residual_add`` folds the residual add into packed
linears (the tensor-core kernel adds it in its epilogue). The layout version is a keyword of each
``packed_linear`` call (the emitted step's source shows it); the pass's stats (the manifest's
record of applied passes) give the requested ``format_version`` and the count per layout
(``format_versions``).
"""

from __future__ import annotations

import torch
import torch.fx

from specc.formats.bf12 import FORMAT_VERSIONS, pack_bf16_12bit, packed_meta, tileable
from specc.ir import IR, SCOPE_KEY, Cost, OpCall, linear_cost, register_op
from specc.ir.meta import TensorMeta
from specc.models.fused_ops import packed_linear  # the eager body
from specc.passes.base import Pass, PassContext, PassResult
from specc.passes.registry import register_pass

# the layout compiled artifacts get where the weight's shape allows it, else 2 (the module docstring
# says why; docs/kernels.md)
DEFAULT_PACK_VERSION = 3


def layout_for(shape: tuple[int, ...], version: int | None = None) -> int:
    """The layout a weight of ``shape`` is packed in for the requested ``version`` (default
    :data:`DEFAULT_PACK_VERSION`): layout 3 falls back to 2 where the shape does not tile."""
    version = DEFAULT_PACK_VERSION if version is None else version
    return 2 if version == 3 and not tileable(tuple(shape)) else version


@register_op(packed_linear, "packed_linear")
def _packed_linear_rule(op: OpCall) -> Cost:
    """A linear whose weight is read as bf12 planes: bytes are the packed bytes (inputs 1-5)."""
    x = op.tensor(0, "x")
    n, k = op.arg(6, "n"), op.arg(7, "k")
    bias = op.tensor(9, "bias", optional=True)
    norm_w = op.tensor(10, "norm_weight", optional=True)
    residual = op.tensor(13, "residual", optional=True)  # fuse_residual_add's epilogue
    x_in = TensorMeta(x.shape, torch.bfloat16 if norm_w is None else torch.promote_types(norm_w.dtype, x.dtype))
    cost = linear_cost(op, x_in, TensorMeta((n, k), torch.bfloat16), bias)
    if norm_w is not None:
        cost.flops = cost.flops + 4 * x.numel
    if residual is not None:
        op.check(residual.same_as(cost.out), f"residual {residual} must match the linear's output {cost.out}")
        cost.flops = cost.flops + cost.out.numel
    cost.attrs = {**cost.attrs, "format": "bf12", "format_version": int(op.arg(12, "version", 1)),
                  "norm_prologue": norm_w is not None, "residual_epilogue": residual is not None, "k": int(k)}
    return cost


def _weight_name(node: torch.fx.Node) -> str:
    return node.target if node.op == "get_attr" else node.name


@register_pass
class PackWeights12bit(Pass):
    """Store bf16 linear weights in the lossless 12-bit format (packed_linear, 1.5 B/weight)."""

    name = "pack_weights_12bit"
    after = ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear")

    def _targets(self, ir: IR, ctx: PassContext | None):
        include = (ctx.option("pack_include") if ctx else None) or ()
        exclude = (ctx.option("pack_exclude") if ctx else None) or ()
        include = (include,) if isinstance(include, str) else tuple(include)
        exclude = (exclude,) if isinstance(exclude, str) else tuple(exclude)
        out = []
        for node in ir.calls("linear") + ir.calls("norm_linear"):
            w = node.args[1] if ir.meta(node).kind == "linear" else node.args[3]
            if w.op != "get_attr" or ir.meta(w).out.dtype != torch.bfloat16:
                continue
            name = _weight_name(w)
            if include and not any(s in name for s in include):
                continue
            if any(s in name for s in exclude):
                continue
            out.append((node, w))
        return out

    def requires(self, ir: IR) -> bool | str:
        if self._targets(ir, None):
            return True
        return "no bf16 linear weights (bf12 packs bf16 weights: compile for a bfloat16 deployment)"

    def run(self, ir: IR, ctx: PassContext) -> PassResult:
        self._ctx = ctx  # ensures() checks the same selection
        graph = ir.graph
        base_mode = (ctx.option("pack_base") if ctx else None) or "row"
        version = int((ctx.option("pack_version") if ctx else None) or DEFAULT_PACK_VERSION)
        if version not in FORMAT_VERSIONS:
            raise ValueError(f"pack_version must be one of {FORMAT_VERSIONS}, got {version}")
        packed_count, weights, escapes = 0, 0, 0
        bytes_before = bytes_after = 0
        estimated = False
        cache: dict[str, list[str]] = {}
        layout: dict[str, int] = {}  # weight -> its layout (3 falls back to 2 where the shape does not tile)
        for node, w in self._targets(ir, ctx):
            kind = ir.meta(node).kind
            name = _weight_name(w)
            tensor = ir.gm.get_parameter(name) if w.op == "get_attr" else None
            if name not in cache:
                layout[name] = layout_for(tuple(tensor.shape), version)
                if tensor.is_meta:  # traced from config.json alone (specc cost): sizes, no values
                    packed, estimated = packed_meta(tuple(tensor.shape), base=base_mode, version=layout[name]), True
                else:
                    packed = pack_bf16_12bit(tensor.detach(), base=base_mode, version=layout[name])
                parts = packed.to_state_dict("")
                cache[name] = [ir.add_weight(f"{name}_bf12_{p}", parts[p]) for p in ("sm", "ex", "base", "esc_idx", "esc_val")]
                weights += tensor.numel()
                escapes += packed.num_escapes
                bytes_before += tensor.numel() * 2
                bytes_after += packed.nbytes
            n, k = tensor.shape
            with graph.inserting_before(node):
                attrs = [graph.get_attr(q) for q in cache[name]]
                if kind == "linear":
                    x, bias = node.args[0], node.args[2] if len(node.args) > 2 else None
                    args = (x, *attrs, int(n), int(k), base_mode, bias)
                else:
                    x, g, eps, _, bias = (list(node.args) + [None])[:5]
                    args = (x, *attrs, int(n), int(k), base_mode, bias, g, eps)
                new = graph.create_node("call_function", packed_linear, args, {"version": layout[name]},
                                        name=f"packed_{node.name}")
            new.meta[SCOPE_KEY] = node.meta.get(SCOPE_KEY, "")
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            packed_count += 1
        ir.remove_dead()
        ir.refresh()
        versions = {str(v): sum(1 for x in layout.values() if x == v) for v in sorted(set(layout.values()))}
        return PassResult(packed_count > 0, {"packed": packed_count, "format_version": version,
                                             "format_versions": versions,
                                             "weights": weights, "escapes": escapes,
                                             "escape_rate": escapes / weights if weights else 0.0,
                                             "escapes_estimated": estimated,
                                             "bytes_before": bytes_before, "bytes_after": bytes_after})

    def ensures(self, ir: IR) -> bool | str:
        left = self._targets(ir, getattr(self, "_ctx", None))
        return True if not left else f"{len(left)} bf16 linears left unpacked"
