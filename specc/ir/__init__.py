"""specc's IR: torch.fx graphs of step functions with per-node metadata.

Public API (docs/ir.md has the long form):

    ir = specc.ir.trace(model, "verify")      # IR of one step (prefill | ar | draft | verify)
    ir.meta(node)                             # NodeMeta: kind, out shapes/dtypes, bytes, FLOPs, weights
    ir.totals()                               # per-step sums as sympy expressions in B, Q, C (N)
    ir.lint()                                 # invariants every pass keeps
    ir.refresh()                              # re-derive metadata after rewriting the graph
    ir(*inputs)                               # run the GraphModule eagerly
    ir.text() / ir.to_dict(values)            # printing (the CLI: `specc ir`)
    specc.ir.meta_model(config)               # a model from config.json on the meta device
    specc.ir.register_op(fn, kind)            # shape/cost rule for a new op (user passes)
"""

from specc.ir import fused  # noqa: F401  (registers the rules of pass-introduced ops)
from specc.ir import gdn_rules  # noqa: F401  (registers the rules of the hybrid targets' ops)
from specc.ir.errors import IRError, LintError, ShapeError
from specc.ir.ir import GROUP_KEY, META_KEY, SCOPE_KEY, IR, InputSpec, Totals
from specc.ir.lint import problems as lint_problems
from specc.ir.meta import NodeMeta, TensorMeta
from specc.ir.rules import KINDS, STRUCTURAL_KINDS, Cost, OpCall, OpDef, linear_cost, op_def, op_of_kind, register_op
from specc.ir.symbols import SYMBOLS, B, C, N, Q, evaluate, fmt_bytes, fmt_expr, fmt_flops, fmt_rate
from specc.ir.trace import STEPS, bind_dflash, meta_model, parse_dtype, trace

__all__ = [
    "B", "C", "Cost", "GROUP_KEY", "IR", "IRError", "InputSpec", "KINDS", "LintError", "META_KEY", "N", "NodeMeta",
    "OpCall", "OpDef", "Q", "SCOPE_KEY", "STEPS", "STRUCTURAL_KINDS", "SYMBOLS", "ShapeError", "TensorMeta", "Totals",
    "bind_dflash", "evaluate", "fmt_bytes", "fmt_expr", "fmt_flops", "fmt_rate", "linear_cost", "lint_problems",
    "meta_model", "op_def", "op_of_kind", "parse_dtype", "register_op", "trace",
]
