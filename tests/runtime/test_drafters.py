"""Drafting strategies over a batch of slots (specc.runtime.drafters): a row's drafts in a batch
where requests join, leave and accept different amounts are the drafts of its request alone.

DFlash is driven directly through the slot interface the device loop uses (``reset_slot``,
``propose_logits_rows``, ``accepted_rows``, ``release_slot``) with scripted acceptance and random
target hidden states, so every case (a request joining a running batch, a one-token prompt, a
prompt too short to re-feed, a slot reused) is hit on purpose rather than by chance."""

import pytest
import torch

from specc.pairing import resolve_pair
from specc.runtime.eager import build_eager

K = 3  # drafts per step (the test drafter's block is 4)
MAX_LEN = 64

# request -> (slot, step it joins at, prompt length, accepted drafts per step until it leaves)
REQUESTS = {
    "a": (0, 0, 11, [3, 0, 2]),
    "b": (1, 0, 7, [1, 3, 3, 0, 1]),
    "c": (2, 1, 9, [0, 2, 3]),     # joins a running batch
    "d": (0, 3, 1, [3, 1]),        # a one-token prompt, in a slot freed by "a"
    "e": (2, 4, 2, [2, 0]),        # too short to re-feed what the others feed: drafts alone first
}


def _dflash(checkpoints):
    target = checkpoints["target"]
    eager = build_eager(resolve_pair(target, checkpoints["dflash"], "dflash"), K, max_len=MAX_LEN)
    return eager.drafter


def _inputs(width: int):
    """Per request: prompt tokens, prompt hidden states, then per step the committed tokens and the
    step's hidden states [1, K + 1, width] (only the first accepted + 1 are committed)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for rid, (_, _, plen, accepted) in REQUESTS.items():
        tokens = torch.randint(4, 60, (plen + 1 + sum(a + 1 for a in accepted),), generator=g)
        prompt_ctx = torch.randn(1, plen, width, generator=g)
        steps = [torch.randn(1, K + 1, width, generator=g) for _ in accepted]
        out[rid] = (tokens, prompt_ctx, steps)
    return out


def _alone(drafter, rid, inputs) -> list[torch.Tensor]:
    """The request's draft logits per step, run alone (one row)."""
    _, _, plen, accepted = REQUESTS[rid]
    tokens, prompt_ctx, steps = inputs[rid]
    drafter.setup(MAX_LEN + K + 1, 1)
    drafter.reset(tokens[:plen].tolist(), prompt_ctx)
    seq = tokens[None].clone()
    n, got = plen + 1, []
    for a, ctx in zip(accepted, steps):
        got.append(drafter.propose_logits_rows(seq, [n], K)[0])
        drafter.accepted_rows([n], [a], K, ctx)
        n += a + 1
    return got


def _batched(drafter, inputs, slots: int = 3, capture: bool = False) -> dict[str, list[torch.Tensor]]:
    """Every request through ``slots`` slots on the REQUESTS schedule (joining at their step,
    leaving after their last): per request its draft logits per step. ``capture``: call the
    drafter with every batched shape before the first draft, as the loop does on CUDA
    (``capture_shapes``), after the first requests' prompts are in the cache."""
    width = next(iter(inputs.values()))[1].shape[-1]
    drafter.setup(MAX_LEN + K + 1, slots)
    drafter.open_rows(slots)
    seq = torch.zeros(slots, MAX_LEN + K + 2, dtype=torch.long)
    n = [0] * slots
    at: dict[str, int] = {}  # running request -> its steps so far
    got = {rid: [] for rid in REQUESTS}
    for step in range(max(j + len(acc) for _, j, _, acc in REQUESTS.values())):
        for rid, (slot, join, plen, _) in REQUESTS.items():
            if join == step:
                tokens, prompt_ctx, _ = inputs[rid]
                seq[slot] = 0
                seq[slot, :plen + 1] = tokens[:plen + 1]
                drafter.reset_slot(slot, plen, prompt_ctx)
                n[slot], at[rid] = plen + 1, 0
        owner = {REQUESTS[rid][0]: rid for rid in at}
        active = [b in owner for b in range(slots)]
        if capture and step == 0:
            drafter.capture_shapes(seq, K)
        logits = drafter.propose_logits_rows(seq, list(n), K, active=active)
        accepted, ctx = [0] * slots, torch.zeros(slots, K + 1, width)
        for b, rid in owner.items():
            tokens, _, steps = inputs[rid]
            got[rid].append(logits[b])
            accepted[b] = a = REQUESTS[rid][3][at[rid]]
            ctx[b] = steps[at[rid]][0]
            seq[b, n[b]:n[b] + a + 1] = tokens[n[b]:n[b] + a + 1]
        drafter.accepted_rows(list(n), accepted, K, ctx)
        for b, rid in owner.items():
            n[b] += accepted[b] + 1
            at[rid] += 1
            if at[rid] == len(REQUESTS[rid][3]):  # its last step: the request leaves
                drafter.release_slot(b)
                n[b] = 0
                del at[rid]
    return got


@pytest.mark.parametrize("capture", [False, True])
def test_dflash_rows_joining_a_batch_draft_what_they_draft_alone(checkpoints, capture):
    """``capture``: the up-front shape capture's writes land past every prompt entry in the cache."""
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    drafter = _dflash(checkpoints)
    inputs = _inputs(drafter.drafter.draft.fc.weight.shape[1])
    with torch.inference_mode():
        forwards = drafter.forwards
        batched = _batched(drafter, inputs, capture=capture)
        batched_forwards = drafter.forwards - forwards
        for rid in REQUESTS:
            alone = _alone(drafter, rid, inputs)
            assert len(batched[rid]) == len(alone) == len(REQUESTS[rid][3])
            for step, (got, want) in enumerate(zip(batched[rid], alone)):
                assert torch.equal(got.argmax(-1), want.argmax(-1)), (rid, step)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"request {rid}, step {step}")
    # one batched drafting forward per step, plus one alone for each of "d" and "e" at their first
    # draft (1 and 2 entries; the batch re-feeds 4 then): "c", joining with 9, drafts in the batch
    steps = max(j + len(acc) for _, j, _, acc in REQUESTS.values())
    assert batched_forwards == steps + 2


@pytest.mark.parametrize("method,target_key,drafter_key,per_draft", [
    ("dflash", "const_target", "const_dflash", 1),  # accepts every draft: rows that joined earlier lag by K + 1
    ("pard", "target", "pard_same", 1),
    ("ar-draft", "target", "ar_perturbed", K),  # K chained forwards per draft
])
@pytest.mark.parametrize("capture", [False, True])
def test_joining_requests_draft_in_the_batched_forward(checkpoints, method, target_key, drafter_key, per_draft,
                                                       capture):
    """Requests joining a running batch (prompts longer than a step's drafts) draft in the
    batch's drafting forward from their first step on (no forward alone), every request's
    tokens are those of HF greedy alone, and its acceptance per step is that of the request run
    alone (same drafts; k is not capped at budgets, so a step drafts K for every row).
    ``capture``: the loop calls the drafter with every batched shape first, as on CUDA."""
    from lossless import reference

    from specc.runtime.batching import BatchScheduler
    from specc.runtime.device_loop import DeviceSpeculativeDecoder

    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    target = checkpoints[target_key]
    eager = build_eager(resolve_pair(target, checkpoints[drafter_key], method), K, max_len=MAX_LEN)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, cap_to_budget=False)
    loop.capture_shapes = capture
    prompts = [[5 + i + 3 * j for j in range(length)] for i, length in enumerate([6, 13, 8, 5, 21, 9])]
    budgets = [9, 14, 6, 11, 8, 12]
    with torch.inference_mode():
        scheduler = BatchScheduler(loop, 3)
        rids = [scheduler.submit(p, b, ()) for p, b in zip(prompts, budgets)]
        steps, joins = 0, 0
        while not scheduler.idle:
            joins += len(scheduler.admit())
            before = loop.drafter.forwards
            if scheduler.decode():
                steps += 1
                assert loop.drafter.forwards - before == per_draft
        results = [scheduler.take(r) for r in rids]
    assert joins == len(prompts) and steps > 0
    for prompt, budget, result in zip(prompts, budgets, results):
        assert result.tokens == reference(target, budget, prompt=prompt)
        assert result.stats.accepted_lengths == loop.generate(prompt, budget).stats.accepted_lengths


def test_dflash_batch_one_fast_path_drafts_as_the_batch_path(checkpoints):
    """At batch 1 the device loop passes no ``active`` and DFlash takes ``_propose_one``; the
    batch path (``active=[True]``) on the same inputs gives bitwise the same logits and leaves
    the drafter in the same state, step after step (prompts of 1 .. 11 tokens, drafts accepted
    0 .. K)."""
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    drafter = _dflash(checkpoints)
    inputs = _inputs(drafter.drafter.draft.fc.weight.shape[1])
    for rid, (_, _, plen, accepted) in REQUESTS.items():
        tokens, prompt_ctx, steps = inputs[rid]
        runs = []
        for active in (None, [True]):
            torch.manual_seed(0)
            drafter.setup(MAX_LEN + K + 1, 1)
            drafter.reset(tokens[:plen].tolist(), prompt_ctx)
            seq, n, got = tokens[None].clone(), plen + 1, []
            with torch.inference_mode():
                for a, ctx in zip(accepted, steps):
                    got.append(drafter.propose_logits_rows(seq, [n], K, active=active))
                    got.append(torch.tensor(drafter.lengths + drafter.context_lens))
                    drafter.accepted_rows([n], [a], K, ctx)
                    n += a + 1
            runs.append(got)
        assert all(torch.equal(x, y) for x, y in zip(*runs)), rid
