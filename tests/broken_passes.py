"""A deliberately wrong pass (for tests): it flips the sign of the first linear's output."""

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
