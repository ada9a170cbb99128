"""Tie-aware "= HF eager" column of `specc bench`.

In bf16 on a GPU, specc's kernels and HF's reduce in different orders, so a free greedy run can
leave HF eager's tokens where the reference's top-2 logits are within rounding of each other (a
numerical tie) and continue differently from there. That is reported, never silently forgiven and
never counted as a bug; any other difference is. The rule is ``specc.verify.output_equality``'s
(the one token forcing and the batching benchmarks apply): each request is compared up to its
first difference, where the reference's top-2 margin is measured by one forward of specc's
model definition of the target over the prompt and HF eager's tokens before it.
"""

from __future__ import annotations

import torch

from specc.verify import DEFAULT_TOLERANCE, PrefixLogits, compare_outputs

# an fp32 copy of the target (for the fp32 gap between the two tokens) only below this size
FP32_AUDIT_MAX_PARAMS = 500_000_000


def tie_tolerance(dtype: torch.dtype) -> float:
    return DEFAULT_TOLERANCE.get(str(dtype).replace("torch.", ""), 1e-3)


def reference_margins(model, dtype: torch.dtype) -> PrefixLogits:
    """Margins measured by ``model`` (specc's definition of the target, in ``dtype``), with the
    fp32 gap between the two tokens where an fp32 copy is affordable."""
    fp32 = sum(p.numel() for p in model.parameters()) <= FP32_AUDIT_MAX_PARAMS
    return PrefixLogits(model, fp32=fp32 and dtype != torch.float32)


def audit(prompts, reference, got, margins, tolerance: float) -> dict:
    """``same``: "tie" when every request's first difference from ``reference`` is at a
    numerical tie, else False; ``numerical_ties`` / ``token_differences`` list the positions."""
    report = compare_outputs(prompts, reference, got, margins, tolerance)
    out = {"same": "tie" if report.passed else False, "tie_tolerance": tolerance,
           "numerical_ties": [d.to_json() for d in report.ties]}
    if report.failures:
        out["token_differences"] = [d.to_json() for d in report.failures]
    return out


def audit_into(row: dict, key: str, prompts, reference, got, margins, tolerance: float) -> None:
    """:func:`audit` into a report row: ``row[key]`` its verdict ("tie" or False), and its lists
    of positions beside it."""
    found = audit(prompts, reference, got, margins, tolerance)
    row[key] = found.pop("same")
    row.update(found)


def classify_differences(rows: list[dict], outputs: dict, reference, prompts, model, dtype: torch.dtype) -> None:
    """Set ``same_tokens_as_hf_eager`` of each row in ``outputs`` (name -> its token lists, rows
    whose tokens differ from ``reference``) by :func:`audit`, with its lists beside it (JSON)."""
    if not outputs or model is None:
        return
    margins, tolerance = reference_margins(model, dtype), tie_tolerance(dtype)
    for row in rows:
        got = outputs.get(row["system"])
        if got is not None:
            audit_into(row, "same_tokens_as_hf_eager", prompts, reference, got, margins, tolerance)
