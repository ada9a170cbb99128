"""GraphedStep: replays equal eager calls; a non-idempotent step runs once per call.

On a GPU the graphs are real. On the CPU, ``cpu_graphs.CpuGraphedStep`` keeps GraphedStep's call
protocol (warm-up calls run the step, a capture records without running it, a replay runs it
once) with a stand-in for the CUDA graph, so that the protocol's effect on a hybrid target's recurrent
state is checked everywhere: a warmed-up capture of a chain verify block advanced the GDN state
three times on the H200 (chain token forcing of a Qwen3.5-shaped target failed from its first
block; trees, whose step is idempotent, passed)."""

from __future__ import annotations

import pytest
import torch
from cpu_graphs import CpuGraphedStep
from hybrid_factory import random_hybrid_lm

from specc.codegen.build import build_step
from specc.models.state import StateSpec, idempotent_step
from specc.runtime.compiled import instantiate
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.graphs import GraphedStep

gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class _Declares(torch.nn.Module):
    def __init__(self, *kinds):
        super().__init__()
        self.specs = [StateSpec(f"s{i}", kind, (2, 3), "float32", 3) for i, kind in enumerate(kinds)]

    def state_specs(self):
        return self.specs


def test_warm_up_follows_whether_the_steps_state_is_idempotent():
    """KV caches are rewritten at the positions cache_len names (warm-ups harmless); GDN
    snapshot states are advanced in place (no warm-up: the first call of a shape runs eagerly,
    the second is captured and replayed once). Explicit arguments win."""
    kv, hybrid = _Declares("kv", "kv"), _Declares("kv", "recurrent", "conv")
    assert idempotent_step(kv) and not idempotent_step(hybrid) and idempotent_step(torch.nn.Linear(2, 2))
    assert (GraphedStep(kv).warmup, GraphedStep(kv).eager_first) == (2, False)
    assert (GraphedStep(hybrid).warmup, GraphedStep(hybrid).eager_first) == (0, True)
    assert (GraphedStep(hybrid, warmup=3, eager_first=False).warmup, GraphedStep(kv, eager_first=True).eager_first) \
        == (3, True)
    assert idempotent_step(GraphedStep(hybrid)) is False  # a wrapper answers for the step it holds


@pytest.fixture(scope="module")
def hybrid_chain():
    """(model definition, compiled chain verify step) of a tiny hybrid target, blocks up to 5."""
    model = random_hybrid_lm()
    model.setup_caches(1, 48, max_block=5)
    return model, instantiate(build_step(model, "target", "").emitted)


def _loop(step, num_draft=4):
    return DeviceSpeculativeDecoder(step, None, num_draft, 48)


def test_a_hybrid_chain_step_is_not_idempotent(hybrid_chain):
    """What idempotent_step reports is what a second call does: the chain step continues from
    its own result (so a warm-up call would corrupt the state)."""
    _, step = hybrid_chain
    assert not idempotent_step(step)
    step.setup_caches(1, 32)
    step(torch.tensor([[3, 9, 27, 4, 50, 61]]), torch.arange(6)[None], torch.tensor([0]))
    block = (torch.tensor([[7, 8, 21]]), torch.arange(6, 9)[None], torch.tensor([6]))
    once = step(*block).clone()
    twice = step(*block)
    assert not torch.allclose(once, twice, atol=1e-3), "a second call repeated the first: update idempotent_step"


def test_graphed_hybrid_chain_forcing_equals_the_eager_step(hybrid_chain):
    """Token forcing through a graphed hybrid chain step (the protocol of the H200 run: verify
    blocks of one shape captured at their first occurrence) gives the eager step's argmax; with
    the two warm-ups every step used to get, it does not (the defect, reproduced on the CPU)."""
    model, step = hybrid_chain
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 96, (12,), generator=g).tolist()
    tokens = torch.randint(0, 96, (18,), generator=g).tolist()  # blocks of 5, 5, 5, 2
    want = _loop(step).forced_argmax(prompt, tokens)
    assert want == _loop(model).forced_argmax(prompt, tokens)  # the compiled step = the model definition
    graphed = CpuGraphedStep(step, max_tokens=5)
    loop = _loop(graphed)
    assert loop.forced_argmax(prompt, tokens) == want
    # prefill and the first block of each shape eager, the second block of 5 captured and replayed
    assert (graphed.captures, graphed.replays, graphed.eager_calls) == (1, 2, 3)
    assert loop.forced_argmax(prompt, tokens) == want  # a second prompt: replays, and the block of 2 captured
    assert (graphed.captures, graphed.replays) == (2, 6)
    warmed = CpuGraphedStep(step, max_tokens=5, warmup=2, eager_first=False)
    assert _loop(warmed).forced_argmax(prompt, tokens) != want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replay_equals_the_eager_step():
    step = GraphedStep(lambda x: (x * 2 + 1).sum(-1))
    for i in range(4):
        x = torch.randn(2, 8, device="cuda") + i
        assert torch.equal(step(x), (x * 2 + 1).sum(-1))
    assert step.captures == 1 and step.replays == 4  # the capturing call replays too


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_of_a_hybrid_chain_step_force_as_the_eager_step():
    """The CPU test above with real CUDA graphs and the GDN Triton kernels: token forcing through
    a graphed compiled hybrid chain step equals the eager step's, across a second prompt too;
    and with two warm-ups per capture it does not (the H200 chain forcing failure)."""
    model = random_hybrid_lm().to("cuda")
    model.setup_caches(1, 48, device="cuda", max_block=5)
    step = instantiate(build_step(model, "target", "").emitted)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 96, (12,), generator=g).tolist()
    tokens = torch.randint(0, 96, (18,), generator=g).tolist()
    with torch.inference_mode():
        want = _loop(step).forced_argmax(prompt, tokens)
        graphed = GraphedStep(step, max_tokens=5)
        loop = _loop(graphed)
        assert loop.forced_argmax(prompt, tokens) == want
        assert loop.forced_argmax(prompt, tokens) == want
        assert graphed.captures == 2 and not graphed.eager_reasons
        warmed = GraphedStep(step, max_tokens=5, warmup=2, eager_first=False)
        assert _loop(warmed).forced_argmax(prompt, tokens) != want


class _AnyDevice(GraphedStep):
    """GraphedStep's signature path with CPU tensors
    accepted as graphable, so its key can be checked off CUDA."""

    def _on_device(self, tensor) -> bool:
        return True


def test_signature_is_the_key_in_one_pass():
    """The one-pass graph key equals (and hashes as) ``_key``'s, keeps non-tensor arguments,
    and is None for calls that run eagerly: a token dimension over ``max_tokens``, no tensor, or
    (the real device test) CPU tensors."""
    step = _AnyDevice(lambda *a: None, max_tokens=8, warmup=0, eager_first=False)
    args = (torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 3, 4), None, 5, torch.zeros(2, dtype=torch.long))
    key = step._signature(args)
    assert key == GraphedStep._key(args) and hash(key) == hash(GraphedStep._key(args))
    assert key[2] is None and key[3] == 5 and key[0][1] == torch.long
    assert step._signature((torch.zeros(1, 9),)) is None  # over max_tokens: eager
    assert step._signature((3, None)) is None
    assert GraphedStep(lambda *a: None, warmup=0, eager_first=False)._signature(args) is None  # CPU: eager
    assert step._signature(args[:2]) != step._signature((args[0], torch.zeros(1, 3, 4, dtype=torch.float16)))


def test_stats_print_keys_with_tuple_shapes():
    step = _AnyDevice(lambda *a: None, warmup=0, eager_first=False)
    step.eager_reasons[step._signature((torch.zeros(1, 2),))] = "why"
    assert step.stats()["eager_reasons"] == {str((((1, 2), torch.float32),)): "why"}


def test_pools_are_held_objects_and_ids_pass_through():
    """``new_pool`` gives what ``torch.cuda.graph`` takes through ``pool_id``: a MemPool's id (the
    object keeps its pool alive), or a bare id as is (older torch)."""
    from specc.runtime.graphs import pool_id

    assert pool_id(None) is None and pool_id((1, 0)) == (1, 0)

    class _Held:
        id = (7, 0)

    assert pool_id(_Held()) == (7, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cublas_step_captures_again_after_its_graphs_are_dropped():
    """A step whose GEMM runs on cuBLAS, captured, its graphs dropped (as ``setup_caches`` and a
    loop's resize to another batch do), then captured again into the same pool: the second capture
    works and replays the eager result. (With a bare ``graph_pool_handle`` id, the allocator's
    pool use count had reached zero and every later capture failed: H200 run 9's batched loop
    ran all its steps eagerly.)"""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(2048, 1024, generator=g).to("cuda", torch.bfloat16)

    def step(x):
        return torch.nn.functional.linear(x, weight) * 2

    graphed = GraphedStep(step, max_tokens=1 << 20)
    shared = GraphedStep(lambda x: torch.nn.functional.linear(x, weight), max_tokens=1 << 20, pool=graphed.pool)
    for rows in (256, 256, 512):
        x = torch.randn(rows, 1024, generator=g).to("cuda", torch.bfloat16)
        for _ in range(3):
            assert torch.equal(graphed(x), step(x))
        graphed.graphs.clear()
        torch.cuda.synchronize()
    assert not graphed.eager_reasons and graphed.replays >= 6
    x = torch.randn(256, 1024, generator=g).to("cuda", torch.bfloat16)
    shared.pool = graphed.pool  # one pool shared by two steps, as a loop's steps share one
    for _ in range(3):
        assert torch.equal(shared(x), torch.nn.functional.linear(x, weight))
    assert not shared.eager_reasons and shared.replays >= 1


def test_logging_replays_times_each_replay_by_step():
    """Within ``logging_replays`` every replay of a graphed step is logged (the CPU stand-in's
    replays by perf_counter), ``replay_seconds`` sums them per name; outside, nothing is logged."""
    from specc.runtime.graphs import logging_replays, replay_seconds

    class _Step(torch.nn.Module):
        def forward(self, x):
            return x * 2

    step = CpuGraphedStep(_Step(), max_tokens=8)
    x = torch.ones(1, 3)
    step(x)  # captured (and replayed once, outside the log)
    with logging_replays() as log:
        for _ in range(3):
            assert torch.equal(step(x), x * 2)
    step(x)
    assert len(log) == 3 and all(entry[0] is step for entry in log)
    seconds = replay_seconds(log, {id(step): "target"})
    assert set(seconds) == {"target"} and seconds["target"] >= 0
    assert replay_seconds(log, {}) == {"CpuGraphedStep": seconds["target"]}


def test_captures_pause_the_garbage_collector(monkeypatch):
    """A cyclic collection inside a CUDA capture can destroy dropped graphs and free their memory
    there, which aborts the process: ``capture`` pauses the collector for the capture (and
    restores it after, also when the capture fails), around ``torch.cuda.graph``."""
    import contextlib
    import gc

    from specc.runtime import graphs

    seen = []

    @contextlib.contextmanager
    def fake_graph(graph, pool=None):
        seen.append((gc.isenabled(), graph, pool))
        yield

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    assert gc.isenabled()
    with graphs.capture("g", (0, 7)):
        assert not gc.isenabled()
    assert gc.isenabled() and seen == [(False, "g", (0, 7))]
    with pytest.raises(RuntimeError), graphs.capture("h"):
        raise RuntimeError("capture failed")
    assert gc.isenabled() and seen[-1] == (False, "h", None)
    gc.disable()
    try:
        with graphs.capture("i"):
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()
