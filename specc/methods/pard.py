"""PARD: a causal drafter fed the committed tokens plus k - 1 mask tokens drafts k tokens in one forward."""

from __future__ import annotations

from specc.errors import UserError
from specc.methods.base import DraftShape, Method
from specc.methods.registry import register_method


@register_method
class PardMethod(Method):
    name = "pard"
    description = "PARD: committed tokens + (k - 1) pard_token slots, one causal drafter forward per step"
    drafter_kinds = ("pard",)
    default_for = ("pard",)
    k_choices = (2, 3, 4, 6, 8, 10, 12)
    strategy = "pard"
    supports_tree = True  # per-position logits from the one drafting forward

    def default_num_draft(self, drafter_raw):
        return 8

    @staticmethod
    def pard_token(drafter_raw) -> int:
        token = (drafter_raw or {}).get("pard_token")
        if token is None:
            raise UserError("PARD drafter config.json has no pard_token")
        return int(token)

    def drafter_for(self, draft_step, pair):
        from specc.runtime.drafters import PardDraft

        return PardDraft(draft_step, self.pard_token(pair.drafter.raw))

    def manifest_drafter(self, pair, loaded):
        return {"pard_token": self.pard_token(pair.drafter.raw)}

    def draft_logits(self, loaded, pair, seq, hidden, num_draft):
        import torch

        drafter = loaded.draft
        masks = torch.full((1, num_draft - 1), self.pard_token(pair.drafter.raw), dtype=torch.long, device=seq.device)
        feed = torch.cat([seq, masks], dim=1)
        drafter.setup_caches(1, feed.shape[1])
        pos = torch.arange(feed.shape[1], device=seq.device)[None]
        return drafter(feed, pos, torch.zeros(1, dtype=torch.long, device=seq.device))[0, -num_draft:]

    def draft_shapes(self, num_draft, committed):
        return [DraftShape({"Q": committed + num_draft - 1}, 1)]

    def load_stock_drafter(self, pair, dtype, device):
        from specc.stock.runner import load_hf_causal_lm

        return load_hf_causal_lm(pair.drafter.path, dtype, device)

    def stock_generate(self, target, draft, pair, prompt, max_new_tokens, num_draft, eos_token_ids):
        from specc.stock import generate_pard

        return generate_pard(target, draft, self.pard_token(pair.drafter.raw), prompt, max_new_tokens,
                             num_draft or self.default_num_draft(None), eos_token_ids)
