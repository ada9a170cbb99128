"""Measure a ``TreeAcceptanceModel`` for a pair: where the target's greedy tokens rank among the
drafter's candidates, depth by depth.

For each prompt the target decodes greedily (the sequence every lossless system must produce).
At every committed length n along it, the drafter drafts from scratch after ``seq[:n]`` (the
method's ``draft_logits``: one forward, the per-position distributions a tree is built from), and
for depth d = 1, 2, ... the rank of the target's token ``seq[n + d - 1]`` among the drafter's
logits at position d is counted, until a rank falls outside the recorded ``ranks`` (that path
is not in any tree of that width, so deeper depths are not reached). Every position is a sample
(not only the positions where a real decoding step would start), which estimates the
conditional rank probabilities of formula (2) in ``tree_acceptance.py``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specc.errors import UserError
from specc.search.tree_acceptance import TreeAcceptanceModel


@torch.inference_mode()
def greedy_continuation(target, prompt: Sequence[int], max_new_tokens: int, eos_token_ids=()) -> list[int]:
    """prompt + the target's greedy tokens (eager specc.models definition, KV-cached)."""
    dev = target.device
    seq = list(prompt)
    target.setup_caches(1, len(seq) + max_new_tokens + 1)
    feed, start = seq, 0
    for _ in range(max_new_tokens):
        out = target(torch.tensor([feed], device=dev), torch.arange(start, start + len(feed), device=dev)[None],
                     torch.tensor([start], device=dev))
        logits = out[0] if isinstance(out, tuple) else out
        tok = int(logits[0, -1].argmax())
        start += len(feed)
        seq.append(tok)
        feed = [tok]
        if tok in eos_token_ids:
            break
    return seq


@torch.inference_mode()
def measure_rank_acceptance(pair, prompts: Sequence[Sequence[int]], max_new_tokens: int, depth: int,
                            ranks: int = 8, dtype=torch.float32, device="cpu",
                            progress: Callable[[int, int], None] | None = None) -> TreeAcceptanceModel:
    """Per-depth rank counts of the target's greedy tokens in the drafter's distributions."""
    impl = pair.impl
    if not impl.uses_drafter:
        raise UserError(f"method {impl.name} has no drafter: nothing to measure")
    loaded = impl.load(pair, dtype, device)
    target = loaded.target
    counts = [[0] * (ranks + 1) for _ in range(depth)]
    eos = tuple(pair.eos_token_ids)
    for index, prompt in enumerate(prompts):
        seq = greedy_continuation(target, prompt, max_new_tokens, eos)
        ids = torch.tensor([seq], device=target.device)
        target.setup_caches(1, len(seq) + 1)
        out = target(ids, torch.arange(len(seq), device=ids.device)[None], torch.zeros(1, dtype=torch.long,
                                                                                      device=ids.device))
        hidden = out[1] if isinstance(out, tuple) else None
        for n in range(len(prompt) + 1, len(seq)):
            k = min(depth, len(seq) - n)
            logits = impl.draft_logits(loaded, pair, ids[:, :n], None if hidden is None else hidden[:, : n - 1], k)
            if logits is None:
                raise UserError(f"method {impl.name} has no per-position draft distribution (trees need one)")
            for d in range(1, k + 1):
                row = logits[d - 1].float()
                want = seq[n + d - 1]
                # rank = candidates strictly better, ties broken towards lower ids (as topk does)
                better = (row > row[want]).sum() + (row[:want] == row[want]).sum()
                rank = int(better)
                if rank >= ranks:
                    counts[d - 1][ranks] += 1
                    break
                counts[d - 1][rank] += 1
        if progress is not None:
            progress(index + 1, len(prompts))
    source = (f"measured: {pair.method} ranks of the target's greedy tokens, {len(prompts)} prompts x "
              f"{max_new_tokens} tokens, top {ranks} ranks")
    return TreeAcceptanceModel.from_rank_counts(counts, source=source)
