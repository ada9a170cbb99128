"""GraphedRaggedStep: the loop packs verifies bucketed for it (every slot a row, T padded to a
token-count bucket with padding on the last slot's row). Run eagerly on the CPU, the padded
verifies give every request the tokens of HF greedy alone and of the unpadded loop, with the
same per-step decisions, for per-request draft lengths and two-level verification."""

import pytest
from lossless import reference
from ragged_helpers import BUDGETS, PROMPTS, RowPattern, StepSpy, run_requests

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.ragged import token_bucket
from specc.runtime.ragged_graphs import GraphedRaggedStep


def _loop(checkpoints, method, target_key, drafter_key, num_draft, bucketed):
    pair = resolve_pair(checkpoints[target_key], checkpoints.get(drafter_key), method)
    eager = build_eager(pair, num_draft, max_len=40)
    ragged = GraphedRaggedStep(eager.target) if bucketed else None
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, ragged_target=ragged)
    loop.ragged_target = StepSpy(loop.ragged_target)
    return loop


@pytest.mark.parametrize("method,target_key,drafter_key,num_draft,k1", [
    ("ar-draft", "target", "ar_perturbed", 3, None),
    ("pard", "const_target", "const_pard", 4, 2),  # drafts accepted: rows go on to level 2
])
def test_bucketed_verifies_give_the_unpadded_tokens(checkpoints, method, target_key, drafter_key, num_draft, k1):
    runs = {}
    for bucketed in (False, True):
        loop = _loop(checkpoints, method, target_key, drafter_key, num_draft, bucketed)
        loop.two_level_k1 = k1
        rule = RowPattern([[num_draft, 0, 2], [1, num_draft, 0], [2, 2, num_draft]])
        results, _ = run_requests(loop, rule)
        runs[bucketed] = ([(r.tokens, r.stats.accepted_lengths) for r in results], loop.ragged_target.calls, loop)
    (plain, plain_calls, _), (padded, padded_calls, loop) = runs[False], runs[True]
    assert padded == plain  # the same tokens and the same decisions step by step
    for prompt, budget, (tokens, _) in zip(PROMPTS, BUDGETS, padded):
        assert tokens == reference(checkpoints[target_key], budget, prompt=prompt)
    real = [sum(counts) for _, counts, _ in plain_calls]
    assert [sum(counts) for _, counts, _ in padded_calls] == [token_bucket(t) for t in real]
    assert any(token_bucket(t) != t for t in real)  # some verifies were padded
    assert all(slots == list(range(len(slots))) for slots, _, _ in padded_calls)  # every slot of the width is a row


def _compiled_loop(graphs: bool, k1):
    """Tiny Qwen3 shapes + PARD on CUDA, compiled (the ragged step has no host sync there, so it
    can be captured); acceptance replayed by position so both loops make the same decisions."""
    import types

    import torch

    from specc.bench.shapes import build_causal, drafter_config, target_config
    from specc.codegen.build import build_step, build_steps
    from specc.methods import get_method
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop
    from specc.runtime.replay import ReplayVerifier

    dev = torch.device("cuda")
    tcfg = target_config("tiny-qwen3")
    method, dcfg = drafter_config("tiny-qwen3", "pard")
    impl = get_method(method)
    loaded = impl.bind(build_causal(tcfg, torch.float32, dev, 1), build_causal(dcfg, torch.float32, dev, 2))
    loaded.target.setup_caches(1, 16)
    loaded.draft.setup_caches(1, 16)
    emitted = dict(build_steps(loaded.target, loaded.draft, DEFAULT_PIPELINE, loaded.draft_spec).emitted)
    loaded.target.setup_caches(1, 16)
    emitted["target_ragged"] = build_step(loaded.target, "target_ragged", DEFAULT_PIPELINE).emitted
    steps = {role: instantiate(e, loaded.draft_spec if role == "drafter" else None) for role, e in emitted.items()}
    section = impl.manifest_drafter(types.SimpleNamespace(drafter=types.SimpleNamespace(raw=dcfg)), loaded)
    loop = build_loop(steps, impl.strategy, 4, 48, drafter_section=section, graphs=graphs)
    loop.cap_to_budget = False  # the same drafts in both loops at the end of a budget
    loop.two_level_k1 = k1
    loop.verifier = ReplayVerifier([0.9, 0.8, 0.7, 0.6], seed=0, lengths=lambda: loop.state.lengths)
    return loop


@pytest.mark.gpu
@pytest.mark.parametrize("k1", [None, 2])
def test_graphed_ragged_step_gives_the_eager_tokens_on_cuda(k1):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    got = {}
    for graphs in (False, True):
        loop = _compiled_loop(graphs, k1)
        rule = RowPattern([[4, 0, 2], [1, 4, 0], [2, 2, 4]])
        results, _ = run_requests(loop, rule)
        got[graphs] = [(r.tokens, r.stats.accepted_lengths) for r in results]
        if graphs:
            stats = loop.ragged_target.stats()
            # every packed verify replayed a graph (the first of a bucket right after its capture)
            assert stats["replays"] >= stats["captures"] > 0 and stats["eager_calls"] == 0, stats
            assert not stats["eager_reasons"], stats
    assert got[True] == got[False]
