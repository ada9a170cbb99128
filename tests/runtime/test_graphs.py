"""GraphedStep on a GPU: replays equal eager calls; a non-idempotent step runs once per call."""

from __future__ import annotations

import pytest
import torch

from specc.runtime.graphs import GraphedStep

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_replay_equals_the_eager_step():
    step = GraphedStep(lambda x: (x * 2 + 1).sum(-1))
    for i in range(4):
        x = torch.randn(2, 8, device="cuda") + i
        assert torch.equal(step(x), (x * 2 + 1).sum(-1))
    assert step.captures == 1 and step.replays == 4  # the capturing call replays too


def test_eager_first_runs_an_in_place_update_exactly_once_per_call():
    """warmup=0 + eager_first: call 1 eager, call 2 captured (not run) then replayed once."""
    counter = torch.zeros(1, device="cuda")

    def bump(amount):
        counter.add_(amount.sum())

    step = GraphedStep(bump, warmup=0, eager_first=True)
    for _ in range(5):
        step(torch.ones(1, 3, device="cuda"))
    torch.cuda.synchronize()
    assert float(counter) == 15.0
    assert step.eager_calls == 1 and step.captures == 1 and step.replays == 4
