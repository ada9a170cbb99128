"""Per-node metadata: what every consumer of the IR reads instead of running the graph.

``node.meta["specc"]`` holds a :class:`NodeMeta` on every node of an :class:`~specc.ir.IR`.
It is *derived*: op rules (``specc.ir.rules``) compute it from the node's inputs, so a pass
never edits it by hand, it calls ``ir.refresh()`` after rewriting and ``ir.lint()`` checks that
what is stored equals what the rules give. Two facts are not derivable and live in plain
``node.meta`` keys set by the tracer or a pass: ``specc_scope`` (the module path the node came
from, e.g. ``layers.3.self_attn.q_proj``) and ``specc_group`` (a region tag such as
``dflash_context``).

Costs are the bytes an unfused eager implementation moves for that node alone (inputs read
from memory, outputs written) and the arithmetic it does; fusions show up as nodes that read
and write less. Bytes are split by where they live because deployments price them differently
and because the 12-bit format changes only weight bytes:

- ``weight_bytes``: parameters read (their storage dtype; bf16 = 2 bytes per weight),
- ``cache_read`` / ``cache_written``: KV cache traffic (attention reads C + new positions and
  writes the new positions in place),
- the rest of ``bytes_read`` / ``bytes_written``: activations and small constant buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from specc.ir.symbols import ZERO, fmt_shape, same, sym

# node.meta keys: the NodeMeta, the module path a node came from, a region tag
META_KEY = "specc"
SCOPE_KEY = "specc_scope"
GROUP_KEY = "specc_group"


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """Shape (sympy expressions in B, Q, C, N or integers) and dtype of a tensor value.

    ``value`` is set for integer tensors whose every element is known symbolically: the
    ``cache_len`` input is a [B] tensor whose value is C, which is how attention knows how many
    cached positions it reads.
    """

    shape: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    value: sympy.Expr | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(sym(d) for d in self.shape))

    @property
    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape) if self.shape else sympy.Integer(1)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> sympy.Expr:
        return self.numel * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{fmt_shape(self.shape)} {dtype_name(self.dtype)}"

    def same_as(self, other: "TensorMeta") -> bool:
        return (
            isinstance(other, TensorMeta)
            and self.dtype == other.dtype
            and len(self.shape) == len(other.shape)
            and all(same(a, b) for a, b in zip(self.shape, other.shape))
        )


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype).replace("torch.", ""))


def tensors_in(value: Any) -> list[TensorMeta]:
    """Every TensorMeta inside a (possibly nested) output value."""
    if isinstance(value, TensorMeta):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def value_str(value: Any) -> str:
    if isinstance(value, TensorMeta):
        return str(value)
    if isinstance(value, (tuple, list)):
        inner = ", ".join(value_str(v) for v in value)
        return f"({inner})"
    if isinstance(value, sympy.Basic):
        return sympy.sstr(value)
    return repr(value)


def values_same(a: Any, b: Any) -> bool:
    if isinstance(a, TensorMeta):
        return a.same_as(b) and ((a.value is None) == (b.value is None)) and (a.value is None or same(a.value, b.value))
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(values_same(x, y) for x, y in zip(a, b))
    if isinstance(a, sympy.Basic) or isinstance(b, sympy.Basic):
        try:
            return same(a, b)
        except TypeError:
            return False
    return a == b


@dataclasses.dataclass
class NodeMeta:
    """What a node is, what it produces and what it costs; see the module docstring.

    kind:    op kind ("linear", "attention", "rms_norm", ..., "weight", "input", "view", ...);
             the list with meanings is ``specc.ir.rules.KINDS`` and docs/ir.md.
    out:     TensorMeta, a tuple of them (rope_tables, split), a sympy expression (sizes), or
             a plain constant.
    weights: qualified parameter names this node reads (``layers.0.mlp.up_proj.weight``).
    attrs:   op parameters codegen needs that are not tensors (mask_kind, eps, features...).
    """

    kind: str
    out: Any
    flops: sympy.Expr = ZERO
    bytes_read: sympy.Expr = ZERO
    bytes_written: sympy.Expr = ZERO
    weight_bytes: sympy.Expr = ZERO
    cache_read: sympy.Expr = ZERO
    cache_written: sympy.Expr = ZERO
    weights: tuple[str, ...] = ()
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    scope: str = ""
    group: str | None = None

    COST_FIELDS = ("flops", "bytes_read", "bytes_written", "weight_bytes", "cache_read", "cache_written")

    @property
    def tensor(self) -> TensorMeta:
        if not isinstance(self.out, TensorMeta):
            raise TypeError(f"{self.kind} node does not produce a single tensor (out = {value_str(self.out)})")
        return self.out

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        return self.tensor.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def bytes(self) -> sympy.Expr:
        """Total bytes moved: read + written."""
        return self.bytes_read + self.bytes_written

    @property
    def activation_read(self) -> sympy.Expr:
        return self.bytes_read - self.weight_bytes - self.cache_read

    @property
    def activation_written(self) -> sympy.Expr:
        return self.bytes_written - self.cache_written

    def differences(self, other: "NodeMeta") -> list[str]:
        """Human-readable differences to ``other`` (empty when equivalent)."""
        diffs = []
        if self.kind != other.kind:
            diffs.append(f"kind {self.kind} != {other.kind}")
        if not values_same(self.out, other.out):
            diffs.append(f"output {value_str(self.out)} != {value_str(other.out)}")
        for f in self.COST_FIELDS:
            if not same(getattr(self, f), getattr(other, f)):
                diffs.append(f"{f} {getattr(self, f)} != {getattr(other, f)}")
        if tuple(self.weights) != tuple(other.weights):
            diffs.append(f"weights {self.weights} != {other.weights}")
        if self.attrs != other.attrs:
            diffs.append(f"attrs {self.attrs} != {other.attrs}")
        return diffs
