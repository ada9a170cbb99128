"""Chain speculation with a small same-vocabulary causal LM as the drafter (k sequential forwards)."""

from __future__ import annotations

from specc.methods.base import DraftShape, Method
from specc.methods.registry import register_method


@register_method
class ARDraftMethod(Method):
    name = "ar-draft"
    description = "a small causal LM drafts k tokens one forward at a time; the target verifies the chain"
    drafter_kinds = ("causal_lm", "pard")
    default_for = ("causal_lm",)
    k_choices = (1, 2, 3, 4, 5, 6, 8)
    strategy = "ar-draft"

    def default_num_draft(self, drafter_raw):
        return 4

    def drafter_for(self, draft_step, pair):
        from specc.runtime.drafters import ARDraft

        return ARDraft(draft_step)

    def draft_shapes(self, num_draft, committed):
        return [DraftShape({"Q": 1}, num_draft)]

    def load_stock_drafter(self, pair, dtype, device):
        from specc.stock.runner import load_hf_causal_lm

        return load_hf_causal_lm(pair.drafter.path, dtype, device)

    def stock_generate(self, target, draft, pair, prompt, max_new_tokens, num_draft, eos_token_ids):
        from specc.stock import generate_chain

        return generate_chain(target, draft, prompt, max_new_tokens, num_draft or self.default_num_draft(None),
                              eos_token_ids)
