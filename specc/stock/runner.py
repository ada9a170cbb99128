"""Run the stock system for a resolved pair: load HF models, dispatch to the method's loop."""

from __future__ import annotations

import torch

from specc.pairing import Pair
from specc.result import GenerationResult


def load_hf_causal_lm(path, dtype=torch.float32, device="cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


def run_stock(pair: Pair, prompt: list[int], max_new_tokens: int, num_draft: int | None = None,
              dtype=torch.float32, device="cpu", eos_token_ids=None) -> GenerationResult:
    from specc import stock

    eos = pair.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)
    target = load_hf_causal_lm(pair.target.path, dtype, device)
    if pair.method == "ar":
        return stock.generate_ar(target, prompt, max_new_tokens, eos)
    if pair.method == "dflash":
        draft = stock.DFlashReference.from_pretrained(pair.drafter.path, dtype, device)
        block = num_draft + 1 if num_draft else None
        return stock.generate_dflash(target, draft, prompt, max_new_tokens, block, eos)
    draft = load_hf_causal_lm(pair.drafter.path, dtype, device)
    if pair.method == "pard":
        return stock.generate_pard(target, draft, pair.drafter.raw["pard_token"], prompt, max_new_tokens,
                                   num_draft or 8, eos)
    return stock.generate_chain(target, draft, prompt, max_new_tokens, num_draft or 4, eos)
