"""The device loop's greedy chain accept + commit (``_accept_chain``, one CUDA graph on a GPU):
the same tokens and accepted counts as the step's former eager form, with no host read inside."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.runtime.replay import ReplayVerifier

pytestmark = pytest.mark.parametrize("family", ["qwen3"], indirect=True)


class _FormerAccept(DeviceSpeculativeDecoder):
    """The chain step's accept + commit as it was before it became one device function: the
    verifier, then at batch 1 the committed tokens written at the host's count ``n[0]``, at
    batch > 1 scattered at the rows' lengths; the oracle the refactored step is checked against."""

    def _chain_accept_fn(self):
        def accept(drafts, logits, caps, active):
            accepted, committed = self.verifier.verify(drafts, logits, caps)
            if self.seq.shape[0] == 1:
                n, k = self.n[0], drafts.shape[1]
                self.seq[:, n:n + k + 1] = committed
                self.state.commit(accepted + 1)
            else:
                lengths = self.state.lengths
                self.seq.scatter_(1, lengths[:, None] + torch.arange(drafts.shape[1] + 1)[None] + 1, committed)
                self.state.commit((accepted + 1) * active)
            return accepted, committed

        return accept


def _loops(checkpoints, drafter_key="ar_perturbed", method="ar-draft", k=3, max_len=None):
    """The refactored loop and the former-accept oracle, each over its own build of the pair."""
    loops = []
    for cls in (DeviceSpeculativeDecoder, _FormerAccept):
        eager = build_eager(resolve_pair(checkpoints["target"], checkpoints[drafter_key], method), k,
                            max_len=max_len or len(PROMPT) + 40)
        loops.append(cls(eager.target, eager.drafter, eager.num_draft, eager.max_len))
    return loops


def _replay(loop, by_position: bool) -> ReplayVerifier:
    return ReplayVerifier([0.9, 0.6, 0.8, 0.5], seed=4, lengths=(lambda: loop.state.lengths) if by_position else None)


def test_greedy_chain_at_batch_one_equals_the_former_step_and_the_target(checkpoints):
    new, old = _loops(checkpoints)
    got, want = new.generate(PROMPT, 21, ()), old.generate(PROMPT, 21, ())
    assert got.tokens == want.tokens == reference(checkpoints["target"], 21)
    assert got.stats.accepted_lengths == want.stats.accepted_lengths
    assert len(set(got.stats.accepted_lengths)) > 1  # drafts partly accepted: the decision matters


@pytest.mark.parametrize("by_position", [False, True])
def test_replayed_chain_at_batch_one_equals_the_former_step(checkpoints, by_position):
    new, old = _loops(checkpoints, "pard_same", "pard", 4)
    new.verifier, old.verifier = _replay(new, by_position), _replay(old, by_position)
    got, want = new.generate(PROMPT, 30, ()), old.generate(PROMPT, 30, ())
    assert got.tokens == want.tokens and got.stats.accepted_lengths == want.stats.accepted_lengths
    assert len(set(got.stats.accepted_lengths)) > 1  # the draws advance from step to step


@pytest.mark.parametrize("by_position", [False, True])
def test_replayed_batches_with_free_slots_and_budget_caps_equal_the_former_step(checkpoints, by_position):
    """Five requests of different budgets over three slots: slots free up and refill, rows near
    their budget draft fewer (budget caps), a free slot rides along committing nothing."""
    new, old = _loops(checkpoints, "pard_same", "pard", 4)
    new.verifier, old.verifier = _replay(new, by_position), _replay(old, by_position)
    prompts = [PROMPT, PROMPT[:4], PROMPT[2:], PROMPT[1:6], PROMPT[:3]]
    budgets = [14, 3, 21, 6, 9]
    got = new.generate_batch(prompts, budgets, (), batch_size=3)
    want = old.generate_batch(prompts, budgets, (), batch_size=3)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.stats.accepted_lengths for r in got] == [r.stats.accepted_lengths for r in want]
    assert [len(r.tokens) for r in got] == budgets


def test_greedy_batch_with_per_row_caps_and_a_free_slot_equals_the_former_step(checkpoints):
    """``speculate`` with one draft count per slot (a packed verify: caps differ per row) and
    slot 1 free: the same host rows, ``seq`` and lengths from both forms of the step."""
    new, old = _loops(checkpoints)
    results = []
    for loop in (new, old):
        with torch.inference_mode():
            loop.open_slots(3)
            loop.prefill_slot(0, PROMPT)
            loop.prefill_slot(2, PROMPT[:4])
            rows = [loop.speculate([20, 0, 20], [3, 0, 1])[0] for _ in range(4)]
            rows += [loop.speculate([2, 0, 20], None)[0] for _ in range(2)]  # row 0 capped by its budget
        results.append((rows, loop.seq.clone(), loop.state.lengths.clone(), list(loop.n)))
    (rows, seq, lengths, n), (rows_old, seq_old, lengths_old, n_old) = results
    assert rows == rows_old and n == n_old and torch.equal(lengths, lengths_old)
    for b in (0, 2):  # live rows: their committed tokens (a free row's seq holds junk past 0)
        assert torch.equal(seq[b, :n[b]], seq_old[b, :n[b]])
    assert n[1] == 0 and int(lengths[1]) == 0
    accepted = [[step[b][0] for b in range(3)] for step in rows]
    assert all(a[0] <= 3 and a[1] == 0 and a[2] <= 1 for a in accepted[:4])  # the per-row caps hold
    assert all(a[0] <= 1 for a in accepted[4:])  # row 0's budget caps it at 1 draft
    assert max(a[0] for a in accepted[:4]) > 0 and max(a[2] for a in accepted) > 0  # some drafts accepted


def test_chain_accept_reads_nothing_back_to_the_host(checkpoints, monkeypatch):
    """The whole decision and commit run on device tensors: any read of a value to the host
    inside (``item``, ``tolist``, ``int()``, ``bool()``, an index from a tensor) would break its
    CUDA graph; here it raises."""
    new, _ = _loops(checkpoints)
    for verifier in (None, _replay(new, False), _replay(new, True)):
        if verifier is not None:
            new.verifier = verifier
        calls = []

        def guarded(*args, _accept=new._accept_chain):
            def refuse(*a, **kw):
                raise AssertionError("host read inside the chain accept")

            with monkeypatch.context() as m:
                for name in ("item", "tolist", "__int__", "__bool__", "__index__", "__float__"):
                    m.setattr(torch.Tensor, name, refuse)
                out = _accept(*args)
            calls.append(args)
            return out

        monkeypatch.setattr(new, "_chain_accept_fn", lambda: guarded)
        res = new.generate_batch([PROMPT, PROMPT[:5]], [12, 7], (), batch_size=3)  # batch with a free slot
        single = new.generate(PROMPT, 9, ())
        assert [len(r.tokens) for r in res] == [12, 7] and len(single.tokens) == 9 and calls


def test_graph_stats_list_the_chain_accept_and_its_graph_is_dropped_with_what_it_holds(checkpoints):
    """With ``capture_shapes`` on (CPU: the wrapper runs every call eagerly) the function is a
    ``GraphedStep`` reported as ``chain_accept``; a new verifier, a resize or a new ``seq``
    drops it (a graph holds them), a second generation of the same shape keeps it."""
    new, _ = _loops(checkpoints)
    new.capture_shapes = True
    res = new.generate(PROMPT, 12, ())
    assert res.tokens == reference(checkpoints["target"], 12)
    stats = new.graph_stats()["chain_accept"]
    assert stats["eager_calls"] == len(res.stats.accepted_lengths) and stats["replays"] == 0
    fn = new._chain_accept_fn()
    new.generate(PROMPT, 12, ())
    assert new._chain_accept_fn() is fn and new.graph_stats()["chain_accept"]["eager_calls"] == 2 * stats["eager_calls"]
    new.verifier = _replay(new, False)
    assert "chain_accept" not in new.graph_stats()
    new.generate(PROMPT, 12, ())
    fn = new._chain_accept_fn()
    new.use_verifiers(chain=_replay(new, True))
    assert new._chain_accept_fn() is not fn
    fn = new._chain_accept_fn()
    new.resize(new.max_len, 1)
    assert "chain_accept" not in new.graph_stats() and new._chain_accept_fn() is not fn
    fn = new._chain_accept_fn()
    new.generate_batch([PROMPT, PROMPT[:3]], 5, ())  # two rows: another seq (and state)
    assert new._chain_accept_fn() is not fn
    new.capture_shapes = False
    new.resize(new.max_len, 1)
    assert "chain_accept" not in new.graph_stats()
    new.generate(PROMPT, 4, ())
    assert "chain_accept" not in new.graph_stats()  # a plain function: nothing graphed


def test_open_slots_keeps_seq_for_the_graph_and_works_outside_inference_mode(checkpoints):
    """A new generation of the same batch reuses ``seq`` (the chain graph writes into it); one
    made under inference mode is replaced, not written, when slots open outside it."""
    new, _ = _loops(checkpoints)
    new.generate(PROMPT, 5, ())  # under inference mode
    seq = new.seq
    new.generate(PROMPT, 5, ())
    assert new.seq is seq
    new.open_slots(1)  # outside inference mode: a fresh buffer
    assert new.seq is not seq and not new.seq.is_inference() and int(new.seq.abs().sum()) == 0
