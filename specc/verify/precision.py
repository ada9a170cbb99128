"""How far logits computed in low precision are from a reference on the same tokens.

Why: a bf16 token-forcing failure is either a bug or rounding noise that the model amplifies
(deep random-weight hybrids amplify it a lot). Stock's own bf16 logits, set beside stock run in
fp32 on the same weights, measure that noise; a system whose logits sit about as far from fp32
as stock's is as exact as stock, and its disagreements with stock are noise. One clearly farther
rounds somewhere stock does not, or computes something else.

:func:`logit_deviation` compares two ``[T, V]`` logit tensors of the same positions;
:func:`deviation_line` prints one comparison.
"""

from __future__ import annotations

import torch


def logit_deviation(logits: torch.Tensor, reference: torch.Tensor, first: int = 4) -> dict:
    """``logits`` against ``reference`` (both [T, V], the same T positions): max |difference|
    over all positions and over the ``first`` ones, its rms, and the fraction of positions whose
    argmax agrees."""
    if logits.shape != reference.shape or logits.dim() != 2 or logits.shape[0] == 0:
        raise ValueError(f"logit_deviation: logits {tuple(logits.shape)} and reference {tuple(reference.shape)} "
                         "must be the same non-empty [positions, vocab]")
    diff = (logits.float() - reference.float()).abs()
    top = logits.argmax(dim=-1) == reference.argmax(dim=-1)
    return {"positions": int(diff.shape[0]), "max_abs": float(diff.max()), "first": min(first, diff.shape[0]),
            "max_abs_first": float(diff[:first].max()), "rms": float(diff.pow(2).mean().sqrt()),
            "argmax_agreement": float(top.float().mean())}


def deviation_line(name: str, dev: dict) -> str:
    """One printed line: ``name: max |d| A (first N positions: B), rms C, argmax agrees on P%``."""
    return (f"{name}: max |d| {dev['max_abs']:.4f} (first {dev['first']} positions: {dev['max_abs_first']:.4f}), "
            f"rms {dev['rms']:.4f}, argmax agrees at {100 * dev['argmax_agreement']:.0f}% of {dev['positions']}")
