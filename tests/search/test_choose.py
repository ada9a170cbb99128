"""``choose_pipeline``'s drafts per step with no measured acceptance in the search memory: it asks
``measure`` once, at the largest k it sweeps, and chooses exactly what a later call reading that
measurement back from the memory chooses; what it picks is never predicted slower than another
candidate it priced."""

from __future__ import annotations

import pytest

from specc.pairing import resolve_pair
from specc.search.acceptance import AcceptanceModel
from specc.search.choose import choose_pipeline
from specc.search.defaults import default_num_draft, k_choices
from specc.search.memory import Memory, pair_weights

DEP = "cpu"
# what stock measures for a drafter whose first two drafts are often right and the rest rarely:
# a short chain wins, far from the method's default k
ALPHAS = [0.684211, 0.48, 0.416667, 0.25, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05]


class Measure:
    """A ``measure`` callback that records its calls and returns a fixed measured model."""

    def __init__(self, alphas=ALPHAS, none=False):
        self.alphas, self.none, self.calls = alphas, none, []

    def __call__(self, k: int):
        self.calls.append(k)
        if self.none:
            return None
        return AcceptanceModel(list(self.alphas[:k]) + [self.alphas[-1]] * max(0, k - len(self.alphas)),
                               source=f"measured by stock at k={k}", measured_k=k)


@pytest.fixture
def pair(tiny):
    return resolve_pair(tiny["target"], tiny["pard"])


def _memory(tmp_path, pair, records=()):
    mem = Memory.open("qwen3", DEP, tmp_path / "mem")
    for k, model in records:
        mem.record_acceptance(pair.target.name, pair.drafter.name, pair.method, k, model,
                              weights=pair_weights(pair))  # as `specc compile` records it
    mem.save()
    return tmp_path / "mem"


def test_empty_memory_measures_once_at_the_largest_k_and_sweeps(pair, tmp_path):
    k_max = max(k_choices(pair, default_num_draft(pair)))
    measure = Measure()
    choice = choose_pipeline(pair, DEP, _memory(tmp_path, pair), measure=measure)
    assert measure.calls == [k_max]
    p = choice.prediction
    assert p["acceptance_source"] == "measured" and "measured for this choice" in p["choice_acceptance"]
    assert p["expected_tokens_per_step"] > 1.0
    priced = [c for c in p["candidates"] if "tokens_per_s" in c]
    assert {c["num_draft"] for c in priced} == set(k_choices(pair, default_num_draft(pair)))
    # never a configuration predicted slower than another one priced; the default k is one of them
    assert p["tokens_per_s"] == max(c["tokens_per_s"] for c in priced)
    at_default = next(c for c in priced if c["num_draft"] == default_num_draft(pair))
    assert choice.num_draft != default_num_draft(pair) and p["tokens_per_s"] > at_default["tokens_per_s"]


def test_without_a_measurement_the_default_k_stays_at_e_1(pair, tmp_path):
    """What a first compile chose before: E = 1 assumed, no sweep, the method's default k,
    predicted below AR; with the measurement the same call picks a k predicted faster than AR."""
    blind = choose_pipeline(pair, DEP, _memory(tmp_path, pair))
    assert blind.prediction["acceptance_source"] == "unknown" and blind.num_draft == default_num_draft(pair)
    assert blind.prediction["speedup"] < 1.0
    measure = Measure(none=True)  # stock drafted nothing to measure: the same as no callback
    assert choose_pipeline(pair, DEP, _memory(tmp_path, pair), measure=measure).num_draft == blind.num_draft
    assert measure.calls
    seen = choose_pipeline(pair, DEP, _memory(tmp_path, pair), measure=Measure())
    assert seen.prediction["speedup"] > 1.0 > blind.prediction["speedup"]


def test_fresh_and_remembered_measurements_choose_alike(pair, tmp_path):
    """The first call measures; a second reading the memory the first filled chooses the same
    pipeline and k at the same predicted tokens/s (the alphas are priced as the memory keeps them)."""
    k_max = max(k_choices(pair, default_num_draft(pair)))
    measure = Measure(alphas=[0.7123456789, 0.4987654321, 0.3333333333] + [0.1111111111] * 12)
    first = choose_pipeline(pair, DEP, _memory(tmp_path / "a", pair), measure=measure)
    warm_dir = _memory(tmp_path / "b", pair, [(k_max, measure(k_max))])
    second_measure = Measure()
    second = choose_pipeline(pair, DEP, warm_dir, measure=second_measure)
    assert second_measure.calls == []  # the memory's record covers every k swept
    assert second.prediction["acceptance_source"] == "memory"
    assert "search memory" in second.prediction["choice_acceptance"]
    assert (second.pipeline, second.num_draft) == (first.pipeline, first.num_draft)
    assert second.prediction["tokens_per_s"] == first.prediction["tokens_per_s"]


def test_when_measure_is_not_called(pair, tmp_path):
    k_max = max(k_choices(pair, default_num_draft(pair)))
    measure = Measure()
    given = AcceptanceModel([0.5] * k_max, source="stated", measured_k=k_max)
    assert choose_pipeline(pair, DEP, _memory(tmp_path / "a", pair), acceptance=given, measure=measure)
    assert choose_pipeline(pair, DEP, _memory(tmp_path / "b", pair), num_draft=4, measure=measure).num_draft == 4
    assert measure.calls == []  # the caller's acceptance or k decides
    # a record measured at fewer drafts than the sweep reaches would only be extrapolated: measure
    short = AcceptanceModel([0.9, 0.9], source="measured by stock at k=2", measured_k=2)
    choice = choose_pipeline(pair, DEP, _memory(tmp_path / "c", pair, [(2, short)]), measure=measure)
    assert measure.calls == [k_max] and choice.prediction["acceptance_source"] == "measured"
    # memory=False: nothing remembered, the measurement still chooses
    assert choose_pipeline(pair, DEP, False, measure=Measure()).prediction["acceptance_source"] == "measured"


def test_a_record_for_other_weights_is_measured_again(pair, tmp_path):
    """Acceptance belongs to the weights: a record left by an older memory (no fingerprint) or by
    a drafter since retrained in the same directory is not used; the pair is measured again."""
    import shutil

    k_max = max(k_choices(pair, default_num_draft(pair)))
    old = AcceptanceModel(ALPHAS[:3] + [ALPHAS[-1]] * (k_max - 3), source="older weights", measured_k=k_max)
    mem = Memory.open("qwen3", DEP, tmp_path / "mem")
    mem.record_acceptance(pair.target.name, pair.drafter.name, pair.method, k_max, old)  # no fingerprint
    mem.save()
    measure = Measure()
    assert choose_pipeline(pair, DEP, tmp_path / "mem", measure=measure).prediction["acceptance_source"] == "measured"
    assert measure.calls == [k_max]
    # retrain the drafter in place: its weight file changes, and so does the fingerprint
    drafter = tmp_path / "drafter"
    shutil.copytree(pair.drafter.path, drafter)
    moved = resolve_pair(str(pair.target.path), str(drafter))
    before = pair_weights(moved)
    weights = next(f for f in drafter.iterdir() if f.suffix == ".safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert before is not None and pair_weights(moved) != before
    mem = Memory.open("qwen3", DEP, tmp_path / "mem2")
    mem.record_acceptance(moved.target.name, moved.drafter.name, moved.method, k_max, old, weights=before)
    mem.save()
    measure = Measure()
    assert choose_pipeline(moved, DEP, tmp_path / "mem2", measure=measure).prediction["acceptance_source"] == "measured"
    assert measure.calls == [k_max]


def test_drafter_pipeline_prices_the_drafter_with_its_own_passes(pair):
    """`specc compile --drafter-passes`: every candidate's drafter is priced with the given
    pipeline; the target's pipeline is still chosen, and the prediction says which drafter ran."""
    acc = AcceptanceModel([0.8] * 4, source="given")
    same = choose_pipeline(pair, DEP, False, num_draft=4, acceptance=acc)
    unfused = choose_pipeline(pair, DEP, False, num_draft=4, acceptance=acc, drafter_pipeline="")
    assert same.pipeline == unfused.pipeline and same.prediction["drafter_pipeline"] is None
    assert unfused.prediction["drafter_pipeline"] == ""
    assert unfused.prediction["step_s"] > same.prediction["step_s"]  # the unfused drafter launches more kernels
    assert unfused.prediction["ar_step_s"] == same.prediction["ar_step_s"]  # AR runs no drafter
