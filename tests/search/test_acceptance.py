"""Acceptance models: formula (1), the geometric fit to a published tau, the censored estimator."""

from __future__ import annotations

import json
import random

import pytest

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel, expected_tokens, geometric_alpha, measure_stock


def test_expected_tokens_and_distribution():
    m = AcceptanceModel([0.8, 0.5, 0.25])
    # E = 1 + a1 + a1 a2 + a1 a2 a3
    assert m.expected_tokens(3) == pytest.approx(1 + 0.8 + 0.4 + 0.1)
    assert m.expected_tokens(0) == 1.0
    dist = m.distribution(3)
    assert sum(dist) == pytest.approx(1.0)
    assert sum((n + 1) * p for n, p in enumerate(dist)) == pytest.approx(m.expected_tokens(3))
    # beyond the measured positions the last alpha is reused, and that is reported
    assert m.alpha(5) == 0.25 and m.extrapolated(5) and "extrapolated" in m.describe(5)
    assert AcceptanceModel.none().expected_tokens(7) == 1.0


@pytest.mark.parametrize("tau,k", [(6.55, 15), (4.25, 15), (2.0, 4), (1.0, 3), (5.0, 4)])
def test_geometric_fit_reproduces_tau(tau, k):
    m = AcceptanceModel.from_tau(tau, k)
    assert m.expected_tokens(k) == pytest.approx(tau, abs=1e-6)
    assert len(set(m.alphas)) == 1 and 0.0 <= m.alphas[0] <= 1.0
    assert geometric_alpha(tau, k) == pytest.approx(m.alphas[0])
    with pytest.raises(UserError):
        AcceptanceModel.from_tau(k + 2.0, k)


def test_censored_estimator_by_hand():
    # k = 3. Sequence A: steps commit 4, 1, 3 (the last one cut by the budget: only a >= 2 known).
    # Position 1 at risk: step1 (acc), step2 (rej), step3 (acc, censored after 2) -> 2/3
    # Position 2 at risk: step1 (acc), step3 (acc) -> 2/2
    # Position 3 at risk: step1 only (step3's outcome at 3 is unknown) -> 1/1
    m = AcceptanceModel.from_accepted_lengths([[4, 1, 3]], 3)
    assert m.counts == [(2, 3), (2, 2), (1, 1)]
    assert m.alphas == pytest.approx([2 / 3, 1.0, 1.0])
    # a censored step of length 1 tells nothing
    assert AcceptanceModel.from_accepted_lengths([[2, 1]], 2).counts == [(1, 1), (0, 1)]
    with pytest.raises(UserError):
        AcceptanceModel.from_accepted_lengths([[5]], 3)


def _simulate(alphas, k, budget, rng):
    """Committed lengths of one sequence of ``budget`` tokens, as the loops clip them."""
    out, produced = [], 1  # the prefill token is not a step
    while produced < budget:
        a = 0
        while a < k and rng.random() < alphas[a]:
            a += 1
        step = min(a + 1, budget - produced)
        out.append(step)
        produced += step
    return out


def test_clipping_is_handled_where_naive_counting_is_biased():
    rng = random.Random(0)
    alphas, k = [0.9, 0.8, 0.7, 0.6, 0.5], 5
    seqs = [_simulate(alphas, k, 9, rng) for _ in range(3000)]  # short sequences: many clipped steps
    est = AcceptanceModel.from_accepted_lengths(seqs, k)
    assert est.alphas == pytest.approx(alphas, abs=0.03)
    assert est.expected_tokens(k) == pytest.approx(expected_tokens(alphas, k), rel=0.03)
    # treating the clipped last steps as ordinary rejections underestimates acceptance
    accepted, at_risk = [0] * k, [0] * k
    for s in seqs:
        for length in s:
            for i in range(1, min(length, k) + 1):
                at_risk[i - 1] += 1
                accepted[i - 1] += length - 1 >= i
    naive = [a / r for a, r in zip(accepted, at_risk)]
    assert naive[-1] < alphas[-1] - 0.1


def test_acceptance_files(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"alphas": [0.9, 0.5], "source": "paper"}))
    assert AcceptanceModel.from_file(tmp_path / "a.json").expected_tokens(2) == pytest.approx(1 + 0.9 + 0.45)
    (tmp_path / "t.json").write_text(json.dumps({"tau": 6.55, "block_size": 16}))
    assert AcceptanceModel.from_file(tmp_path / "t.json").expected_tokens(15) == pytest.approx(6.55, abs=1e-6)
    (tmp_path / "l.json").write_text(json.dumps({"accepted_lengths": [[4, 1, 3]], "num_draft": 3}))
    assert AcceptanceModel.from_file(tmp_path / "l.json").counts == [(2, 3), (2, 2), (1, 1)]
    for bad in ({"tau": 3.0}, {"alphas": [1.5]}, {"nothing": 1}):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(UserError):
            AcceptanceModel.from_file(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        AcceptanceModel.from_file(tmp_path / "broken.json")


def test_measure_stock_on_a_tiny_pard_pair(tiny):
    from specc.pairing import resolve_pair

    pair = resolve_pair(tiny["target"], tiny["pard"])
    model, results = measure_stock(pair, [[5, 17, 33, 2, 8], [9, 41, 7]], num_draft=4, max_new_tokens=10)
    assert len(results) == 2 and model.measured_k == 4 and model.sequences == 2
    # the PARD drafter is the target itself: its first draft (the target's own next token) is always right
    assert model.alphas[0] == 1.0
    assert 2.0 <= model.expected_tokens(4) <= 5.0


def test_the_longest_row_of_a_batch():
    """E[max tokens over rows] (what a batched drafter feeds every row): one row is E; it grows
    with the rows towards k + 1; mixed rows and draft counts agree with enumerating every outcome."""
    import itertools

    from specc.search.acceptance import expected_longest

    a, b = AcceptanceModel([0.9, 0.7, 0.5]), AcceptanceModel.constant(0.6, 2)
    assert a.expected_max_tokens(3, 1) == pytest.approx(a.expected_tokens(3))
    widths = [a.expected_max_tokens(3, r) for r in (1, 2, 4, 16, 256)]
    assert widths == sorted(widths) and widths[-1] == pytest.approx(4.0, abs=1e-6) and widths[0] < widths[1]
    rows = [(a, 3), (b, 2), (a, 1)]
    outcomes = [list(enumerate(m.distribution(k), start=1)) for m, k in rows]  # (tokens, probability)
    brute = sum(max(ta, tb, tc) * pa * pb * pc for (ta, pa), (tb, pb), (tc, pc) in itertools.product(*outcomes))
    assert expected_longest(rows) == pytest.approx(brute, rel=1e-12)
    assert expected_longest([]) == 0.0 and AcceptanceModel.none().expected_max_tokens(0, 8) == 1.0
