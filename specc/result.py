"""What every generation loop returns: the new tokens plus per-step statistics.

Shared by the stock loops, the eager specc.models loops and the compiled engine, so their
results compare field by field. Batch-ready: a batch returns one ``GenerationResult`` per row.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Iterable, Sequence


@dataclasses.dataclass
class GenerationStats:
    """accepted_lengths[i]: tokens committed by target step i (accepted drafts + the target's
    own token), after clipping at EOS / max_new_tokens. The token produced by prefill is not a
    step. ``steps`` counts target forwards after prefill. ``level2_steps``: under two-level
    verification, the steps in which the request's drafts went on to the second level's forward
    (a step counts once in ``target_forwards`` either way); in JSON only when nonzero."""

    accepted_lengths: list[int] = dataclasses.field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    tree_nodes: list[int] = dataclasses.field(default_factory=list)  # tree steps: nodes verified (root included)
    level2_steps: int = 0  # two-level verification: steps whose drafts went on to the second level

    @property
    def steps(self) -> int:
        return len(self.accepted_lengths)

    @property
    def tau(self) -> float:
        """Mean tokens committed per target step (the acceptance length)."""
        return sum(self.accepted_lengths) / len(self.accepted_lengths) if self.accepted_lengths else 0.0

    def to_json(self) -> dict:
        return {
            "accepted_lengths": list(self.accepted_lengths),
            "steps": self.steps,
            "tau": self.tau,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            **({"tree": {"nodes_per_step": list(self.tree_nodes),
                         "mean_nodes": sum(self.tree_nodes) / len(self.tree_nodes)}} if self.tree_nodes else {}),
            **({"level2_steps": self.level2_steps} if self.level2_steps else {}),
        }


@dataclasses.dataclass
class GenerationResult:
    tokens: list[int]
    stats: GenerationStats
    method: str = ""
    finished_by: str = "length"  # "eos" | "length"

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "stats": self.stats.to_json(), "method": self.method,
                "finished_by": self.finished_by}

    @classmethod
    def finish(cls, tokens: list[int], stats: GenerationStats, method: str, eos_token_ids=()) -> "GenerationResult":
        """The result of a loop that stopped: finished by EOS when its last token is one."""
        ended = bool(tokens) and tokens[-1] in set(eos_token_ids)
        return cls(tokens=tokens, stats=stats, method=method, finished_by="eos" if ended else "length")


def clip_committed(
    new_tokens: Sequence[int], produced: int, max_new_tokens: int, eos_ids: Iterable[int]
) -> tuple[list[int], bool]:
    """Cut a step's committed tokens at the first EOS (kept) and at the token budget.

    ``produced`` is how many tokens the sequence already has. Returns (tokens to append, stop).
    """
    eos = set(eos_ids)
    out: list[int] = []
    for tok in new_tokens:
        if produced + len(out) >= max_new_tokens:
            return out, True
        out.append(int(tok))
        if tok in eos:
            return out, True
    return out, produced + len(out) >= max_new_tokens


def as_prompt_list(input_ids) -> list[int]:
    """Accept a list of ints or a [1, T] / [T] tensor; return a list of ints. Text, and ids
    that are not non-negative integers (1.5, -3, True), are refused rather than truncated."""
    if isinstance(input_ids, (str, bytes)):
        raise TypeError("a prompt is token ids (a list of ints or a [T] / [1, T] tensor), not text: tokenize it "
                        "first (e.g. engine.tokenizer(text)['input_ids'] after specc.load)")
    if hasattr(input_ids, "tolist"):
        ids = input_ids.tolist()
        if ids and isinstance(ids[0], list):
            if len(ids) != 1:
                raise ValueError("these loops take one prompt; pass rows one at a time")
            ids = ids[0]
    else:
        ids = input_ids
    return [_token_id(i) for i in ids]


def _token_id(value) -> int:
    if isinstance(value, bool):
        raise TypeError(f"token ids are integers, got {value!r}")
    try:
        token = operator.index(value)  # ints, numpy integers; not floats or strings
    except TypeError:
        raise TypeError(f"token ids are integers, got {value!r} ({type(value).__name__})") from None
    if token < 0:
        raise ValueError(f"token ids are >= 0, got {token}")
    return token


def check_vocab(ids: list[int], vocab_size: int | None) -> None:
    """ValueError for an id outside 0 .. vocab_size - 1 (where the embedding would fail): the one
    range check of prompt ids; the CLI and the server word it as their own errors."""
    if vocab_size is None:
        return
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
