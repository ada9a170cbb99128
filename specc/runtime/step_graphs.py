"""Whole-step CUDA graphs at batch 1: draft, verify, accept and commit as one replay.

Why. At batch 1 a greedy chain step is three CUDA graphs (drafter, target, chain acceptance)
with eager glue between them: the drafting block's ``cat``, each graph's static input copies,
the argmax over the drafter's logits, and the host's Python before each launch. The GPU idles
through every launch it waits for. On the H200 (docs/benchmarks/h200-run9.md, Qwen3-8B +
DFlash-b16) a 6.55 ms chain step spent ~0.35 ms of its draft part and ~0.13 ms of its accept part
outside their graphs, and 0.09 ms between steps; the compiled AR step ~0.23 ms of 4.63 ms.

What. :class:`StepGraphs` captures, per (k, drafting key, tree budget, sampling), one CUDA graph of the whole step over
buffers at fixed addresses: the loop's committed tokens ``seq``, the target state's ``lengths``
(at batch 1 the committed count minus one), a context buffer for DFlash (the target's hidden
states of the step's block, which the next draft reads) and a small output buffer ``[1, k + 2]``
(accepted count, then the committed tokens). The drafting key is what changes a draft's shapes
from step to step (DFlash: the context entries to feed, i.e. the last step's accepted + 1; PARD
and the AR drafter: the committed tokens not yet fed), given by the drafter's
``device_draft_key``; everything else the step needs is computed on the device from ``lengths``.
So a step costs the host one replay and the one device -> host copy it always had; with
``ahead`` (the scheduler's promise that it will step again unchanged) the next step's graph is
launched right after that copy, before the scheduler's bookkeeping, and the GPU never waits for
the host between steps except for the copy itself.

The graph runs the very same calls as the unfused step (the drafter and target steps unwrapped
from their ``GraphedStep``, the loop's ``_accept_chain``), so its tokens and logits are the same
bits. It is captured without running (a capture records kernels, it executes none), so a step
whose state is not idempotent (a hybrid target) is fine. Captures happen at the first step that
can use them, for every key of that k at once, and only after an unfused step of the same k has
run (every kernel is then compiled: nothing compiles during a capture).

Tree steps (``tree_budget`` N > 0) are one graph the same way: the drafter's logits, the tree's
plan, the tree verify, acceptance, the KV compaction of the accepted path and the path's hidden
states for DFlash, the same calls as the unfused tree step (``DeviceSpeculativeDecoder._tree_step``).

Speculative sampling (a ``SamplingPolicy``) is one graph too for chain steps with a parallel
drafter (or plain AR) and no repetition penalty: the drafts drawn from the drafter's processed
distributions, the target, the rejection test and the commit, the same calls as the unfused step
(``SamplingPolicy.draft`` / ``verify_chain`` / ``observe``). The graphs read the policy's row tensors
(params, seeds), written in place when a request enters (``start_row``); the loop keeps one policy
per batch size across generations (``SamplingPolicy.restart``), so its graphs stay valid, and the
processors some row has used (top-k, top-p, min-p) are part of the key.

Where it applies (``StepGraphs.key``): batch 1, a live row, a greedy chain step in one level (no
per-request k), a greedy tree step, or a sampled chain step as above; a drafter with a device
draft for the current key (or plain AR), graphed steps that would graph this verify, and no
per-part profile. Everywhere else the loop
runs its unfused step, whose parts it can time. On by default for loops ``engine.build_loop``
makes on CUDA (``DeviceSpeculativeDecoder.step_graphs``; ``SPECC_STEP_GRAPHS=0`` turns it off): on
the H200 at Qwen3-8B + DFlash-b16 shapes it took 4.1% off the chain's decode step and 4.7% off
AR's (``examples/bench_tree.py --e2e-8b``, docs/benchmarks/h200-run15.md), and its GPU exactness
test (tests/runtime/test_step_graphs_gpu.py: chains, trees, sampled chains and plain AR equal
the unfused loop) passes (docs/benchmarks/h100-run16.md).
"""

from __future__ import annotations

import torch

from specc.runtime.graphs import GraphedStep, capture, new_pool, replay, unwrapped
from specc.switches import env_switch
from specc.sampling import rng


ENV = "SPECC_STEP_GRAPHS"


def step_graphs_enabled() -> bool:
    """Whether loops built by ``engine.build_loop`` on CUDA use whole-step graphs: yes unless
    ``SPECC_STEP_GRAPHS`` = 0 (off, false; empty or unset: on)."""
    return env_switch(ENV, True)


def cuda_capture(body, pool):
    """A ``torch.cuda.CUDAGraph`` of ``body()`` captured into ``pool`` (recorded, not run)."""
    if pool is None:
        raise ValueError("a CUDA capture needs a memory pool (graphs.new_pool)")
    graph = torch.cuda.CUDAGraph()
    with capture(graph, pool):
        body()
    return graph


class StepGraphs:
    """The whole-step graphs of one ``DeviceSpeculativeDecoder`` (module doc). ``capture(body,
    pool)`` makes a graph (an object with ``replay()``) of ``body``; the CPU tests pass a stand-in.
    Valid for one ``seq`` buffer and one decoding state: the loop drops it with them."""

    def __init__(self, loop, capture=cuda_capture):
        self.loop, self._capture = loop, capture
        self.seq = loop.seq
        target = loop.target
        self.pool = getattr(target, "pool", None)  # the loop's graphed steps' pool (made at a CUDA capture if none)
        self.graphs: dict = {}  # (k, drafting key, tree budget, sampling) -> graph
        self.out: dict[int, torch.Tensor] = {}  # k -> [1, k + 2] (accepted, committed tokens)
        self.context: torch.Tensor | None = None  # [1, k + 1, n*H]: the target's hidden states of the block
        self.failed: dict = {}  # key -> why its capture failed (the step then runs unfused)
        self.compiled: set[tuple] = set()  # (k, tree budget, sampled) of unfused steps run so far (kernels compiled)
        self.policy = None  # the SamplingPolicy the sampled graphs read (a new one drops them)
        self.replays = self.eager_calls = 0  # (the counters ``warm_up`` resets; no step runs eagerly here)
        # called after the host reads a step's result: where a host-time profile starts the window the
        # GPU waits through until the next launch (examples/profile_batching_host.py --step-graphs)
        self.on_result = getattr(loop, "step_graph_on_result", None)
        dev = target.device
        width = 2 * (loop.num_draft + 2)
        self.offsets = torch.arange(width, device=dev)[None]  # owned here: graphs read it

    # --- when a step can be one graph ------------------------------------------------------------

    def key(self, k: int) -> tuple | None:
        """The graph key of the loop's next step with k drafts, or None when it must run unfused
        (module doc). The graph itself may not be captured yet."""
        loop = self.loop
        if loop.seq is not self.seq or loop.batch != 1 or not loop.live[0]:
            return None
        drafter = loop.drafter
        tree = loop.tree_budget if drafter is not None and k > 0 else 0
        sampling = self._sampling_key(loop.policy, drafter, tree)
        if sampling is False:  # a policy whose step is not captured
            return None
        verify, rows = (loop.tree_target, tree + 1) if tree else (loop.target, k + 1)
        if getattr(verify, "max_tokens", rows) < rows:  # the verify step is not graphed now
            return None
        if drafter is None:
            key = (k, 0, 0, sampling) if k == 0 else None
        elif k < 1:
            return None
        else:
            draft_key = drafter.device_draft_key(loop.n, k)
            key = None if draft_key is None else (k, draft_key, tree, sampling)
        return None if key is None or key in self.failed else key

    def _sampling_key(self, policy, drafter, tree: int):
        """None for greedy steps; for speculative sampling ("sample", the processors some row uses)
        when its step can be one graph (a chain, no repetition penalty, a parallel drafter or
        none), else False. A policy other than the one the sampled graphs read drops them."""
        if not hasattr(policy, "rows"):  # GreedyPolicy
            return None
        if tree or policy.seen is not None or (drafter is not None and not drafter.supports_tree):
            return False
        if policy is not self.policy:
            for key in [key for key in self.graphs if key[3] is not None]:
                del self.graphs[key]
            self.policy = policy
        return ("sample", frozenset(policy.rows.used))

    def ran_unfused(self, k: int, tree: int = 0, sampled: bool = False) -> None:
        """An unfused step with k drafts (a tree of ``tree`` nodes; sampled or greedy) has run: its
        kernels are compiled."""
        self.compiled.add((k, tree, sampled))

    def ready(self, key: tuple) -> bool:
        """Whether ``key``'s graph exists, capturing every key of its k first when an unfused step
        of that k has run (False: run this step unfused)."""
        if key in self.graphs:
            return True
        k, _, tree, sampling = key
        if (k, tree, sampling is not None) not in self.compiled:
            return False
        keys = [key]
        drafter = self.loop.drafter
        if drafter is not None:
            keys = [(k, d, tree, sampling) for d in drafter.device_draft_keys(k)]
            if key not in keys:
                keys.append(key)
        for each in keys:
            if each not in self.graphs and each not in self.failed:
                self._capture_key(each)
        return key in self.graphs

    def _capture_key(self, key: tuple) -> None:
        loop = self.loop
        k = key[0]
        loop._arange(k + 1)  # the loop's cached ranges, made outside the capture (graphs read them)
        loop._arange(k + 2)
        if loop.drafter is not None:
            loop.drafter.prepare_device_draft(k)
        self.prepare_context(k)  # the context buffer exists before a graph reads it
        if k not in self.out:
            self.out[k] = torch.zeros(1, k + 2, dtype=torch.long, device=loop.target.device)
        self._warm_glue(k)
        if self.pool is None and loop.target.device.type == "cuda":
            self.pool = new_pool()
            if isinstance(loop.target, GraphedStep) and loop.target.pool is None:
                loop.target.pool = self.pool
        try:
            self.graphs[key] = self._capture(lambda: self._body(*key), self.pool)
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured runs unfused
            if loop.target.device.type == "cuda":
                torch.cuda.synchronize()
            self.failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def _tree_body(self, k: int, draft_key, tree: int) -> None:
        """``DeviceSpeculativeDecoder._tree_step`` at batch 1, greedy: plan a tree of ``tree``
        nodes from the drafter's logits, verify it, accept a root path, commit it (the KV
        compaction) and keep its hidden states for DFlash."""
        loop = self.loop
        seq, lengths = loop.seq, loop.state.lengths
        root = seq.gather(1, lengths[:, None])[:, 0]
        draft_logits = loop.drafter.draft_on_device(seq, lengths, draft_key, k, self.context, self.offsets,
                                                    logits=True)
        tokens, parents, depths, positions, mask = loop.tree_verifier.plan(draft_logits, root, lengths, tree,
                                                                           loop.tree_topk)
        out = unwrapped(loop.tree_target)(tokens, positions, lengths, mask)
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        accepted, committed, path = loop._accept_tree(tokens, parents, depths, mask, logits, None, k)
        loop._write_committed(committed)
        loop._commit_path(accepted + 1, path)
        if hidden is not None and self.context is not None:
            along = loop._along_path(hidden, path)
            self.context[:, :along.shape[1]].copy_(along)
        self.out[k].copy_(torch.cat([accepted[:, None], committed], dim=1))

    def _warm_glue(self, k: int) -> None:
        """Run the graph's own index ops once outside any capture (reads only), so that none of
        their kernels is loaded for the first time inside one (lazy module loading)."""
        lengths, seq = self.loop.state.lengths, self.loop.seq
        last = seq.gather(1, lengths[:, None])
        torch.cat([last, (lengths[:, None] + self.offsets[:, :k + 1]).clamp(max=0)], dim=1)
        torch.cat([(lengths - 1)[:, None], last], dim=1)

    # --- the step --------------------------------------------------------------------------------

    def _body(self, k: int, draft_key, tree: int, sampling) -> None:
        """The step on the device: reads only ``seq``, the state, ``context``, owned ranges (and a
        sampling policy's row tensors), writes the state, ``seq``, ``context`` and ``out[k]``.
        Host values are the key's."""
        if tree:
            return self._tree_body(k, draft_key, tree)
        loop = self.loop
        seq, lengths = loop.seq, loop.state.lengths
        q = None
        if k and sampling is None:
            drafts = loop.drafter.draft_on_device(seq, lengths, draft_key, k, self.context, self.offsets)
        elif k:  # ``SamplingPolicy.draft`` of a parallel drafter: each position drawn from its q
            q = self.policy.probs(loop.drafter.draft_on_device(seq, lengths, draft_key, k, self.context,
                                                               self.offsets, logits=True), None)
            drafts = rng.sample(q, rng.uniform(self.policy.seeds, (lengths + 1)[:, None] + self.offsets[:, :k],
                                               rng.DRAFT))
        else:
            drafts = seq[:, :0]
        block = torch.cat([seq.gather(1, lengths[:, None]), drafts], dim=1)
        out = unwrapped(loop.target)(block, lengths[:, None] + loop._arange(k + 1), lengths)
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        if sampling is None:
            accepted, committed = loop._accept_chain(drafts, logits, None, None)
        else:  # the unfused sampled step's calls, in its order
            accepted, committed = self.policy.verify_chain(loop.verifier, drafts, q, logits, None, lengths)
            self.policy.observe(committed, accepted)
            loop._commit_chain(accepted, committed, None)
        if hidden is not None and self.context is not None:
            self.context[:, :k + 1].copy_(hidden[:, :k + 1])
        self.out[k].copy_(torch.cat([accepted[:, None], committed], dim=1))

    def prepare_context(self, k: int) -> None:
        """Make ``context`` hold what the drafter will read (a DFlash drafter's unfed target hidden
        states): allocated at the first use, copied in when the drafter's context is not already
        a view of it (the first graphed step after an unfused one)."""
        drafter = self.loop.drafter
        source = getattr(drafter, "context", None) if drafter is not None and drafter.needs_target_hidden else None
        if source is None:
            return
        if self.context is None:
            width = max(k, self.loop.num_draft) + 1  # the widest block of any k
            self.context = torch.zeros(1, width, source.shape[-1], dtype=source.dtype, device=source.device)
        if source.data_ptr() != self.context.data_ptr() or source.stride() != self.context.stride():
            c = min(source.shape[1], self.context.shape[1])
            self.context[:, :c].copy_(source[:, :c])

    @property
    def captures(self) -> int:
        return len(self.graphs)

    def launch(self, key: tuple) -> None:
        """Replay ``key``'s graph (captured: ``ready``); its result is read by :meth:`result`.
        Timed into ``graphs.logging_replays``'s list when one is active."""
        self.prepare_context(key[0])
        replay(self.graphs[key], self)
        self.replays += 1

    def result(self, k: int) -> list[list[int]]:
        """The launched step's rows ``[[accepted, committed tokens...]]``: the step's one device ->
        host copy."""
        rows = self.out[k].tolist()
        if self.on_result is not None:
            self.on_result()
        return rows

    def stats(self) -> dict:
        """What ``graph_stats`` reports for the whole-step graphs."""
        return {"captures": len(self.graphs), "replays": self.replays, "eager_calls": self.eager_calls,
                "eager_reasons": {str(key): why for key, why in self.failed.items()}}
