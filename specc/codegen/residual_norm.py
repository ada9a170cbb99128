"""Residual-norm pairs: a linear_add whose sum feeds a norm_linear, both lowered to cuBLAS.

In a decoder layer the residual stream goes ``h = residual + linear(x)`` (the attention's output
projection, the MLP's down projection: ``linear_add``) and straight into ``linear(rms_norm(h))``
(the MLP's gate/up, the next layer's q/k/v or the LM head: ``norm_linear``). Where the Triton
kernels run (few rows) the add is the first GEMM's epilogue and the norm the second's prologue:
nothing to gain. Where both lower to cuBLAS (many rows: batched verification,
``codegen/linear_choice.py``) the add is a kernel of its own between the two GEMMs and the norm
another, which reads the sum back. Lowering then pairs the two nodes into one
``kernel_abi.linear_add_norm_linear`` call, at the linear_add's place, whose cuBLAS path runs GEMM -> rms_norm with the
residual fused (the kernel adds it as it loads the row and writes the sum too) -> GEMM: one kernel
and one pass over the sum fewer per pair, two pairs a layer. The sum is rounded before it is
normalised, as the separate ops round it: bit-identical. At row counts where either linear runs
its Triton kernel the pair runs the two calls it replaced.

The cost model prices the same pairs (:func:`norm_partner`, :func:`enabled`) so that it predicts
what lowering emits. ``SPECC_RESIDUAL_NORM=0`` turns the pairing off (at lowering and in the cost
model) for A/B timing.
"""

from __future__ import annotations

import torch.fx

from specc.switches import residual_norm_enabled as enabled  # SPECC_RESIDUAL_NORM, default on

__all__ = ["enabled", "hoist_weights", "norm_partner", "pair_of", "pairs"]


def _calls(node: torch.fx.Node, name: str) -> bool:
    """Whether ``node`` calls the op ``name`` (the IR's fused op or its kernel-ABI function: they
    share the name and signature)."""
    return node.op == "call_function" and getattr(node.target, "__name__", None) == name


def _input(node: torch.fx.Node):
    return node.args[0] if node.args else node.kwargs.get("x")


def norm_partner(add: torch.fx.Node) -> torch.fx.Node | None:
    """The norm_linear that normalises ``add``'s sum (a linear_add node), when the two can pair:
    exactly one norm_linear takes the sum as its input and nothing else of it, and its other
    inputs are weights, graph inputs or constants (so the paired call can stand where the
    linear_add stood, with the norm's weights fetched before it: :func:`hoist_weights`). Other
    users of the sum (the next residual add, a shape read) take the pair's sum. None otherwise."""
    if not _calls(add, "linear_add"):
        return None
    norms = [u for u in add.users if _calls(u, "norm_linear") and _input(u) is add]
    if len(norms) != 1:
        return None
    norm = norms[0]
    rest = list(norm.args[1:]) + [v for k, v in norm.kwargs.items() if k != "x"]
    if any(isinstance(a, torch.fx.Node) and (a is add or a.op not in ("get_attr", "placeholder")) for a in rest):
        return None
    return norm


def pair_of(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """The (linear_add, norm_linear) pair ``node`` is either side of, or None."""
    if _calls(node, "linear_add"):
        norm = norm_partner(node)
        return None if norm is None else (node, norm)
    add = _input(node) if _calls(node, "norm_linear") else None
    if isinstance(add, torch.fx.Node) and norm_partner(add) is node:
        return add, node
    return None


def hoist_weights(add: torch.fx.Node, norm: torch.fx.Node) -> None:
    """Move the norm_linear's weight fetches (get_attr nodes) that come after ``add`` to just
    before it, so that a call at ``add``'s place can read them; fetches already before it stay
    (a tied weight's fetch serves earlier users too)."""
    between = set()
    node = add.next
    while node is not norm and node.op != "root":
        between.add(node)
        node = node.next
    for a in list(norm.args[1:]) + list(norm.kwargs.values()):
        if isinstance(a, torch.fx.Node) and a.op == "get_attr" and a in between:
            add.prepend(a)


def pairs(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """Every (linear_add, norm_linear) pair of ``graph`` (:func:`norm_partner`), in graph order."""
    return [(node, norm) for node in graph.nodes if (norm := norm_partner(node)) is not None]
