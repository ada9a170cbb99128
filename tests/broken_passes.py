"""Deliberately wrong passes (for tests): the compiler, the search and the LLM proposer must
reject them by token forcing."""

import operator

from specc.passes import Pass, PassContext, PassResult


class FlipFirstLinear(Pass):
    """Negate the output of the first linear (breaks the model on purpose)."""

    name = "flip_first_linear"

    def run(self, ir, ctx: PassContext) -> PassResult:
        node = next(iter(ir.calls("linear")), None) or next(iter(ir.calls("norm_linear")))
        with ir.graph.inserting_after(node):
            neg = ir.graph.call_function(operator.mul, (node, -1.0))
        node.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
        ir.refresh()
        return PassResult(True, {"flipped": 1})


def negate_logits_source(name: str) -> str:
    """Source of a broken pass that negates the LM head's output (the argmax becomes the argmin),
    as a user or an LLM would hand it in: a module text, registered under ``name``."""
    return f'''
import operator

from specc.passes import Pass, PassResult


class NegateLogits(Pass):
    """Broken on purpose: negates the LM head's output (the argmax becomes the argmin)."""

    name = "{name}"

    def run(self, ir, ctx):
        node = next(n for n in ir.calls() if ir.meta(n).scope == "lm_head")
        with ir.graph.inserting_after(node):
            neg = ir.graph.call_function(operator.mul, (node, -1.0))
        node.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
        ir.refresh()
        return PassResult(True, {{"negated": 1}})
'''
