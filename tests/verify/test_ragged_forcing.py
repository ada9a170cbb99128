"""force_ragged: token forcing through a packed (ragged) verify step passes for the model
definition's exact ragged forward and fails for a step that mixes rows up."""

from __future__ import annotations

import copy

import torch

from specc.models.registry import load_model
from specc.verify import StockRun, force_ragged


def _greedy_runs(model, prompts, new_tokens):
    """Greedy tokens and top-2 margins of the model itself (full recompute, one row)."""
    runs = []
    for prompt in prompts:
        seq, margins = list(prompt), []
        for _ in range(new_tokens):
            model.setup_caches(1, len(seq) + 1)
            logits = model(torch.tensor([seq]), torch.arange(len(seq))[None], torch.zeros(1, dtype=torch.long))
            top = logits[0, -1].topk(2).values
            margins.append(float(top[0] - top[1]))
            seq.append(int(logits[0, -1].argmax()))
        runs.append(StockRun(list(prompt), seq[len(prompt):], margins))
    return runs


PROMPTS = [[5, 17, 33, 2], [9, 1], [40, 41, 42, 43, 44, 45], [7]]


def _swapped_rows(model):
    """A wrong ragged step: rows use each other's cache slots (row_slots reversed)."""
    cls = type(model)

    class SwappedRows(cls):
        def forward(self, input_ids, positions, cache_len, tree_mask=None, row_slots=None, row_starts=None):
            flipped = None if row_slots is None else row_slots.flip(0)
            return super().forward(input_ids, positions, cache_len, tree_mask, flipped, row_starts)

    bad = copy.deepcopy(model)
    bad.__class__ = SwappedRows
    return bad


@torch.inference_mode()
def test_force_ragged_passes_the_definition_and_catches_a_wrong_step(checkpoints):
    model = load_model(checkpoints["target"], torch.float32, with_tokenizer=False).model
    runs = _greedy_runs(model, PROMPTS, 9)
    report = force_ragged(model, model, runs, 1e-3, block=4)
    assert report.passed, report.summary()
    assert report.positions == sum(len(r.tokens) for r in runs) and not report.ties
    wrong = _swapped_rows(model)
    bad = force_ragged(wrong, wrong, runs, 1e-3, block=4)
    assert not bad.passed and bad.failures
