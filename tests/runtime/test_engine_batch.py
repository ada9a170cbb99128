"""A compiled artifact at batch > 1: ``Engine.generate_batch`` and ``Engine.scheduler`` run the
generated steps over B-row caches with per-row lengths (prefills into slot views), and every
request equals HF greedy on its prompt alone."""

import pytest
from lossless import reference

PROMPTS = [[5, 17, 33, 2, 8, 9, 41], [7, 3], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [9], [40, 41, 6, 1, 23]]


@pytest.fixture(scope="module")
def engines(checkpoints, tmp_path_factory):
    import specc
    from specc.compiler import compile_artifact

    out = {}
    for name, key, tree in (("dflash", "dflash", "off"), ("pard", "pard_same", "off"), ("pard-tree", "pard_same", "8")):
        path = tmp_path_factory.mktemp(f"batch-{name}") / "a.specc"
        compile_artifact(checkpoints["target"], checkpoints[key], out=path, max_new_tokens=4, tree=tree)
        out[name] = specc.load(path, max_len=24)
    assert out["pard-tree"].tree_budget == 8 and out["pard"].tree_budget == 0
    return out


@pytest.mark.parametrize("key", ["dflash", "pard", "pard-tree"])
def test_compiled_generate_batch_equals_each_prompt_alone(checkpoints, engines, key):
    engine = engines[key]
    budgets = [10, 6, 12, 9, 4]
    results = engine.generate_batch(PROMPTS, budgets, eos_token_id=(), batch_size=3)
    assert engine.loop.capacity == 3 and engine.last_stats["prompts"] == 5
    for prompt, budget, result in zip(PROMPTS, budgets, results):
        assert result.tokens == reference(checkpoints["target"], budget, prompt=prompt)
        assert bool(result.stats.tree_nodes) == (key == "pard-tree")
    alone = engine.generate(PROMPTS[2], 12, eos_token_id=())
    assert engine.loop.batch == 1 and alone.tokens == results[2].tokens
    fixed = engine.generate_batch(PROMPTS, budgets, eos_token_id=(), batch_size=3, buckets=False)
    assert [r.tokens for r in fixed] == [r.tokens for r in results] and engine.loop.batch == 3
    assert not engine.scheduler(3, buckets=False).buckets and engine.scheduler(3).buckets


def test_compiled_scheduler_default_eos_and_growing_max_len(checkpoints, engines):
    engine = engines["dflash"]
    free = reference(checkpoints["target"], 30, prompt=PROMPTS[0])
    saved, engine.eos_token_ids = engine.eos_token_ids, (free[6],)  # the model's EOS, as a manifest gives it
    try:
        scheduler = engine.scheduler(2, max_len=48)  # longer than the engine was loaded with
        a = scheduler.submit(PROMPTS[0], 30)  # stops at the default EOS
        b = scheduler.submit(PROMPTS[3], 30, eos_token_ids=())
        while not scheduler.idle:
            scheduler.step()
    finally:
        engine.eos_token_ids = saved
    assert scheduler.take(a).tokens == free[:7]
    assert scheduler.take(b).tokens == reference(checkpoints["target"], 30, prompt=PROMPTS[3])


def test_compiled_ragged_step_serves_two_level_and_per_request_drafts(checkpoints, engines):
    """The artifact's compiled ``target_ragged`` step is the loop's ragged step: two-level
    verification and per-request draft lengths go through it, and every request still equals
    HF greedy alone."""
    from specc.runtime.adaptive import GoodputDraftLength

    engine = engines["pard"]  # its drafter is the target itself: level 1 is often fully accepted
    assert engine.loop.ragged_target is engine.loop.steps["target_ragged"]
    budgets = [10, 6, 12]
    try:
        engine.loop.two_level_k1 = 1
        results = engine.generate_batch(PROMPTS[:3], budgets, eos_token_id=(), batch_size=3)
    finally:
        engine.loop.two_level_k1 = None
    for prompt, budget, result in zip(PROMPTS, budgets, results):
        assert result.tokens == reference(checkpoints["target"], budget, prompt=prompt)
    assert sum(r.stats.level2_steps for r in results) > 0  # the second level ran

    rule = GoodputDraftLength(lambda rows, k: 1.0 + 0.1 * k * rows, engine.loop.num_draft,
                              ragged_seconds=lambda rows, tokens: 1.0 + 0.05 * tokens)
    scheduler = engine.scheduler(3, draft_length=rule)
    rids = [scheduler.submit(p, b, eos_token_ids=()) for p, b in zip(PROMPTS[2:5], [12, 9, 4])]
    while not scheduler.idle:
        scheduler.step()
    for rid, prompt, budget in zip(rids, PROMPTS[2:5], [12, 9, 4]):
        assert scheduler.take(rid).tokens == reference(checkpoints["target"], budget, prompt=prompt)


def test_engine_refuses_text_and_ids_outside_the_vocabulary(engines):
    """The Python API says what is wrong with a prompt before any step runs: text instead of ids,
    ids that are not integers, ids past the artifact's vocabulary; a tensor or a numpy row works."""
    import numpy as np
    import torch

    engine = engines["dflash"]
    vocab = engine.manifest["model"]["vocab_size"]
    assert engine.loop.vocab_size == vocab
    with pytest.raises(TypeError, match="not text"):
        engine.generate("def f():", 2)
    with pytest.raises(TypeError, match="a list of prompts"):
        engine.generate_batch("def f():", 2)
    with pytest.raises(TypeError, match="integers"):
        engine.generate([5, 2.5], 2)
    for bad in ([5, vocab], [[5, 7], [vocab + 3]]):
        with pytest.raises(ValueError, match=rf"outside the vocabulary \(0..{vocab - 1}\)"):
            engine.generate_batch(bad if isinstance(bad[0], list) else [bad], 2)
    want = engine.generate(PROMPTS[1], 3, eos_token_id=()).tokens
    assert engine.generate(torch.tensor([PROMPTS[1]]), 3, eos_token_id=()).tokens == want
    assert engine.generate(np.array(PROMPTS[1]), 3, eos_token_id=()).tokens == want


def test_max_len_is_checked_before_the_caches_are_allocated(engines, monkeypatch):
    """``specc.load(max_len=)`` and the growth ``generate_batch`` asks for refuse a length below the
    warm-up's minimum, a non-integer, and one whose KV caches exceed the free memory, before
    allocating (the caches' size per token comes from the manifest's state specs)."""
    import specc
    import specc.models.loading as loading
    from specc.runtime.engine import MIN_MAX_LEN, manifest_kv_bytes_per_token

    engine = engines["dflash"]
    per_token = manifest_kv_bytes_per_token(engine.manifest)
    caches = {**engine.manifest["steps"]["target"]["caches"], **engine.manifest["steps"]["drafter"]["caches"]}
    assert per_token == sum(4 * spec["heads"] * spec["head_dim"] for spec in caches.values())  # fp32
    for bad in (0, MIN_MAX_LEN - 1, "64", 64.0):
        with pytest.raises(ValueError, match=f"max_len must be an integer >= {MIN_MAX_LEN}"):
            specc.load(engine.path, max_len=bad)
    monkeypatch.setattr(loading, "available_memory_bytes", lambda device="cpu": 100 * per_token)
    with pytest.raises(ValueError, match="max_len 1000's KV cache needs about"):
        specc.load(engine.path, max_len=1000)
    before = engine.loop.max_len
    with pytest.raises(ValueError, match=f"max_len {len(PROMPTS[0]) + 501}'s KV cache needs about"):
        engine.generate_batch([PROMPTS[0]], max_new_tokens=500)
    assert engine.loop.max_len == before  # nothing was resized
