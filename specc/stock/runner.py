"""Run the stock system for a resolved pair: load HF models once, dispatch to the method's loop."""

from __future__ import annotations

import torch

from specc.pairing import Pair
from specc.result import GenerationResult


def load_hf_causal_lm(path, dtype=torch.float32, device="cpu"):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # specc reports its own progress
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


class StockSystem:
    """The reference system of a pair with its HF models loaded (reuse it across prompts)."""

    def __init__(self, pair: Pair, num_draft: int | None = None, dtype=torch.float32, device="cpu"):
        from specc import stock

        self.pair, self.num_draft = pair, num_draft
        self.target = load_hf_causal_lm(pair.target.path, dtype, device)
        self.draft = None
        if pair.method == "dflash":
            self.draft = stock.DFlashReference.from_pretrained(pair.drafter.path, dtype, device)
        elif pair.method in ("pard", "ar-draft"):
            self.draft = load_hf_causal_lm(pair.drafter.path, dtype, device)

    def generate(self, prompt, max_new_tokens: int, eos_token_ids=None) -> GenerationResult:
        from specc import stock

        pair, k = self.pair, self.num_draft
        eos = pair.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)
        if pair.method == "ar":
            return stock.generate_ar(self.target, prompt, max_new_tokens, eos)
        if pair.method == "dflash":
            return stock.generate_dflash(self.target, self.draft, prompt, max_new_tokens, k + 1 if k else None, eos)
        if pair.method == "pard":
            return stock.generate_pard(self.target, self.draft, pair.drafter.raw["pard_token"], prompt,
                                       max_new_tokens, k or 8, eos)
        return stock.generate_chain(self.target, self.draft, prompt, max_new_tokens, k or 4, eos)


def run_stock(pair: Pair, prompt: list[int], max_new_tokens: int, num_draft: int | None = None,
              dtype=torch.float32, device="cpu", eos_token_ids=None) -> GenerationResult:
    return StockSystem(pair, num_draft, dtype, device).generate(prompt, max_new_tokens, eos_token_ids)
