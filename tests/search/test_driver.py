"""The search driver end to end on tiny checkpoints (CPU): rounds improve the prediction, every kept
candidate passed token forcing, a broken pass is rejected, the memory carries validated mechanisms
to another deployment; choose_pipeline picks without compiling."""

from __future__ import annotations

import json
import textwrap
import time

import pytest
from broken_passes import negate_logits_source
from real_configs import QWEN3_8B, QWEN3_8B_DFLASH

from specc.search.acceptance import AcceptanceModel
from specc.search.choose import Choice, choose_pipeline
from specc.search.defaults import default_pipeline
from specc.search.driver import Search
from specc.search.memory import Memory
from specc.search.proposers import BuiltinProposer, Candidate, Proposer

FAST = dict(num_prompts=2, max_new_tokens=10, max_verify=2)

BROKEN_PASS = negate_logits_source("negate_logits")


class BrokenProposer(Proposer):
    name = "broken"

    def __init__(self, path):
        self.path = path

    def propose(self, ctx):
        best = ctx.best.candidate
        items = [p for p in best.passes["target"].split(",") if p] + [f"+{self.path}:NegateLogits"]
        # predicted slower (one more node): ask for the check anyway
        return [best.with_passes("target", ",".join(items), mechanism="negate logits", origin=self.name,
                                 check_always=True)]


@pytest.fixture(scope="module")
def first_search(tiny, tmp_path_factory):
    """A 2-round search from no passes at all, with a proposer that also offers a broken pass."""
    mem_dir = tmp_path_factory.mktemp("memory")
    path = tmp_path_factory.mktemp("passes") / "negate_pass.py"
    path.write_text(BROKEN_PASS)
    s = Search(tiny["target"], tiny["pard"], deployment="h200-bs1", memory=mem_dir, start_pipeline="",
               proposers=[BuiltinProposer(("fusion",)), BrokenProposer(path)], **FAST)
    return s.run(rounds=2), mem_dir


def test_search_improves_and_keeps_only_verified(first_search):
    result, _ = first_search
    assert result.baseline.verified and result.best.verified
    assert result.best.score > result.baseline.score
    assert result.best.forcing["passed"] and result.best.forcing["positions"] > 0
    best_passes = result.best.candidate.passes["target"].split(",")
    assert "fuse_qkv" in best_passes or "fuse_gate_up" in best_passes
    assert not result.measured  # CPU: predicted, not measured
    cands = [c for r in result.rounds for c in r["candidates"]]
    assert all(c["verified"] for c in cands if c["status"] == "best")
    # the best prediction carries its gap report; rounds log theirs
    assert result.rounds[0]["gap_report"]["rows"]
    assert result.best.prediction.gap_report().rows
    js = result.to_json()
    json.dumps(js, default=str)
    assert js["choice"]["pipeline"] == result.best.candidate.passes["target"]


def test_broken_pass_is_rejected_by_token_forcing(first_search):
    result, mem_dir = first_search
    cands = [c for r in result.rounds for c in r["candidates"] if c["mechanism"] == "negate logits"]
    assert cands, "the broken candidate was proposed"
    checked = [c for c in cands if c["verified"] is not None]
    assert checked and all(c["status"] == "rejected: token forcing failed" for c in checked)
    assert checked[0]["forcing"]["mismatches"] > 0
    memory = Memory.load(next(mem_dir.glob("qwen3__h200-bs1.json")))
    bad = [e for e in memory.entries if e.mechanism == "negate logits"]
    assert bad and not bad[0].validated


def test_memory_records_validated_mechanisms(first_search):
    result, mem_dir = first_search
    memory = Memory.load(mem_dir / "qwen3__h200-bs1.json")
    good = memory.validated()
    assert good
    for e in good:
        assert e.predicted_gain is not None and e.predicted_gain > 1.0
        assert e.parameters["passes"]["target"] is not None and e.date and e.specc_version
        assert e.method == "pard" and e.deployment == "h200-bs1"
    assert any(Candidate.from_parameters(e.parameters).key() == result.best.candidate.key() for e in good)
    assert memory.acceptance  # stock's measured acceptance is remembered for choose_pipeline


def test_other_deployment_tries_remembered_mechanisms_first(first_search, tiny):
    result, mem_dir = first_search
    s = Search(tiny["target"], tiny["pard"], deployment="h200-bs8", memory=mem_dir, start_pipeline="",
               proposers=[BuiltinProposer(("fusion",))], **FAST)
    second = s.run(rounds=1)
    order = second.rounds[0]["checked_order"]
    assert order and order[0]["origin"] == "memory:h200-bs1"
    assert second.best.candidate.origin == "memory:h200-bs1" and second.best.verified
    assert (mem_dir / "qwen3__h200-bs8.json").is_file()


def test_choose_pipeline_without_memory_is_the_default(tiny):
    from specc.pairing import resolve_pair

    pair = resolve_pair(tiny["target"], tiny["pard"])
    choice = choose_pipeline(pair, "h200-bs1", memory=False)
    assert isinstance(choice, Choice)
    assert choice.pipeline == default_pipeline() and choice.num_draft == 8
    p = choice.prediction
    for key in ("tokens_per_s", "speedup", "step_s", "ar_step_s", "gap_report", "candidates", "acceptance_source"):
        assert key in p
    assert p["acceptance_source"] == "unknown" and p["expected_tokens_per_step"] == 1.0


def test_choose_pipeline_uses_the_memory(first_search, tiny):
    from specc.pairing import resolve_pair

    _, mem_dir = first_search
    pair = resolve_pair(tiny["target"], tiny["pard"])
    choice = choose_pipeline(pair, "h200-bs1", memory=mem_dir)
    assert choice.prediction["acceptance_source"] == "memory"
    # the PARD drafter is the target itself: only its first draft is ever right (E = 2 for any k),
    # so the fewest drafts per step the proposer knows wins
    assert choice.num_draft == 2
    assert any(c["source"].startswith("memory") for c in choice.prediction["candidates"])
    assert choice.prediction["tokens_per_s"] == max(c.get("tokens_per_s", 0) for c in choice.prediction["candidates"])


def test_choose_pipeline_real_size_is_cheap(tmp_path):
    from specc.pairing import resolve_pair

    for name, cfg in (("qwen3-8b", QWEN3_8B), ("dflash", QWEN3_8B_DFLASH)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    pair = resolve_pair(str(tmp_path / "qwen3-8b"), str(tmp_path / "dflash"))
    t0 = time.perf_counter()
    choice = choose_pipeline(pair, "h200-bs1", memory=False, acceptance=AcceptanceModel.from_tau(6.55, 15))
    assert time.perf_counter() - t0 < 60  # no weights, no compilation
    assert choice.pipeline == default_pipeline()
    assert choice.num_draft == 15 and choice.prediction["speedup"] > 3


def test_search_reports_a_starting_configuration_that_fails(tiny, tmp_path):
    from specc.search.evaluated import SearchError

    path = tmp_path / "negate.py"
    path.write_text(textwrap.dedent(BROKEN_PASS))
    s = Search(tiny["target"], None, deployment="cpu", memory=False, start_pipeline=f"+{path}:NegateLogits", **FAST)
    with pytest.raises(SearchError, match="fails verification"):
        s.run(rounds=1)


def test_pack_weights_12bit_candidate_is_predicted_and_checked_in_bf16(tiny):
    """On a bf16 deployment candidates are checked in bf16 (on CPU too), so the 12-bit pass really
    fires; its prediction reads fewer weight bytes."""
    from specc.search.evaluated import Evaluated
    from specc.search.proposers import PACK_12BIT, with_pass

    s = Search(tiny["target"], None, deployment="h200-bs1", memory=False, **FAST)
    s.setup_stock()
    base = s._predict_candidate(s.start)
    cand = s.start.with_passes("target", with_pass(s.start.passes["target"], PACK_12BIT), mechanism="pack")
    ev = s.check(Evaluated(cand, prediction=s.predict(cand)))
    assert ev.verified, ev.error
    ir = s.real_ir("target", cand)[0]
    assert ir.count("packed_linear") > 0
    assert ev.prediction.ar.weight_bytes < 0.8 * base.prediction.ar.weight_bytes
