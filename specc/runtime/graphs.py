"""CUDA graphs for step functions: capture once per input shape, replay after.

A decode step is dozens of small kernels; launching them one by one costs more than their work
at batch 1. ``GraphedStep`` wraps any step callable (a compiled step or a model definition):
on the first call with a new input signature it runs the step twice on a side stream (warm-up:
Triton compiles, allocations settle), captures it into a CUDA graph with static input buffers,
and from then on copies inputs into those buffers and replays. Warm-up calls are harmless only
for a step that is idempotent in its inputs (the KV write lands at the slots ``cache_len``
names). A step whose state is not (``specc.models.state.idempotent_step``: a hybrid target,
whose chain step advances the GDN recurrent state and conv window in place) gets no warm-up:
the first call of a signature runs eagerly (kernels compile there), the second is captured
without running and replayed once, so every call does its work exactly once. (With warm-ups,
the first verify block of each shape advanced the GDN state three times: issue #18.)
A step that cannot be captured (a host sync inside, e.g. reference kernels) runs eagerly for that
signature, and ``eager_reasons`` says why. Calls whose token dimension (dim 1 of any tensor
argument of rank >= 2) exceeds ``max_tokens`` run eagerly: prefills and a DFlash drafter's first
call over a whole prompt's context are one-offs, not worth a graph each. Outputs are static
buffers: consume them before the next call of the same step.

Graph memory pools are ``torch.cuda.MemPool`` objects (``new_pool``), held by every step that
captures into them. A bare ``graph_pool_handle()`` id is referenced only by the graphs captured
into it: once they are all dropped (``setup_caches``, a loop's ``resize`` to another batch) its
use count reaches zero while blocks allocated during capture can outlive them (cuBLAS caches its
workspace per stream, allocated inside the first capture of a GEMM), and the next capture into
that id fails inside the allocator (``use_count > 0 INTERNAL ASSERT``): every later shape then
ran eagerly. A MemPool object keeps one use of its pool for as long as it lives.

Captures run with Python's cyclic garbage collector paused (``capture``): a loop that drops its
graphs (a new verifier, a resize) leaves them in reference cycles, and a collection that ran
inside a later capture destroyed those graphs and their memory there, which CUDA forbids during
a capture: the process aborted ("Fatal Python error: Aborted ... Garbage-collecting", once in the
GPU test of whole-step graphs). torch's ``torch.cuda.graph`` no longer collects before a capture.
"""

from __future__ import annotations

import contextlib
import gc
import time

import torch

from specc.models.state import idempotent_step


@contextlib.contextmanager
def capture(graph: "torch.cuda.CUDAGraph", pool=None):
    """``torch.cuda.graph(graph, pool=...)`` with the cyclic garbage collector paused for the
    capture (module doc: a collection inside it can free CUDA graphs and memory, which aborts);
    what became garbage is collected at the next collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool_id(pool)):
            yield
    finally:
        if enabled:
            gc.enable()


_REPLAY_LOG: list | None = None  # (step, start, end) per replay while ``logging_replays`` is active


@contextlib.contextmanager
def logging_replays():
    """Within it, every ``GraphedStep`` replay is timed into the yielded list as (step, start,
    end): CUDA events recorded around the replay (a CUDA graph), else ``perf_counter`` stamps (the
    CPU stand-ins). ``replay_seconds`` sums them per step. What a loop part's device time holds
    besides its graph: the part minus its replays is the eager work and the waits around them."""
    global _REPLAY_LOG
    outer, _REPLAY_LOG = _REPLAY_LOG, []
    try:
        yield _REPLAY_LOG
    finally:
        _REPLAY_LOG = outer


def replay_seconds(log: list, names: dict[int, str]) -> dict[str, float]:
    """Seconds of the logged replays per step name (``names``: ``id(step)`` -> name; other steps
    under their class name); synchronises the device once when the log holds CUDA events."""
    if any(isinstance(start, torch.cuda.Event) for _, start, _ in log):
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for step, start, end in log:
        sec = start.elapsed_time(end) / 1e3 if isinstance(start, torch.cuda.Event) else end - start
        name = names.get(id(step), type(step).__name__)
        out[name] = out.get(name, 0.0) + sec
    return out


def _stamp(graph):
    if isinstance(graph, torch.cuda.CUDAGraph):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def replay(graph, owner) -> None:
    """``graph.replay()``, timed into ``logging_replays``'s list under ``owner`` when one is active."""
    log = _REPLAY_LOG
    if log is None:
        graph.replay()
        return
    start = _stamp(graph)
    graph.replay()
    log.append((owner, start, _stamp(graph)))


def new_pool():
    """A graph memory pool that stays valid while referenced (module doc): a ``torch.cuda.MemPool``
    where torch has it, else a ``graph_pool_handle()`` id (older torch)."""
    mem_pool = getattr(torch.cuda, "MemPool", None)
    return mem_pool() if mem_pool is not None else torch.cuda.graph_pool_handle()


def pool_id(pool):
    """The id ``torch.cuda.graph(pool=...)`` takes, for a ``new_pool()`` result or a bare id."""
    return pool if pool is None or isinstance(pool, tuple) else pool.id


class GraphedStep:
    def __init__(self, step, max_tokens: int = 64, warmup: int | None = None, pool=None,
                 eager_first: bool | None = None):
        """``eager_first`` with ``warmup=0``: for a step that is not idempotent (an in-place state
        update such as KV compaction): the first call of a signature runs eagerly (kernels compile
        there), the second is captured without running it and then replayed once, so every call
        does the work exactly once. Left None, both follow from the step's declared state
        (``idempotent_step``): 2 warm-ups for an idempotent step, else eager first."""
        idempotent = idempotent_step(step) if warmup is None or eager_first is None else True
        self.step, self.max_tokens = step, max_tokens
        self.warmup = (2 if idempotent else 0) if warmup is None else warmup
        self.eager_first = (not idempotent) if eager_first is None else eager_first
        self._seen = set()
        self.graphs: dict = {}
        self.eager_reasons: dict = {}
        self.pool = pool  # None: a pool of its own (``new_pool``), made at the first capture
        self.replays = 0
        self.eager_calls = 0

    def _run(self, *args):
        """Call the wrapped step (a subclass may map the positional signature onto its own)."""
        return self.step(*args)

    @property
    def captures(self) -> int:
        return len(self.graphs)

    def stats(self) -> dict:
        """Graphs captured, replays, eager calls and why any shape could not be captured."""
        return {"captures": self.captures, "replays": self.replays, "eager_calls": self.eager_calls,
                "eager_reasons": {str(_plain(k)): v for k, v in self.eager_reasons.items()}}

    def eager(self, *args):
        """Run the step without a graph: for one-off shapes (a drafter's first call over a
        whole prompt) that would otherwise cost a capture each."""
        self.eager_calls += 1
        return self._run(*args)

    def _on_device(self, tensor: torch.Tensor) -> bool:
        """Whether calls whose first tensor is ``tensor`` can be graphed: on CUDA (a CPU stand-in
        of the graphs, for tests and host-time profiles, says yes)."""
        return tensor.is_cuda

    def __getattr__(self, name):  # device, spec, config... of the wrapped step
        return getattr(self.__dict__["step"], name)

    def setup_caches(self, *args, **kwargs):
        """Allocate the step's decoding state (returns the wrapped step's ``DecodingState``)."""
        self.graphs.clear()  # captured graphs point at the old cache tensors
        return self.step.setup_caches(*args, **kwargs)

    @staticmethod
    def _key(args):
        return tuple((tuple(a.shape), a.dtype) if torch.is_tensor(a) else a for a in args)

    def _signature(self, args):
        """The call's graph key, or None when it runs eagerly: no tensor argument, the first
        tensor not on the device (``_on_device``), or a token dimension over ``max_tokens``. It is
        computed before every replay, on the step's critical path (at batch 1 the GPU waits for
        it), so the test and the key are one pass over the arguments, the shapes kept as
        ``torch.Size`` (equal to, and hashing as, the tuples ``_key`` makes)."""
        key, device_checked, limit = [], False, self.max_tokens
        for a in args:
            if isinstance(a, torch.Tensor):
                if not device_checked:
                    if not self._on_device(a):
                        return None
                    device_checked = True
                shape = a.shape
                if len(shape) > 1 and shape[1] > limit:
                    return None
                key.append((shape, a.dtype))
            else:
                key.append(a)
        return tuple(key) if device_checked else None

    def __call__(self, *args):
        key = self._signature(args)
        if key is None or key in self.eager_reasons:
            self.eager_calls += 1
            return self._run(*args)
        entry = self.graphs.get(key)
        if entry is None and self.eager_first and key not in self._seen:
            self._seen.add(key)
            self.eager_calls += 1
            return self._run(*args)
        if entry is None:
            entry = self._capture(args, key)
            if entry is None:
                self.eager_calls += 1
                return self._run(*args)
        static_in, graph, out = entry
        for buf, a in zip(static_in, args):
            if torch.is_tensor(a):
                buf.copy_(a, non_blocking=True)
        replay(graph, self)
        self.replays += 1
        return out

    def _capture(self, args, key):
        static_in = [a.clone() if torch.is_tensor(a) else a for a in args]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                for _ in range(self.warmup):
                    self._run(*static_in)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = new_pool()
            with capture(graph, self.pool):
                out = self._run(*static_in)
        except Exception as exc:  # a host sync or an unsupported op inside the step
            torch.cuda.synchronize()
            self.eager_reasons[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return None
        entry = (static_in, graph, out)
        self.graphs[key] = entry
        return entry


def _plain(key):
    """A graph key with its ``torch.Size`` shapes as tuples (how ``stats`` prints it)."""
    if isinstance(key, torch.Size):
        return tuple(key)
    return tuple(_plain(k) for k in key) if isinstance(key, tuple) else key


def unwrapped(step):
    """The callable a ``GraphedStep`` runs (its wrapped step, through any signature mapping of a
    subclass); any other step as it is. What a graph of a larger function (a whole step,
    ``specc.runtime.step_graphs``) calls inside its own capture."""
    return step._run if isinstance(step, GraphedStep) else step
