"""SerialScheduler on a fake engine: first come first served, one token per step, cancel of a
waiting or running request, an engine error ending only its own request."""

from __future__ import annotations

import pytest

from specc.result import GenerationResult, GenerationStats
from specc.serve.scheduler import SerialScheduler


class FakeEngine:
    """``stream`` yields prompt[-1] + 1, + 2, ... and returns a GenerationResult with one
    verification step per token; a prompt starting with -1 raises after one token."""

    def __init__(self):
        self.closed = []

    def stream(self, ids, max_new_tokens, eos=(), sampling=None):
        tokens = []
        try:
            for i in range(max_new_tokens):
                if ids[0] == -1 and i == 1:
                    raise RuntimeError("engine failure")
                tok = ids[-1] + 1 + i
                tokens.append(tok)
                yield tok
                if tok in eos:
                    break
        except GeneratorExit:
            self.closed.append(ids[-1])
            raise
        return GenerationResult.finish(tokens, GenerationStats(accepted_lengths=[1] * len(tokens)), "fake", eos)


def _drain(s: SerialScheduler):
    outs = []
    while s.num_running + s.num_waiting:
        outs += s.step()
    return outs


def test_requests_run_one_at_a_time_in_order():
    s = SerialScheduler(FakeEngine())
    a, b = s.submit([10], 3), s.submit([20], 2, eos_token_ids=(21,))
    assert (s.num_running, s.num_waiting) == (0, 2)
    outs = _drain(s)
    assert [(o.rid, o.tokens, o.finished) for o in outs] == [
        (a, [11], False), (a, [12], False), (a, [13], False), (a, [], True),
        (b, [21], False), (b, [], True)]
    assert outs[3].finish_reason == "length" and outs[3].result.tokens == [11, 12, 13]
    assert outs[5].finish_reason == "stop" and outs[5].result.stats.steps == 1


def test_cancel_a_waiting_and_the_running_request():
    engine = FakeEngine()
    s = SerialScheduler(engine)
    a, b, c = s.submit([10], 5), s.submit([20], 5), s.submit([30], 1)
    s.step()
    s.cancel(b)  # waiting: dropped
    s.cancel(a)  # running: its generator is closed
    assert engine.closed == [10] and (s.num_running, s.num_waiting) == (0, 1)
    assert [(o.rid, o.tokens) for o in _drain(s)] == [(c, [31]), (c, [])]


def test_an_engine_error_ends_only_its_request():
    s = SerialScheduler(FakeEngine())
    bad, good = s.submit([-1, 5], 4), s.submit([7], 1)
    outs = _drain(s)
    failed = [o for o in outs if o.error is not None]
    assert len(failed) == 1 and failed[0].rid == bad and failed[0].finished
    with pytest.raises(RuntimeError, match="engine failure"):
        raise failed[0].error
    assert [o.tokens for o in outs if o.rid == good] == [[8], []]
