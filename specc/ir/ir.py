"""The IR object: a traced step function (a torch.fx GraphModule) plus what it means.

Why a thin wrapper and not a new graph format: torch.fx already gives a mutable graph with a
Python code generator, so a rewritten graph still runs eagerly on CPU (which is how every pass
is proven lossless). What fx lacks is meaning; the wrapper adds it:

- which step it is and the symbolic shapes of its inputs (``inputs``),
- ``node.meta["specc"]``: a :class:`~specc.ir.meta.NodeMeta` on every node (kind, shapes,
  bytes, FLOPs, weights), derived by op rules and kept fresh with :meth:`IR.refresh`,
- invariants (:meth:`IR.lint`), totals, text/JSON printing, and the few mutation helpers passes
  need (:meth:`add_weight`, :meth:`remove_dead`).

The GraphModule shares its parameters and KV cache tensors with the model it was traced from
(no copies; a model on the ``meta`` device gives an IR that can be analysed but not run). Passes
that create weights (fused copies) register them on the GraphModule only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import sympy
import torch
import torch.fx
from torch import nn

from specc.ir.errors import IRError
from specc.ir.lint import lint as _lint
from specc.ir.meta import GROUP_KEY, META_KEY, SCOPE_KEY, NodeMeta, TensorMeta, dtype_name, tensors_in
from specc.ir.render import _arg_str, _json_value, _out_json, _target_name, node_line
from specc.ir.rules import STRUCTURAL_KINDS, OpCall, op_def
from specc.ir.symbols import SYMBOL_DOC, SYMBOLS, ZERO, bind, evaluate, fmt_expr


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One step input: name, symbolic shape/dtype, and its role (how example inputs are made)."""

    name: str
    meta: TensorMeta
    role: str  # token_ids | positions | cache_len | hidden | tree_mask | row_slots | row_starts
    doc: str = ""


@dataclasses.dataclass
class Totals:
    """Per-step sums of node costs, as sympy expressions in B, Q, C (N)."""

    weight_bytes: sympy.Expr
    cache_read: sympy.Expr
    cache_written: sympy.Expr
    activation_read: sympy.Expr
    activation_written: sympy.Expr
    flops: sympy.Expr

    @property
    def bytes_read(self) -> sympy.Expr:
        return self.weight_bytes + self.cache_read + self.activation_read

    @property
    def bytes_written(self) -> sympy.Expr:
        return self.cache_written + self.activation_written

    @property
    def bytes(self) -> sympy.Expr:
        return self.bytes_read + self.bytes_written

    ROWS = (
        ("weight_bytes", "weights read"),
        ("cache_read", "KV cache read"),
        ("cache_written", "KV cache written"),
        ("activation_read", "activations read"),
        ("activation_written", "activations written"),
        ("bytes", "total bytes moved"),
        ("flops", "FLOPs"),
    )

    def items(self) -> list[tuple[str, str, sympy.Expr]]:
        return [(key, label, sympy.expand(getattr(self, key))) for key, label in self.ROWS]

    def evaluate(self, values: Mapping[Any, int]) -> dict[str, int | float]:
        return {key: evaluate(expr, values) for key, _, expr in self.items()}


class IR:
    """A step function as a GraphModule with specc metadata on every node.

    Build one with :func:`specc.ir.trace`. Attributes:
      gm:       the torch.fx GraphModule; ``ir(*inputs)`` runs it.
      step:     "prefill" | "ar" | "draft" | "verify".
      inputs:   list of :class:`InputSpec` (placeholder order).
      model_kind: "causal_lm" (targets, PARD and AR drafters) or "dflash".
      title:    a short description for printing ("qwen3 target, 36 layers").
      defaults: symbol -> value used when printing evaluated costs without explicit values.
    """

    def __init__(self, gm: torch.fx.GraphModule, step: str, inputs: Iterable[InputSpec], *,
                 model_kind: str, title: str = "", defaults: Mapping[Any, int] | None = None):
        self.gm = gm
        self.step = step
        self.inputs = list(inputs)
        self.model_kind = model_kind
        self.title = title
        self.defaults = bind(defaults)

    # ------------------------------------------------------------------ access

    @property
    def graph(self) -> torch.fx.Graph:
        return self.gm.graph

    @property
    def nodes(self) -> list[torch.fx.Node]:
        return list(self.gm.graph.nodes)

    @property
    def symbols(self) -> list[sympy.Symbol]:
        """The symbols this step's costs depend on, in B, Q, C, N order."""
        free = set()
        for spec in self.inputs:
            for d in spec.meta.shape:
                free |= d.free_symbols
            if spec.meta.value is not None:
                free |= spec.meta.value.free_symbols
        return [s for s in SYMBOLS.values() if s in free]

    def meta(self, node: torch.fx.Node | str) -> NodeMeta:
        node = self.node(node) if isinstance(node, str) else node
        m = node.meta.get(META_KEY)
        if not isinstance(m, NodeMeta):
            raise IRError(f"node %{node.name} has no specc metadata (call ir.refresh() after rewriting the graph)")
        return m

    def node(self, name: str) -> torch.fx.Node:
        for n in self.gm.graph.nodes:
            if n.name == name:
                return n
        raise IRError(f"no node named %{name}")

    def calls(self, kind: str | None = None) -> list[torch.fx.Node]:
        """Call nodes (optionally of one kind), in graph order."""
        out = []
        for n in self.gm.graph.nodes:
            if n.op in ("call_function", "call_method", "call_module"):
                if kind is None or self.meta(n).kind == kind:
                    out.append(n)
        return out

    def count(self, kind: str) -> int:
        return sum(1 for n in self.gm.graph.nodes if isinstance(n.meta.get(META_KEY), NodeMeta) and n.meta[META_KEY].kind == kind)

    def get_tensor(self, target: torch.fx.Node | str) -> Any:
        """The object a get_attr node (or qualified name) refers to on the GraphModule."""
        name = target.target if isinstance(target, torch.fx.Node) else target
        obj: Any = self.gm
        for part in name.split("."):
            if not hasattr(obj, part):
                raise IRError(f"the module has no attribute {name!r}")
            obj = getattr(obj, part)
        return obj

    def __call__(self, *args, **kwargs):
        return self.gm(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<specc IR {self.title or self.model_kind} step={self.step} nodes={len(self.gm.graph.nodes)}>"

    # ------------------------------------------------------------------ metadata

    def infer(self, node: torch.fx.Node, metas: Mapping[torch.fx.Node, NodeMeta] | None = None) -> NodeMeta:
        """Compute (not store) a node's metadata from its inputs' metadata."""
        def meta_of(n: torch.fx.Node) -> NodeMeta:
            if metas is not None and n in metas:
                return metas[n]
            return self.meta(n)

        scope, group = node.meta.get(SCOPE_KEY, ""), node.meta.get(GROUP_KEY)
        if node.op == "placeholder":
            spec = next((s for s in self.inputs if s.name == node.target), None)
            if spec is None:
                raise IRError(f"placeholder %{node.name} is not one of the step inputs {[s.name for s in self.inputs]}")
            return NodeMeta("input", spec.meta, attrs={"role": spec.role}, scope=scope, group=group)
        if node.op == "get_attr":
            obj = self.get_tensor(node)
            if isinstance(obj, torch.Tensor):
                if isinstance(obj, nn.Parameter):
                    kind = "weight"
                elif self._feeds_cache(node):
                    kind = "kv_cache"
                else:
                    kind = "buffer"
                return NodeMeta(kind, TensorMeta(tuple(obj.shape), obj.dtype), attrs={"target": node.target},
                                scope=scope, group=group)
            return NodeMeta("constant", obj, attrs={"target": node.target}, scope=scope, group=group)
        if node.op == "output":
            out = torch.fx.node.map_arg(node.args[0], lambda n: meta_of(n).out)
            return NodeMeta("output", out, scope=scope, group=group)
        od = op_def(node)
        if od is None:
            what = getattr(node.target, "__qualname__", None) or str(node.target)
            raise IRError(f"node %{node.name}: no IR rule for {node.op} {what}; register one with "
                          "specc.ir.register_op (see docs/writing-passes.md)")
        args = torch.fx.node.map_arg(node.args, lambda n: meta_of(n).out)
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: meta_of(n).out)
        cost = od.rule(OpCall(node, od.kind, args, kwargs))
        kind = cost.kind or od.kind
        if od.view or kind in STRUCTURAL_KINDS:
            return NodeMeta(kind, cost.out, attrs=dict(cost.attrs), scope=scope, group=group)

        weight_bytes = cache_read = other_read = ZERO
        weights: list[str] = []
        inputs = [(i, a) for i, a in enumerate(node.args)] + list(node.kwargs.items())
        for key, arg in inputs:
            arg_nodes = [arg] if isinstance(arg, torch.fx.Node) else _nodes_in(arg)
            for n in arg_nodes:
                m = meta_of(n)
                if not isinstance(m.out, TensorMeta):
                    continue
                nbytes = sympy.sympify(cost.reads[key]) if (key in cost.reads and isinstance(arg, torch.fx.Node)) else m.out.nbytes
                if m.kind == "weight":
                    weight_bytes += nbytes
                    if n.target not in weights:
                        weights.append(n.target)
                elif m.kind == "kv_cache":
                    cache_read += nbytes
                else:
                    other_read += nbytes
        cache_written = sympy.Add(*[sympy.sympify(v) for v in cost.cache_writes.values()]) if cost.cache_writes else ZERO
        written = sympy.sympify(cost.written) if cost.written is not None else sympy.Add(
            *[t.nbytes for t in tensors_in(cost.out)])
        return NodeMeta(
            kind, cost.out, flops=sympy.sympify(cost.flops),
            bytes_read=weight_bytes + cache_read + other_read, bytes_written=written + cache_written,
            weight_bytes=weight_bytes, cache_read=cache_read, cache_written=cache_written,
            weights=tuple(weights), attrs=dict(cost.attrs), scope=scope, group=group,
        )

    def refresh(self) -> "IR":
        """Recompute every node's metadata and regenerate the GraphModule's code; call after
        rewriting the graph. Raises :class:`~specc.ir.errors.ShapeError` naming the first node
        whose inputs do not fit (and then changes nothing)."""
        metas: dict[torch.fx.Node, NodeMeta] = {}
        for node in self.gm.graph.nodes:
            metas[node] = self.infer(node, metas)
        for node, m in metas.items():
            node.meta[META_KEY] = m
        self.gm.recompile()  # keep the generated forward in step with the graph
        return self

    def _feeds_cache(self, node: torch.fx.Node) -> bool:
        for user in node.users:
            od = op_def(user)
            if od is not None and any(i < len(user.args) and user.args[i] is node for i in od.cache_args):
                return True
        return False

    def is_impure(self, node: torch.fx.Node) -> bool:
        """Nodes that must stay even without users: outputs, inputs, ops writing caches."""
        if node.op in ("placeholder", "output"):
            return True
        od = op_def(node)
        return bool(od is not None and od.impure)

    # ------------------------------------------------------------------ costs

    def totals(self) -> Totals:
        """Sums over all nodes; evaluate with ``ir.totals().evaluate({"B": 1, "C": 1024})``."""
        parts: dict[str, list] = {k: [] for k in ("weight_bytes", "cache_read", "cache_written", "act_r", "act_w", "flops")}
        for node in self.gm.graph.nodes:
            m = self.meta(node)
            parts["weight_bytes"].append(m.weight_bytes)
            parts["cache_read"].append(m.cache_read)
            parts["cache_written"].append(m.cache_written)
            parts["act_r"].append(m.activation_read)
            parts["act_w"].append(m.activation_written)
            parts["flops"].append(m.flops)
        s = {k: sympy.expand(sympy.Add(*v)) for k, v in parts.items()}
        return Totals(s["weight_bytes"], s["cache_read"], s["cache_written"], s["act_r"], s["act_w"], s["flops"])

    def values(self, values: Mapping[Any, int] | None = None) -> dict[sympy.Symbol, sympy.Integer]:
        """Defaults for this step overridden by ``values`` ({"B": 4} or {B: 4})."""
        out = dict(self.defaults)
        out.update(bind(values))
        return {s: v for s, v in out.items() if s in self.symbols}

    def evaluate(self, expr, values: Mapping[Any, int] | None = None):
        return evaluate(expr, self.values(values))

    # ------------------------------------------------------------------ invariants

    def lint(self) -> "IR":
        """Check the invariants every pass must keep; raises LintError listing each problem."""
        _lint(self)
        return self

    # ------------------------------------------------------------------ mutation helpers

    def add_weight(self, qualname: str, tensor: torch.Tensor) -> str:
        """Register ``tensor`` as a (frozen) parameter of the GraphModule under ``qualname``
        (made unique if taken) and return the name actually used, for ``graph.get_attr``."""
        prefix, _, leaf = qualname.rpartition(".")
        mod: nn.Module = self.gm
        for part in prefix.split(".") if prefix else []:
            child = getattr(mod, part, None)
            if child is None:
                child = nn.Module()
                mod.add_module(part, child)
            elif not isinstance(child, nn.Module):
                raise IRError(f"cannot add weight {qualname!r}: {part!r} is not a module")
            mod = child
        base, i = leaf, 1
        while hasattr(mod, leaf):
            leaf = f"{base}_{i}"
            i += 1
        mod.register_parameter(leaf, nn.Parameter(tensor, requires_grad=False))
        return f"{prefix}.{leaf}" if prefix else leaf

    def remove_dead(self) -> int:
        """Erase nodes nobody uses (except inputs, outputs and cache-writing ops); returns the count."""
        removed = 0
        for node in reversed(list(self.gm.graph.nodes)):
            if not node.users and not self.is_impure(node):
                self.gm.graph.erase_node(node)
                removed += 1
        return removed

    def remove_unused_attributes(self) -> int:
        """Delete parameters/buffers no get_attr refers to (e.g. weights replaced by fused copies);
        returns the count. The model the IR was traced from keeps its own references."""
        used = {n.target for n in self.gm.graph.nodes if n.op == "get_attr"}
        used_prefixes = set()
        for t in used:
            parts = t.split(".")
            used_prefixes.update(".".join(parts[:i]) for i in range(1, len(parts)))
        removed = 0
        for name, _ in list(self.gm.named_parameters(remove_duplicate=False)) + list(self.gm.named_buffers(remove_duplicate=False)):
            if name in used:
                continue
            owner_name, _, leaf = name.rpartition(".")
            owner = self.gm.get_submodule(owner_name) if owner_name else self.gm
            if leaf in owner._parameters:
                del owner._parameters[leaf]
                removed += 1
            elif leaf in owner._buffers:
                del owner._buffers[leaf]
                removed += 1
        # drop submodules left empty
        for name, mod in sorted(self.gm.named_modules(), key=lambda kv: -kv[0].count(".")):
            if not name or name in used_prefixes:
                continue
            if not any(True for _ in mod.parameters()) and not any(True for _ in mod.buffers()) and not mod._modules:
                owner_name, _, leaf = name.rpartition(".")
                owner = self.gm.get_submodule(owner_name) if owner_name else self.gm
                delattr(owner, leaf)
        return removed

    def recompile(self) -> None:
        """Regenerate the GraphModule's Python code after graph edits (passes call this)."""
        self.gm.recompile()

    # ------------------------------------------------------------------ running

    def cache_tensors(self) -> list[torch.Tensor]:
        return [self.get_tensor(n) for n in self.gm.graph.nodes
                if n.op == "get_attr" and isinstance(n.meta.get(META_KEY), NodeMeta) and n.meta[META_KEY].kind == "kv_cache"]

    def reset_caches(self) -> None:
        """Zero the KV caches the step writes (shared with the traced model)."""
        with torch.no_grad():
            for t in self.cache_tensors():
                t.zero_()

    def example_inputs(self, values: Mapping[Any, int] | None = None, *, seed: int = 0,
                       vocab_size: int | None = None) -> tuple[torch.Tensor, ...]:
        """Inputs for one step at concrete sizes: random token ids, positions C, C + 1, ...,
        cache_len = C, random hidden states. Sizes default to ``ir.defaults``."""
        vals = self.values(values)
        param = next(iter(self.gm.parameters()), None)
        device = param.device if param is not None else torch.device("cpu")
        if vocab_size is None:
            emb = [n for n in self.gm.graph.nodes if isinstance(n.meta.get(META_KEY), NodeMeta) and n.meta[META_KEY].kind == "embedding"]
            vocab_size = int(self.meta(emb[0]).attrs["vocab_size"]) if emb else 2
        gen = torch.Generator().manual_seed(seed)
        c = int(vals.get(SYMBOLS["C"], 0))
        pos = next((s for s in self.inputs if s.role == "positions"), None)
        caches = self.cache_tensors()
        ragged = next((s for s in self.inputs if s.role == "row_starts"), None)
        starts = None
        if ragged is not None:  # a packed block: R rows of about T / R tokens each, in slots 0..R-1
            num_rows = int(evaluate(ragged.meta.shape[0], vals)) - 1
            total = int(evaluate(pos.meta.shape[-1], vals))
            starts = (torch.arange(num_rows + 1) * total) // max(num_rows, 1)
        if pos is not None and caches:
            new = int(evaluate(pos.meta.shape[-1], vals)) if starts is None else int((starts[1:] - starts[:-1]).max())
            need, have = c + new, min(int(t.shape[2]) for t in caches)
            if need > have:
                raise IRError(f"C + new positions = {need} exceed the KV cache length {have}: pass smaller "
                              f"values (e.g. {{'C': 0}}) or call setup_caches with a larger max_len before tracing")
        out = []
        for spec in self.inputs:
            shape = [int(evaluate(d, vals)) for d in spec.meta.shape]
            if spec.role == "token_ids":
                t = torch.randint(0, vocab_size, shape, generator=gen)
            elif spec.role == "positions" and starts is not None:
                token = torch.arange(shape[-1])
                t = (c + token - starts[torch.searchsorted(starts, token, right=True) - 1])[None]
            elif spec.role == "positions":
                t = (c + torch.arange(shape[-1]))[None].expand(shape[0], -1).contiguous()
            elif spec.role == "row_slots":
                t = torch.arange(shape[0])
            elif spec.role == "row_starts":
                t = starts
            elif spec.role == "cache_len":
                t = torch.full(shape, c, dtype=torch.long)
            elif spec.role == "tree_mask":  # a chain-shaped tree: node i's ancestors are 0..i
                t = torch.ones(shape[-2:], dtype=torch.bool).tril().expand(shape).contiguous()
            else:
                t = torch.randn(shape, generator=gen, dtype=torch.float32).to(spec.meta.dtype)
            out.append(t.to(device=device, dtype=spec.meta.dtype))
        return tuple(out)

    # ------------------------------------------------------------------ printing

    def header(self) -> str:
        syms = ", ".join(f"{s} = {SYMBOL_DOC[str(s)]}" for s in self.symbols)
        return f"{self.title or self.model_kind}, step {self.step}  ({syms})"

    def text(self) -> str:
        """The IR as plain text, one line per node, costs as formulas (what ``dump_ir`` writes)."""
        lines = [f"# specc IR: {self.header()}"]
        for spec in self.inputs:
            extra = f" = {spec.meta.value}" if spec.meta.value is not None else ""
            lines.append(f"#   input {spec.name}: {spec.meta}{extra}  ({spec.doc})")
        for node in self.gm.graph.nodes:
            lines.append(node_line(self, node))
        t = self.totals()
        lines.append("# totals:")
        for _, label, expr in t.items():
            lines.append(f"#   {label}: {fmt_expr(expr)}")
        return "\n".join(lines) + "\n"

    def to_dict(self, values: Mapping[Any, int] | None = None) -> dict[str, Any]:
        """JSON-ready description: nodes with formulas and values at ``values``, and totals."""
        vals = self.values(values)
        nodes = []
        for node in self.gm.graph.nodes:
            m = self.meta(node)
            entry: dict[str, Any] = {
                "name": node.name, "op": node.op, "kind": m.kind, "target": _target_name(node),
                "args": [_arg_str(a) for a in node.args] + [f"{k}={_arg_str(v)}" for k, v in node.kwargs.items()],
                "out": _out_json(m.out), "scope": m.scope, "group": m.group, "weights": list(m.weights),
                "attrs": {k: _json_value(v) for k, v in m.attrs.items()},
            }
            for f in NodeMeta.COST_FIELDS:
                expr = getattr(m, f)
                entry[f] = {"formula": fmt_expr(expr), "value": _json_value(evaluate(expr, vals))}
            nodes.append(entry)
        t = self.totals()
        return {
            "title": self.title, "step": self.step, "model_kind": self.model_kind,
            "symbols": {str(s): SYMBOL_DOC[str(s)] for s in self.symbols},
            "values": {str(s): int(v) for s, v in vals.items()},
            "inputs": [{"name": s.name, "shape": [str(d) for d in s.meta.shape], "dtype": dtype_name(s.meta.dtype),
                        "role": s.role, "doc": s.doc} for s in self.inputs],
            "nodes": nodes,
            "totals": {key: {"label": label, "formula": fmt_expr(expr), "value": _json_value(evaluate(expr, vals))}
                       for key, label, expr in t.items()},
        }


def _nodes_in(arg: Any) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(arg, lambda n: found.append(n))
    return found


__all__ = ["IR", "InputSpec", "Totals", "META_KEY", "SCOPE_KEY", "GROUP_KEY", "node_line"]
