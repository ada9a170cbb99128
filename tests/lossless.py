"""Run one decoding scenario three ways: HF greedy generate, stock, and the eager specc loop."""

from __future__ import annotations

import functools

from helpers import PROMPT, hf_greedy, hf_model

from specc.pairing import resolve_pair
from specc.runtime.eager import build_eager
from specc.stock import DFlashReference, generate_ar, generate_chain, generate_dflash, generate_pard

# (method, target key, drafter key, num_draft, expected acceptance)
SCENARIOS = [
    ("ar", "target", None, 0, "none"),
    ("ar-draft", "target", "ar_same", 4, "full"),
    ("ar-draft", "target", "ar_perturbed", 4, "partial"),
    ("ar-draft", "target", "ar_random", 4, "zero"),
    ("pard", "target", "pard_same", 4, "partial"),
    ("pard", "const_target", "const_pard", 4, "full"),
    ("dflash", "target", "dflash", 3, "zero"),
    ("dflash", "const_target", "const_dflash", 3, "full"),
]


@functools.lru_cache(maxsize=None)
def _hf(path):
    return hf_model(path)


@functools.lru_cache(maxsize=None)
def _dflash_ref(path):
    return DFlashReference.from_pretrained(path)


def run_stock(method, paths, drafter_path, num_draft, max_new, eos=(), cap=True, prompt=PROMPT):
    target = _hf(paths)
    if method == "ar":
        return generate_ar(target, prompt, max_new, eos)
    if method == "dflash":
        return generate_dflash(target, _dflash_ref(drafter_path), prompt, max_new, num_draft + 1, eos)
    draft = _hf(drafter_path)
    if method == "pard":
        return generate_pard(target, draft, 3, prompt, max_new, num_draft, eos, cap_to_budget=cap)
    return generate_chain(target, draft, prompt, max_new, num_draft, eos, cap_to_budget=cap)


def run_eager(method, target_path, drafter_path, num_draft, max_new, eos=(), cap=True, prompt=PROMPT):
    pair = resolve_pair(target_path, drafter_path, method)
    decoder = build_eager(pair, num_draft or None, max_len=len(prompt) + max_new)
    decoder.cap_to_budget = cap
    return decoder.generate(prompt, max_new, eos)


def reference(target_path, max_new, eos=None, prompt=PROMPT):
    return hf_greedy(_hf(target_path), prompt, max_new, eos)


def eos_inside_accepted_block(result):
    """A token that a speculative run committed strictly before the end of one of its
    multi-token steps, and had not produced before: used as EOS, generation must stop inside an
    accepted block. None when the run has no such token."""
    tokens, index = result.tokens, 1
    for n in result.stats.accepted_lengths:
        for j in range(index, index + n - 1):
            if n > 1 and tokens[j] not in tokens[:j]:
                return tokens[j]
        index += n
    return None
