"""IR invariants: what every pass must leave true. ``IR.lint()`` runs these; the pass manager runs
it after every pass when checking is on.

1. torch.fx's own ``graph.lint()`` (topological order, well-formed nodes, get_attr targets exist).
2. Step interface: the placeholders are exactly the step inputs, there is one output.
3. Every node carries ``node.meta["specc"]`` and it equals what the op rules derive from its
   inputs now (stale metadata after a rewrite is an error: call ``ir.refresh()``). Deriving it
   checks that shapes and dtypes agree along every edge (linear in-features, rope tables, ...).
4. Every weight a node says it reads is a parameter on the GraphModule.
5. No dead code: every node other than inputs, the output and cache-writing ops has a user.
"""

from __future__ import annotations


import torch
import torch.fx
from torch import nn

from specc.ir.errors import IRError, LintError
from specc.ir.meta import META_KEY, NodeMeta


def problems(ir) -> list[str]:
    """All invariant violations of ``ir``, each naming the node; empty when the IR is sound."""
    found: list[str] = []
    graph = ir.gm.graph
    try:
        graph.lint()
    except Exception as exc:  # fx raises RuntimeError with its own message
        found.append(f"graph: {exc}")

    placeholders = [n.target for n in graph.nodes if n.op == "placeholder"]
    expected = [s.name for s in ir.inputs]
    if placeholders != expected:
        found.append(f"graph: inputs are {placeholders}, the {ir.step} step takes {expected}")
    outputs = [n for n in graph.nodes if n.op == "output"]
    if len(outputs) != 1:
        found.append(f"graph: {len(outputs)} output nodes, expected 1")

    fresh: dict[torch.fx.Node, NodeMeta] = {}
    for node in graph.nodes:
        stored = node.meta.get(META_KEY)
        try:
            derived = ir.infer(node, fresh)
        except IRError as exc:
            found.append(str(exc) if f"%{node.name}" in str(exc) else f"%{node.name}: {exc}")
            if isinstance(stored, NodeMeta):
                fresh[node] = stored  # keep going with what the graph claims
                continue
            break  # nothing to propagate from: later nodes would only repeat this error
        fresh[node] = derived
        if not isinstance(stored, NodeMeta):
            found.append(f"%{node.name} ({derived.kind}): no specc metadata; call ir.refresh() after rewriting")
            continue
        diffs = stored.differences(derived)
        if diffs:
            found.append(f"%{node.name} ({stored.kind}): stale metadata, stored vs derived from inputs: "
                         + "; ".join(diffs[:3]) + " (call ir.refresh())")

    for node in graph.nodes:
        m = fresh.get(node)
        if m is None:
            continue
        for name in m.weights:
            try:
                obj = ir.get_tensor(name)
            except IRError:
                obj = None
            if not isinstance(obj, nn.Parameter):
                found.append(f"%{node.name} ({m.kind}): reads weight {name!r}, which is not a parameter of the module")
        if not node.users and not ir.is_impure(node):
            found.append(f"%{node.name} ({m.kind}): unused (dead code: erase it or run the dce pass)")
    return found


def lint(ir) -> None:
    """Raise :class:`LintError` listing every problem (see the module docstring)."""
    found = problems(ir)
    if found:
        raise LintError(found, title=f"IR lint failed ({ir.title or ir.model_kind}, step {ir.step})")
