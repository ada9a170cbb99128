"""Op rules: for every op the IR can hold, how its output shape/dtype and its costs follow from
its inputs. This is how the IR knows shapes without running anything (real-size models are
traced on the ``meta`` device, and attention's eager body is data dependent).

A rule is a function ``rule(op: OpCall) -> Cost`` registered for a call target with
:func:`register_op`. It reads its inputs' metadata through ``op`` (``op.tensor(0)``,
``op.arg(6, "mask_kind")``), checks that they fit together with ``op.check`` (errors name the
node), and returns the output metadata plus FLOPs. Bytes are filled in by the framework from the
inputs (each tensor input is read once, in full, unless the rule says otherwise in
``Cost.reads``) and the outputs (written once), and split into weights / KV cache / activations
by where each input comes from. A user pass that introduces a new op registers its rule the same
way (see examples/custom_pass.py).

FLOP conventions (the cost model's compute term; memory terms dominate decode): a matmul of
[M, K] x [K, N] is 2*M*K*N; attention counts its two matmuls over every cached + new key
(4 * B * Hq * Q * (C + Qk) * D, softmax and masking not counted); elementwise ops count a few
FLOPs per output element (add 1, rope 3, rms_norm 4, silu_mul 5).
"""

from __future__ import annotations

import builtins
import dataclasses
import operator
from typing import Any, Callable

import sympy
import torch

from specc.ir.errors import ShapeError
from specc.ir.meta import TensorMeta, value_str
from specc.ir.symbols import ZERO, same, sym
from specc.models import ops

# Node kinds and what they mean (docs/ir.md has the long form). Structural kinds move no bytes.
KINDS: dict[str, str] = {
    # graph structure
    "input": "a step input (placeholder)",
    "output": "the step's return value",
    "weight": "a parameter (get_attr); its readers account for the bytes",
    "kv_cache": "a KV cache buffer [Bmax, Hkv, S, D]; attention reads and writes it in place",
    "buffer": "a constant non-parameter tensor (rope inv_freq)",
    "constant": "a non-tensor attribute",
    # model leaf ops (specc.models.ops)
    "embedding": "gather rows of the embedding table: reads B*Q rows, not the table",
    "linear": "y = x W^T (+ b); reads all of W",
    "rms_norm": "RMSNorm over the last dim (fp32 statistics)",
    "silu_mul": "SiLU(gate) * up",
    "rope_tables": "cos/sin tables [B, T, head_dim] for integer positions",
    "rope": "rotary embedding of [B, T, H, D] by cos/sin",
    "attention": "write new K/V into the static cache at cache_len, attend over C + new keys",
    "ragged_attention": "packed rows: write each row's new K/V into its cache slot, attend causally over its cache",
    # fused ops introduced by passes (specc.ir.fused)
    "norm_linear": "rms_norm as the prologue of a linear: the normed activation is never stored",
    "linear_add": "a linear whose epilogue adds the residual stream: the product is never stored",
    # glue
    "add": "elementwise add (residual), with broadcasting",
    "mul": "elementwise multiply, with broadcasting",
    "cat": "concatenate tensors along a dim",
    "view": "reshape without copying",
    "slice": "basic indexing of a tensor (a view)",
    "split": "split a tensor into views along a dim",
    "getitem": "take one element of a tuple value",
    "shape": "the symbolic shape of a tensor",
    "size": "one symbolic dimension",
    "sym": "integer arithmetic on symbolic sizes",
}

# Kinds that only describe or alias values: no bytes, no FLOPs, hidden by `specc ir --brief`.
STRUCTURAL_KINDS = frozenset(
    {"input", "output", "weight", "kv_cache", "buffer", "constant", "view", "slice", "split", "getitem", "shape", "size", "sym"}
)


@dataclasses.dataclass
class Cost:
    """What a rule returns.

    out:          output metadata (TensorMeta, tuple of them, sympy expression, constant).
    flops:        arithmetic of the op.
    reads:        bytes read of an argument (by position or keyword) when it is not read in full
                  (embedding reads B*Q rows of its table; attention reads C + Qk cache positions).
    cache_writes: bytes written in place into an argument (attention into the KV caches).
    written:      bytes written to outputs, when not the full output tensors.
    attrs:        op parameters for codegen (mask_kind, eps, in/out features...).
    kind:         override the registered kind (operator.add on sizes is "sym", not "add").
    """

    out: Any
    flops: Any = 0
    reads: dict[int | str, Any] = dataclasses.field(default_factory=dict)
    cache_writes: dict[int | str, Any] = dataclasses.field(default_factory=dict)
    written: Any = None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    kind: str | None = None


@dataclasses.dataclass(frozen=True)
class OpDef:
    """A registered op: its kind, rule and properties the IR machinery relies on.

    view:       the output aliases an input (no bytes moved, no FLOPs).
    impure:     the op writes memory besides its output (KV caches); never removed as dead.
    cache_args: argument positions that are KV caches written in place.
    """

    kind: str
    rule: Callable[["OpCall"], Cost]
    doc: str = ""
    view: bool = False
    impure: bool = False
    cache_args: tuple[int, ...] = ()


_BY_FUNCTION: dict[Any, OpDef] = {}
_BY_METHOD: dict[str, OpDef] = {}
_MISSING = object()


def register_op(target: Callable | str, kind: str, *, doc: str = "", view: bool = False, impure: bool = False,
                cache_args: tuple[int, ...] = ()):
    """Decorator registering ``rule`` for a call target.

    ``target`` is the function a ``call_function`` node calls (e.g. ``specc.models.ops.linear``
    or a user's fused op), or a method name for ``call_method`` nodes (``"view"``). The kind is
    what passes match on and what codegen lowers; pick a new kind for a new op.
    """

    def deco(rule: Callable[["OpCall"], Cost]):
        od = OpDef(kind, rule, doc or (rule.__doc__ or "").strip().split("\n")[0], view, impure, tuple(cache_args))
        if isinstance(target, str):
            _BY_METHOD[target] = od
        else:
            _BY_FUNCTION[target] = od
        if kind not in KINDS:
            KINDS[kind] = od.doc or kind
        return rule

    return deco


def op_def(node: torch.fx.Node) -> OpDef | None:
    """The OpDef of a call node, or None (placeholders, get_attr, output, unknown targets)."""
    if node.op == "call_function":
        try:
            return _BY_FUNCTION.get(node.target)
        except TypeError:  # unhashable target
            return None
    if node.op == "call_method":
        return _BY_METHOD.get(node.target)
    return None


def op_of_kind(kind: str) -> Callable | None:
    """The function registered for ``kind`` (e.g. ``op_of_kind("linear") is ops.linear``)."""
    for fn, od in _BY_FUNCTION.items():
        if od.kind == kind:
            return fn
    return None


class OpCall:
    """The view of one call node a rule gets: its inputs' metadata and a way to complain."""

    def __init__(self, node: torch.fx.Node, kind: str, args: tuple, kwargs: dict):
        self.node, self.kind, self.args, self.kwargs = node, kind, args, kwargs

    def arg(self, index: int, name: str | None = None, default: Any = _MISSING) -> Any:
        if index < len(self.args):
            return self.args[index]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        if default is _MISSING:
            raise ShapeError(self._where() + f": missing argument {name or index}")
        return default

    def tensor(self, index: int, name: str | None = None, optional: bool = False) -> TensorMeta | None:
        value = self.arg(index, name, None if optional else _MISSING)
        if value is None and optional:
            return None
        if not isinstance(value, TensorMeta):
            raise ShapeError(self._where() + f": argument {name or index} should be a tensor, got {value_str(value)}")
        return value

    def check(self, condition: bool, message: str) -> None:
        if not condition:
            raise ShapeError(self._where() + ": " + message)

    def fail(self, message: str):
        raise ShapeError(self._where() + ": " + message)

    same = staticmethod(same)

    def _where(self) -> str:
        return f"node %{self.node.name} ({self.kind})"


def rows(t: TensorMeta) -> sympy.Expr:
    """Product of all but the last dim: the M of a matmul over the last dim."""
    return sympy.Mul(*t.shape[:-1]) if len(t.shape) > 1 else sympy.Integer(1)


def broadcast(op: OpCall, a: tuple, b: tuple) -> tuple:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else sympy.Integer(1)
        y = b[-i] if i <= len(b) else sympy.Integer(1)
        if same(x, y) or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            op.fail(f"shapes do not broadcast: {list(a)} vs {list(b)}")
    return tuple(reversed(out))


# --------------------------------------------------------------------------- model leaf ops


@register_op(ops.embedding, "embedding")
def _embedding(op: OpCall) -> Cost:
    ids, table = op.tensor(0, "ids"), op.tensor(1, "weight")
    op.check(not ids.dtype.is_floating_point, f"ids must be integers, got {ids.dtype}")
    op.check(table.ndim == 2, f"embedding table must be 2-D, got {table}")
    out = TensorMeta(ids.shape + (table.shape[1],), table.dtype)
    return Cost(out, flops=0, reads={1: out.nbytes}, attrs={"vocab_size": table.shape[0], "hidden_size": table.shape[1]})


@register_op(ops.linear, "linear")
def _linear(op: OpCall) -> Cost:
    x, w, b = op.tensor(0, "x"), op.tensor(1, "weight"), op.tensor(2, "bias", optional=True)
    return linear_cost(op, x, w, b)


def linear_cost(op: OpCall, x: TensorMeta, w: TensorMeta, b: TensorMeta | None) -> Cost:
    """Shape/FLOPs of y = x W^T + b; shared by linear and fused linears."""
    op.check(w.ndim == 2, f"weight must be 2-D [out, in], got {w}")
    op.check(same(x.shape[-1], w.shape[1]), f"input features {x.shape[-1]} != weight in-features {w.shape[1]} (x {x}, W {w})")
    op.check(x.dtype == w.dtype, f"activation dtype {x.dtype} != weight dtype {w.dtype}")
    if b is not None:
        op.check(b.ndim == 1 and same(b.shape[0], w.shape[0]), f"bias {b} does not match weight {w}")
    out = TensorMeta(x.shape[:-1] + (w.shape[0],), x.dtype)
    m, k, n = rows(x), w.shape[1], w.shape[0]
    flops = 2 * m * k * n + (m * n if b is not None else 0)
    return Cost(out, flops=flops, attrs={"in_features": k, "out_features": n, "bias": b is not None})


@register_op(ops.rms_norm, "rms_norm")
def _rms_norm(op: OpCall) -> Cost:
    x, w = op.tensor(0, "x"), op.tensor(1, "weight")
    eps = op.arg(2, "eps")
    op.check(w.ndim == 1 and same(w.shape[0], x.shape[-1]), f"norm weight {w} does not match last dim of {x}")
    out = TensorMeta(x.shape, torch.promote_types(w.dtype, x.dtype))
    return Cost(out, flops=4 * x.numel, attrs={"eps": float(eps)})


@register_op(ops.silu_mul, "silu_mul")
def _silu_mul(op: OpCall) -> Cost:
    g, u = op.tensor(0, "gate"), op.tensor(1, "up")
    op.check(g.same_as(u) or (len(g.shape) == len(u.shape) and all(same(a, b) for a, b in zip(g.shape, u.shape))),
             f"gate {g} and up {u} differ")
    out = TensorMeta(g.shape, torch.promote_types(g.dtype, u.dtype))
    return Cost(out, flops=5 * g.numel)


@register_op(ops.rope_tables, "rope_tables")
def _rope_tables(op: OpCall) -> Cost:
    pos, inv, like = op.tensor(0, "positions"), op.tensor(1, "inv_freq"), op.tensor(2, "dtype_like")
    op.check(not pos.dtype.is_floating_point, f"positions must be integers, got {pos.dtype}")
    op.check(inv.ndim == 1, f"inv_freq must be 1-D, got {inv}")
    table = TensorMeta(pos.shape + (2 * inv.shape[0],), like.dtype)
    # dtype_like contributes only its dtype: nothing of it is read.
    return Cost((table, table), flops=3 * table.numel, reads={2: ZERO}, attrs={"head_dim": 2 * inv.shape[0]})


@register_op(ops.rope, "rope")
def _rope(op: OpCall) -> Cost:
    x, cos, sin = op.tensor(0, "x"), op.tensor(1, "cos"), op.tensor(2, "sin")
    op.check(x.ndim == 4, f"rope input must be [B, T, H, D], got {x}")
    want = (x.shape[0], x.shape[1], x.shape[3])
    for name, t in (("cos", cos), ("sin", sin)):
        op.check(t.ndim == 3 and all(same(a, b) for a, b in zip(t.shape, want)),
                 f"{name} {t} does not match x {x} (want [{', '.join(map(str, want))}])")
    out = TensorMeta(x.shape, torch.promote_types(x.dtype, cos.dtype))
    return Cost(out, flops=3 * x.numel)


def attention_cost(op: OpCall, q: TensorMeta, k: TensorMeta, v: TensorMeta, ck: TensorMeta, cv: TensorMeta,
                   cache_len: TensorMeta, mask_kind, scale, cache_args: tuple[int, int] = (3, 4),
                   tree_mask: TensorMeta | None = None, tree_arg: int | None = None) -> Cost:
    """Checks and cost of attention over a static KV cache (shared by attention and fused forms):
    reads C + Qk cache positions, writes Qk; ``cache_args`` are the cache arguments' positions.
    Mask kind "tree" takes ``tree_mask`` [B, Q, Q] (argument ``tree_arg``), read once."""
    op.check(mask_kind in ops.MASK_KINDS, f"unknown mask kind {mask_kind!r} (known: {ops.MASK_KINDS})")
    op.check((mask_kind == "tree") == (tree_mask is not None),
             f"mask kind {mask_kind!r} with{'out' if tree_mask is None else ''} a tree_mask "
             "(the tree kind needs one, the others take none)")
    op.check(q.ndim == 4 and k.ndim == 4 and v.ndim == 4, f"q/k/v must be [B, T, H, D]: q {q}, k {k}, v {v}")
    bsz, nq, hq, d = q.shape
    _, nk, hkv, _ = k.shape
    op.check(all(same(a, b) for a, b in zip(k.shape, v.shape)), f"k {k} and v {v} differ")
    op.check(same(k.shape[0], bsz) and same(k.shape[3], d), f"k {k} does not match q {q}")
    op.check(ck.ndim == 4 and same(ck.shape[1], hkv) and same(ck.shape[3], d),
             f"cache {ck} does not hold [*, {hkv}, *, {d}] keys")
    op.check(cv.ndim == 4 and all(same(a, b) for a, b in zip(ck.shape, cv.shape)), f"caches differ: {ck} vs {cv}")
    op.check(isinstance(hq, sympy.Integer) and isinstance(hkv, sympy.Integer) and int(hq) % int(hkv) == 0,
             f"query heads {hq} not a multiple of kv heads {hkv}")
    op.check(cache_len.ndim == 1 and same(cache_len.shape[0], bsz), f"cache_len {cache_len} should be [{bsz}]")
    if cache_len.value is None:
        op.fail("cache_len has no symbolic value: it must come from the step's cache_len input (value C)")
    if mask_kind in ("causal", "tree"):
        op.check(same(nq, nk), f"{mask_kind} attention needs as many keys as queries ({nk} vs {nq})")
    reads_extra = {}
    if tree_mask is not None:
        op.check(tree_mask.ndim in (2, 3) and all(same(a, b) for a, b in zip(tree_mask.shape[-2:], (nq, nq)))
                 and (tree_mask.ndim == 2 or same(tree_mask.shape[0], bsz)),
                 f"tree_mask {tree_mask} should be [{bsz}, {nq}, {nq}] or [{nq}, {nq}]")
        reads_extra = {tree_arg: tree_mask.numel * tree_mask.itemsize}
    kv_len = cache_len.value + nk
    cache_positions = bsz * hkv * d * ck.itemsize
    out = TensorMeta((bsz, nq, hq * d), q.dtype)
    ik, iv = cache_args
    return Cost(
        out,
        flops=4 * bsz * hq * nq * kv_len * d,
        reads={ik: cache_positions * kv_len, iv: cache_positions * kv_len, **reads_extra},
        cache_writes={ik: cache_positions * nk, iv: cache_positions * nk},
        attrs={"mask_kind": mask_kind, "scale": float(scale), "num_heads": int(hq), "num_kv_heads": int(hkv),
               "head_dim": int(d), "kv_len": kv_len},
    )


@register_op(ops.attention, "attention", impure=True, cache_args=(3, 4))
def _attention(op: OpCall) -> Cost:
    return attention_cost(op, op.tensor(0, "q"), op.tensor(1, "k"), op.tensor(2, "v"), op.tensor(3, "cache_k"),
                          op.tensor(4, "cache_v"), op.tensor(5, "cache_len"), op.arg(6, "mask_kind"),
                          op.arg(7, "scale"), tree_mask=op.tensor(8, "tree_mask", optional=True), tree_arg=8)


@register_op(ops.ragged_attention, "ragged_attention", impure=True, cache_args=(3, 4))
def _ragged_attention(op: OpCall) -> Cost:
    """Packed rows (a ragged verify): T tokens of R rows, each row over its own cache slot.

    With n = T / R tokens per row on average and C cached per row (``cache_len``'s value), row r
    reads its C + n cached and new positions once and writes n; query token j of a row scores
    C + j + 1 keys, so the two matmuls count 4 * Hq * D * (T * C + T * (T / R + 1) / 2).
    (Messages are built only on failure: this rule runs for every layer on every refresh.)"""
    q, k, v = op.tensor(0, "q"), op.tensor(1, "k"), op.tensor(2, "v")
    ck, cv, cache_len = op.tensor(3, "cache_k"), op.tensor(4, "cache_v"), op.tensor(5, "cache_len")
    slots, starts = op.tensor(6, "row_slots"), op.tensor(7, "row_starts")
    scale = op.arg(8, "scale")
    if not (q.ndim == 4 and k.ndim == 4 and v.ndim == 4):
        op.fail(f"q/k/v must be [1, T, H, D]: q {q}, k {k}, v {v}")
    one, total, hq, d = q.shape
    _, nk, hkv, _ = k.shape
    if one != 1:
        op.fail(f"a packed block has one row of tokens: q {q} should be [1, T, Hq, D]")
    if not (k.same_as(v) or all(same(a, b) for a, b in zip(k.shape, v.shape))):
        op.fail(f"k {k} and v {v} differ")
    if not (k.shape[0] == 1 and same(nk, total) and same(k.shape[3], d)):
        op.fail(f"k {k} does not match q {q}")
    if not (ck.ndim == 4 and same(ck.shape[1], hkv) and same(ck.shape[3], d)):
        op.fail(f"cache {ck} does not hold [*, {hkv}, *, {d}] keys")
    if not (cv.ndim == 4 and all(same(a, b) for a, b in zip(ck.shape, cv.shape))):
        op.fail(f"caches differ: {ck} vs {cv}")
    if not (isinstance(hq, sympy.Integer) and isinstance(hkv, sympy.Integer) and int(hq) % int(hkv) == 0):
        op.fail(f"query heads {hq} not a multiple of kv heads {hkv}")
    for name, t in (("row_slots", slots), ("cache_len", cache_len)):
        if not (t.ndim == 1 and not t.dtype.is_floating_point):
            op.fail(f"{name} {t} should be [R] integers")
    rows = slots.shape[0]
    if not same(cache_len.shape[0], rows):
        op.fail(f"cache_len {cache_len} should be [{rows}] (one per row)")
    if not (starts.ndim == 1 and same(starts.shape[0], rows + 1) and not starts.dtype.is_floating_point):
        op.fail(f"row_starts {starts} should be [{rows + 1}] integers")
    if cache_len.value is None:
        op.fail("cache_len has no symbolic value: it must come from the step's cache_len input (value C)")
    ctx = cache_len.value
    position = hkv * d * ck.itemsize  # one cache position of one row, all KV heads
    read_positions = rows * ctx + total
    return Cost(
        TensorMeta((1, total, hq * d), q.dtype),
        flops=4 * hq * d * (total * ctx + total * (total / rows + 1) / 2),
        reads={3: position * read_positions, 4: position * read_positions,
               6: slots.numel * slots.itemsize, 7: starts.numel * starts.itemsize},
        cache_writes={3: position * total, 4: position * total},
        attrs={"mask_kind": "causal", "scale": float(scale), "num_heads": int(hq), "num_kv_heads": int(hkv),
               "head_dim": int(d), "kv_len": ctx + total / rows},
    )


# --------------------------------------------------------------------------- glue


def _is_size(value) -> bool:
    return isinstance(value, (int, sympy.Expr)) and not isinstance(value, bool)


def _binary(kind: str, fn):
    def rule(op: OpCall) -> Cost:
        a, b = op.arg(0), op.arg(1)
        if _is_size(a) and _is_size(b):
            return Cost(sym(fn(sym(a), sym(b))), kind="sym")
        ta = a if isinstance(a, TensorMeta) else None
        tb = b if isinstance(b, TensorMeta) else None
        if ta is None and tb is None:
            op.fail(f"unsupported operands {value_str(a)}, {value_str(b)}")
        if ta is not None and tb is not None:
            shape = broadcast(op, ta.shape, tb.shape)
            dtype = torch.promote_types(ta.dtype, tb.dtype)
        else:
            t = ta or tb
            shape, dtype = t.shape, t.dtype
        out = TensorMeta(shape, dtype)
        return Cost(out, flops=out.numel)

    return rule


register_op(operator.add, "add")(_binary("add", operator.add))
register_op(operator.mul, "mul")(_binary("mul", operator.mul))


def _sym_rule(fn):
    def rule(op: OpCall) -> Cost:
        values = [op.arg(i) for i in range(len(op.args))]
        if not all(_is_size(v) for v in values):
            op.fail(f"integer arithmetic on non-sizes: {[value_str(v) for v in values]}")
        return Cost(sym(fn(*[sym(v) for v in values])))

    return rule


register_op(operator.neg, "sym", view=True)(_sym_rule(operator.neg))
register_op(operator.sub, "sym", view=True)(_sym_rule(operator.sub))
register_op(operator.floordiv, "sym", view=True)(_sym_rule(lambda a, b: sympy.floor(a / b)))


@register_op(builtins.getattr, "shape", view=True)
def _getattr(op: OpCall) -> Cost:
    t, attr = op.tensor(0), op.arg(1)
    op.check(attr == "shape", f"only .shape is supported on tensors, got .{attr}")
    return Cost(tuple(t.shape))


def _slice_len(op: OpCall, length, s: slice):
    op.check(s.step in (None, 1), f"slices with a step are not supported ({s})")

    def norm(v, default):
        if v is None:
            return default
        v = sym(v)
        if v.is_negative:
            return length + v
        return v

    start, stop = norm(s.start, sympy.Integer(0)), norm(s.stop, length)
    if stop.is_Integer and length.is_Integer and stop > length:  # python clamps
        stop = length
    size = sympy.expand(stop - start)
    op.check(not (size.is_number and size < 0), f"empty or negative slice {s} of a dim of size {length}")
    return size


def _index_tensor(op: OpCall, t: TensorMeta, index) -> TensorMeta:
    items = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in items):
        at = items.index(Ellipsis)
        fill = t.ndim - (len(items) - 1 - sum(1 for i in items if i is None))
        items = items[:at] + (slice(None),) * fill + items[at + 1:]
    shape, dim = [], 0
    for item in items:
        if item is None:
            shape.append(sympy.Integer(1))
            continue
        op.check(dim < t.ndim, f"too many indices for {t}")
        if isinstance(item, slice):
            shape.append(_slice_len(op, t.shape[dim], item))
        elif _is_size(item):
            pass  # integer index drops the dim
        else:
            op.fail(f"unsupported index {item!r}")
        dim += 1
    shape.extend(t.shape[dim:])
    return TensorMeta(tuple(shape), t.dtype)


@register_op(operator.getitem, "getitem", view=True)
def _getitem(op: OpCall) -> Cost:
    base, index = op.arg(0), op.arg(1)
    if isinstance(base, TensorMeta):
        return Cost(_index_tensor(op, base, index), kind="slice")
    if isinstance(base, (tuple, list)):
        op.check(isinstance(index, int), f"tuple index must be an int, got {index!r}")
        op.check(-len(base) <= index < len(base), f"index {index} out of range for {len(base)} values")
        item = base[index]
        return Cost(item, kind="size" if _is_size(item) else "getitem")
    op.fail(f"cannot index {value_str(base)}")


@register_op(torch.cat, "cat")
def _cat(op: OpCall) -> Cost:
    tensors, dim = op.arg(0, "tensors"), op.arg(1, "dim", 0)
    op.check(isinstance(tensors, (list, tuple)) and tensors and all(isinstance(t, TensorMeta) for t in tensors),
             "cat needs a list of tensors")
    first = tensors[0]
    nd = first.ndim
    d = dim % nd
    for t in tensors[1:]:
        op.check(t.ndim == nd and all(same(a, b) for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d),
                 f"cat inputs differ outside dim {dim}: {first} vs {t}")
    shape = list(first.shape)
    shape[d] = sympy.Add(*[t.shape[d] for t in tensors])
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return Cost(TensorMeta(tuple(shape), dtype), attrs={"dim": dim})


def _view_rule(op: OpCall) -> Cost:
    t = op.tensor(0)
    sizes = list(op.args[1:])
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = list(sizes[0])
    op.check(all(_is_size(s) for s in sizes), f"view sizes must be sizes, got {[value_str(s) for s in sizes]}")
    sizes = [sym(s) for s in sizes]
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    op.check(len(unknown) <= 1, "at most one -1 in a view")
    if unknown:
        known = sympy.Mul(*[s for i, s in enumerate(sizes) if i not in unknown])
        sizes[unknown[0]] = sympy.cancel(t.numel / known)
    op.check(same(sympy.Mul(*sizes), t.numel), f"view {sizes} has {sympy.Mul(*sizes)} elements, input {t} has {t.numel}")
    return Cost(TensorMeta(tuple(sizes), t.dtype))


register_op("view", "view", view=True)(_view_rule)
register_op("reshape", "view", view=True)(_view_rule)


@register_op(torch.split, "split", view=True)
def _split(op: OpCall) -> Cost:
    t, sections, dim = op.tensor(0), op.arg(1, "split_size_or_sections"), op.arg(2, "dim", 0)
    op.check(isinstance(sections, (list, tuple)), "split needs explicit section sizes")
    d = dim % t.ndim
    op.check(same(sympy.Add(*[sym(s) for s in sections]), t.shape[d]),
             f"sections {list(sections)} do not add up to dim {dim} of {t}")
    outs = []
    for s in sections:
        shape = list(t.shape)
        shape[d] = sym(s)
        outs.append(TensorMeta(tuple(shape), t.dtype))
    return Cost(tuple(outs), attrs={"dim": dim, "sections": [int(s) for s in sections]})
