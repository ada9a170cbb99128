"""Per-row processors: in one batch of rows with different parameters (greedy rows among them),
every row equals HF transformers' processors run with that row's own parameters, and the
per-row tensors can be rewritten in place."""

import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from specc.sampling import SamplingParams, process_logits
from specc.sampling.rows import RowParams, process_rows, rows_probs

V = 60

MIXED = [
    SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.3, seed=1),
    None,  # greedy
    SamplingParams(temperature=1.5, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=5, repetition_penalty=0.8),
    SamplingParams(temperature=0.0, top_k=3, repetition_penalty=2.0),  # greedy: the rest ignored
    SamplingParams(temperature=0.3, min_p=0.2),
    SamplingParams(temperature=1.1, top_k=1),
    SamplingParams(temperature=0.9, top_p=0.999, top_k=V + 5),
]


def _hf(params: SamplingParams) -> LogitsProcessorList:
    return LogitsProcessorList(([RepetitionPenaltyLogitsProcessor(params.repetition_penalty)]
                                if params.uses_history else [])
                               + [TemperatureLogitsWarper(params.temperature)]
                               + ([TopKLogitsWarper(params.top_k)] if params.top_k else [])
                               + ([TopPLogitsWarper(params.top_p)] if params.top_p < 1 else [])
                               + ([MinPLogitsWarper(params.min_p)] if params.min_p > 0 else []))


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(MIXED), V, generator=g) * 3
    x[2, :4] = x[2, 4]  # ties
    ids = torch.randint(0, V, (len(MIXED), 12), generator=g)
    seen = torch.zeros(len(MIXED), V, dtype=torch.bool).scatter_(1, ids, True)
    return x, ids, seen


@pytest.mark.parametrize("seed", range(4))
def test_each_row_equals_hf_with_its_params(seed):
    x, ids, seen = _batch(seed)
    rows = RowParams.of(MIXED, "cpu")
    out = process_rows(x, rows, seen)
    probs = rows_probs(x, rows, seen)
    for b, params in enumerate(MIXED):
        if params is None or params.greedy:
            assert torch.equal(out[b], x[b])  # raw scores: the greedy tree planner's input
            assert probs[b].argmax() == x[b].argmax() and probs[b].max() == 1 and probs[b].sum() == 1
        else:
            expect = _hf(params)(ids[b:b + 1], x[b:b + 1].clone())[0]
            assert torch.equal(out[b], expect), params
            assert torch.equal(out[b], process_logits(x[b], params, seen[b]))
            assert torch.equal(probs[b], expect.softmax(-1))
    assert torch.isinf(out).any(-1).sum() >= 4  # the processors acted (the equalities are not vacuous)


def test_leading_dims_and_no_history():
    """[B, Q, V] blocks are processed position by position with the row's parameters; without
    ``seen`` no penalty applies (rows with none)."""
    params = [SamplingParams(temperature=0.9, top_k=6, top_p=0.7), SamplingParams(temperature=1.3, min_p=0.1), None]
    x = torch.randn(3, 4, V)
    rows = RowParams.of(params, "cpu")
    out = process_rows(x, rows)
    for b in range(3):
        assert torch.equal(out[b], process_rows(x[b], rows.index([b] * 4)))


def test_set_row_in_place_and_index():
    rows = RowParams.of([None, None], "cpu")
    storage = rows.temperature.data_ptr()
    rows.set_row(1, SamplingParams(temperature=0.5, top_k=4, top_p=0.25, min_p=0.1, repetition_penalty=1.2))
    assert rows.temperature.data_ptr() == storage
    assert rows.greedy.tolist() == [True, False] and rows.top_k.tolist() == [0, 4]
    assert rows.top_p_cut[1].item() == pytest.approx(0.75) and rows.penalty[1].item() == pytest.approx(1.2)
    one = rows.index(slice(1, 2))
    assert one.rows == 1 and one.temperature.item() == 0.5
    rows.set_row(1, SamplingParams(temperature=0.0, top_k=4))
    assert rows.greedy.tolist() == [True, True] and rows.top_k.tolist() == [0, 0]


def test_skipping_unused_processors_changes_nothing():
    """A processor no row uses is skipped; running it anyway gives the same bits (off rows keep
    their scores), so the skip is only a saving. ``used`` grows as rows take new params."""
    x, ids, seen = _batch(9)
    rows = RowParams.of([SamplingParams(temperature=0.8), None, SamplingParams(temperature=1.3, seed=2)], "cpu")
    assert rows.used == set()
    forced = RowParams.of([SamplingParams(temperature=0.8), None, SamplingParams(temperature=1.3, seed=2)], "cpu")
    forced.used.update({"top_k", "top_p", "min_p"})
    assert torch.equal(process_rows(x[:3], rows, seen[:3]), process_rows(x[:3], forced, seen[:3]))
    rows.set_row(1, SamplingParams(temperature=1.0, top_p=0.5))
    assert rows.used == {"top_p"} and rows.index([1]).used == {"top_p"}
    out = process_rows(x[:3], rows)
    assert torch.equal(out[1], _hf(SamplingParams(temperature=1.0, top_p=0.5))(ids[1:2], x[1:2].clone())[0])


def test_top_p_cut_among_equal_scores_does_not_depend_on_the_batch():
    """Equal scores straddling the top-p cut: the tokens removed are the same for a row alone and
    for the same row among others (the sort is stable, so ties go by token index)."""
    from specc.sampling.params import SamplingParams
    from specc.sampling.rows import RowParams, process_rows

    row = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0])
    others = torch.randn(5, 8)
    params = SamplingParams(temperature=1.0, top_p=0.6, seed=1)
    alone = process_rows(row[None], RowParams.of([params], "cpu"))
    batch = process_rows(torch.cat([others[:2], row[None], others[2:]]), RowParams.of([params] * 6, "cpu"))
    assert torch.equal(alone[0], batch[2])
    kept = (alone[0] > float("-inf")).nonzero().flatten().tolist()
    # the cut falls inside the run of equal scores: the lowest-index ones go first (stable order)
    assert kept == [0, 4, 6, 7]
