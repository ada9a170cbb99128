"""Run the stock system for a resolved pair: load HF models once, run the method's reference loop.

Which HF drafter to load and which published loop to run is the method's business
(``specc.methods``: ``load_stock_drafter`` / ``stock_generate``); the pair carries its method.
"""

from __future__ import annotations

import torch

from specc.result import GenerationResult


def load_hf_causal_lm(path, dtype=torch.float32, device="cpu"):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # specc reports its own progress
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


class StockSystem:
    """The reference system of a pair (a resolved ``specc.pairing.Pair``) with its HF models
    loaded (reuse it across prompts)."""

    def __init__(self, pair, num_draft: int | None = None, dtype=torch.float32, device="cpu"):
        self.pair, self.num_draft = pair, num_draft
        self.target = load_hf_causal_lm(pair.target.path, dtype, device)
        self.draft = pair.impl.load_stock_drafter(pair, dtype, device)

    def generate(self, prompt, max_new_tokens: int, eos_token_ids=None) -> GenerationResult:
        pair = self.pair
        eos = pair.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)
        return pair.impl.stock_generate(self.target, self.draft, pair, prompt, max_new_tokens, self.num_draft, eos)


def run_stock(pair, prompt: list[int], max_new_tokens: int, num_draft: int | None = None,
              dtype=torch.float32, device="cpu", eos_token_ids=None) -> GenerationResult:
    return StockSystem(pair, num_draft, dtype, device).generate(prompt, max_new_tokens, eos_token_ids)
