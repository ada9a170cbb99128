"""Continuous batching: requests join and leave a running batch between speculative steps.

A :class:`BatchScheduler` owns a device loop (``specc.runtime.device_loop.DeviceSpeculativeDecoder``)
opened with ``capacity`` slots (rows of its decoding state). ``submit`` queues a request and
returns its id; each ``step`` first admits queued requests into free slots (each prompt is
prefilled alone into its slot, which yields the request's first token) and then runs one
speculative step over every slot, so requests at different positions, with different prompt
lengths, budgets, EOS ids and sampling parameters (``submit(..., sampling=)``: greedy and
sampled requests mixed), advance together. A request leaves as soon as it finishes (EOS, its
``max_new_tokens``, or ``cancel``) and its slot is free for the next queued one. Every request's
tokens are those it gets alone (greedy verification; sampling: each row's own parameters and the
counter-based random numbers of its seed, ``specc.runtime.policy``): the batch changes what is
computed together, never what a row computes.

Batch buckets (``buckets=True``, the default): a step runs over the first ``width`` slots, the
smallest power of two (at least 2) that holds the running requests; before a step with nobody
waiting the requests past a narrower bucket move into its free slots (``loop.move_slots``) and the
width drops (``loop.set_width``: views of the allocated state, no copy), and before admissions it
grows back to hold the queue, so a step's cost follows the requests running rather than the
slots allocated (docs/batching.md, "Batch buckets"). It narrows only where the narrower width's
steps were measured faster (``BUCKET_GAIN``): a small model's steps cost the same at any width.

This is the object a server drives (docs/batching.md)::

    rid = scheduler.submit(prompt_ids, max_new_tokens=64, eos_token_ids=(2,))
    while not scheduler.idle:
        for event in scheduler.step():      # StepEvent(rid, tokens, finished, finished_by)
            send(event.rid, event.tokens)
    result = scheduler.take(rid)            # GenerationResult (tokens + stats) once finished

It is not thread-safe: one thread calls ``submit`` / ``step`` / ``cancel``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time

import torch

from specc.result import GenerationResult, GenerationStats, as_prompt_list, check_vocab, clip_committed
from specc.runtime.adaptive import AcceptanceEstimate
from specc.sampling.params import SamplingParams

__all__ = ["StepEvent", "BatchScheduler", "BUCKET_GAIN"]

# a narrower width is taken only where its steps were measured at least this much faster
BUCKET_GAIN = 0.10


@dataclasses.dataclass
class StepEvent:
    """What one ``step`` did for one request: the tokens it committed (possibly none), whether
    the request is now finished and why ("eos", "length" or "cancelled")."""

    rid: int
    tokens: list[int]
    finished: bool = False
    finished_by: str | None = None


@dataclasses.dataclass
class _Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    eos: tuple[int, ...]
    tokens: list[int] = dataclasses.field(default_factory=list)
    stats: GenerationStats = dataclasses.field(default_factory=GenerationStats)
    slot: int | None = None
    draft_forwards_at_join: int = 0
    acceptance: AcceptanceEstimate = dataclasses.field(default_factory=AcceptanceEstimate)
    seed: int | None = None  # sampling seed (None: the params')
    sampling: SamplingParams | None = None  # the request's params (None: greedy)


class BatchScheduler:
    """Requests over the slots of one device loop (module doc). ``capacity``: slots, the most
    requests decoded together; more wait in a FIFO queue. ``eos_token_ids``: the EOS ids of a
    request submitted without its own (the engine passes the model's). ``draft_length``: a
    goodput rule (``specc.runtime.adaptive``) choosing each step's drafts, or None. ``sampling``:
    the ``SamplingParams`` of a request submitted without its own (None: greedy). ``buckets``:
    step over the smallest bucket of slots that holds the running requests (module doc; False:
    every step over all ``capacity`` slots)."""

    def __init__(self, loop, capacity: int, eos_token_ids=(), draft_length=None, sampling=None,
                 buckets: bool = True):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.loop, self.capacity = loop, capacity
        # batch buckets: step over the first width(running) slots, the running requests moved there
        self.buckets = bool(buckets) and hasattr(loop, "set_width")
        self.fastest_step: dict[int, float] = {}  # width -> the fastest step seen there (seconds)
        self.default_eos = tuple(int(e) for e in eos_token_ids)
        # ``draft_length``: a rule choosing drafts per step from the requests' measured acceptance
        # (``specc.runtime.adaptive.GoodputDraftLength``); None: the loop's fixed k
        self.draft_length = draft_length
        self.last_num_draft: int | None = None  # the rule's drafts last step (per-row: the largest)
        self.last_row_drafts: list[int] | None = None  # per slot, when the rule chose per request
        self.last_request_drafts: list[int] = []  # the drafts each running request was offered last step
        with torch.inference_mode():  # the loop's state lives in inference mode
            loop.open_slots(capacity, sampling)  # the default params; a request may bring its own
        self.sampling = _check_sampling(sampling)
        self._ids = itertools.count()
        self._queue: collections.deque[_Request] = collections.deque()
        self._slots: list[_Request | None] = [None] * capacity
        self._finished: dict[int, GenerationResult] = {}

    # --- the server-facing surface -----------------------------------------------------------

    def submit(self, prompt_ids, max_new_tokens: int, eos_token_ids=None, seed: int | None = None,
               sampling: SamplingParams | None = None) -> int:
        """Queue a request; returns its id. ``eos_token_ids``: an id, ids, () for none, or None
        for the scheduler's default. ``sampling``: the request's ``SamplingParams`` (None: the
        scheduler's; temperature 0: greedy), its own whatever the other requests use. ``seed``:
        its sampling seed (None: the params' ``seed``; unused when greedy). Raises ValueError for
        an empty prompt, an id past the loop's ``vocab_size`` (when it knows one), a negative budget,
        or a prompt + budget that does not fit the loop's ``max_len``; TypeError for text or ids that
        are not integers, and for ``sampling`` that is not a SamplingParams."""
        prompt = as_prompt_list(prompt_ids)
        if not prompt:
            raise ValueError("empty prompt")
        check_vocab(prompt, getattr(self.loop, "vocab_size", None))
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > self.loop.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds max_len "
                             f"{self.loop.max_len}")
        if eos_token_ids is None:
            eos = self.default_eos
        elif isinstance(eos_token_ids, int):
            eos = (eos_token_ids,)
        else:
            eos = tuple(int(e) for e in eos_token_ids)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        params = self.sampling if sampling is None else _check_sampling(sampling)
        request = _Request(next(self._ids), prompt, max_new_tokens, eos, seed=seed,
                           sampling=None if params is None or params.greedy else params)
        if hasattr(self.draft_length, "new_estimate"):  # the rule's prior (the acceptance it was priced with)
            request.acceptance = self.draft_length.new_estimate()
        self._queue.append(request)
        return request.rid

    def step(self) -> list[StepEvent]:
        """Admit queued requests into free slots, then one speculative step over the batch.
        One event per request that committed tokens or finished, in slot order."""
        merged: dict[int, StepEvent] = {}
        for event in self.admit() + self.decode():
            seen = merged.get(event.rid)
            if seen is None:
                merged[event.rid] = event
            else:
                seen.tokens += event.tokens
                seen.finished, seen.finished_by = event.finished, event.finished_by
        return list(merged.values())

    @torch.inference_mode()
    def cancel(self, rid: int) -> bool:
        """Drop a queued or running request (its slot is freed now); False if it is unknown or
        already finished. Its partial result stays available to ``take`` (finished_by "cancelled")."""
        for request in self._queue:
            if request.rid == rid:
                self._queue.remove(request)
                self._finish(request, "cancelled")
                return True
        for request in self._slots:
            if request is not None and request.rid == rid:
                self._finish(request, "cancelled")
                return True
        return False

    def take(self, rid: int) -> GenerationResult:
        """The finished request's result (tokens and stats), forgotten after this call."""
        try:
            return self._finished.pop(rid)
        except KeyError:
            raise KeyError(f"request {rid} is not finished (or was already taken)") from None

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self._queue and all(r is None for r in self._slots)

    @property
    def running(self) -> list[int]:
        """Ids of the requests in slots, in slot order."""
        return [r.rid for r in self._slots if r is not None]

    @property
    def queued(self) -> list[int]:
        return [r.rid for r in self._queue]

    @property
    def num_running(self) -> int:
        return sum(r is not None for r in self._slots)

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    # --- the two halves of a step --------------------------------------------------------------

    @torch.inference_mode()
    def admit(self) -> list[StepEvent]:
        """Prefill queued requests into free slots (a slot freed by a request that finishes at
        its first token is reused at once). Each admitted request's first token is an event."""
        events = []
        self._widen()
        while self._queue and None in self._slots[:self.width]:
            request = self._queue.popleft()
            if request.max_new_tokens == 0:
                self._finish(request, "length")
                events.append(StepEvent(request.rid, [], True, "length"))
                continue
            slot = self._slots.index(None)
            request.slot, self._slots[slot] = slot, request
            request.draft_forwards_at_join = self._draft_forwards()
            first = self.loop.prefill_slot(slot, request.prompt, request.seed,
                                           request.sampling or SamplingParams())  # greedy: explicit
            request.stats.target_forwards += 1
            events.append(self._commit(request, [first]))
        return events

    @torch.inference_mode()
    def decode(self) -> list[StepEvent]:
        """One speculative step over the running requests (none: nothing happens)."""
        running = [r for r in self._slots if r is not None]
        if not running:
            return []
        self._narrow(running)
        budgets = [0 if r is None else r.max_new_tokens - len(r.tokens) for r in self._slots[:self.width]]
        k, ks = self._choose_drafts(running)
        self.last_num_draft, self.last_row_drafts = k, ks
        if k is None:
            self.last_request_drafts = []
        else:
            self.last_request_drafts = [k] * len(running) if ks is None else [ks[r.slot] for r in running]
        width, start = self.width, time.perf_counter()
        if self.draft_length is None and getattr(self.loop, "runs_ahead", False):  # the next call is known
            host, nodes = self.loop.speculate(budgets, None, ahead=True)
        else:
            host, nodes = self.loop.speculate(budgets, k if ks is None else ks)
        seconds = time.perf_counter() - start  # the step ends in its host read
        self.fastest_step[width] = min(seconds, self.fastest_step.get(width, seconds))
        level2 = set(getattr(self.loop, "last_level2_rows", ()))
        events = []
        for request in running:
            row = host[request.slot]
            if k is not None:
                offered = k if ks is None else ks[request.slot]
                request.acceptance.observe(min(offered, request.max_new_tokens - len(request.tokens) - 1), row[0])
            request.stats.target_forwards += 1
            request.stats.level2_steps += request.slot in level2
            before = len(request.tokens)
            event = self._commit(request, row[1:row[0] + 2])
            request.stats.accepted_lengths.append(len(request.tokens) - before)
            if nodes:
                request.stats.tree_nodes.append(nodes)
            events.append(event)
        return events

    def _choose_drafts(self, running: list[_Request]) -> tuple[int | None, list[int] | None]:
        """(k, per-slot drafts or None): the draft-length rule's choice for this step. With a
        loop that verifies ragged and a rule that prices packed steps (``ragged_seconds``), the
        rule chooses per request (``choose_rows``; free slots 0), else one k for the batch
        (``choose``), which the loop verifies dense: a rule without ``ragged_seconds`` is the
        goodput rule's one k per step, and packing rows of one k would only add the packing.
        (None, None): no rule, the loop's k."""
        rule = self.draft_length
        if rule is None or self.loop.drafter is None:
            return None, None
        alphas = [r.acceptance.alpha for r in running]
        caps = [r.max_new_tokens - len(r.tokens) - 1 for r in running]
        if (getattr(self.loop, "verifies_ragged", False) and hasattr(rule, "choose_rows")
                and getattr(rule, "ragged_seconds", True) is not None):
            chosen = rule.choose_rows(alphas, caps, self.width)
            ks = [0] * self.width
            for request, kb in zip(running, chosen):
                ks[request.slot] = int(kb)
            return max(chosen), ks
        return rule.choose(alphas, caps, self.width), None

    # --- batch buckets -------------------------------------------------------------------------

    @property
    def width(self) -> int:
        """The slots a step runs over now (the loop's width; without buckets, the capacity)."""
        return getattr(self.loop, "batch", self.capacity)

    def bucket(self, requests: int) -> int:
        """The width for ``requests`` running requests: the smallest power of two that holds
        them (at least 2: batch 1 drafts and steps differently), at most the capacity."""
        width = 2
        while width < requests:
            width *= 2
        return min(width, self.capacity)

    def _widen(self) -> None:
        """Before admissions: a width that holds the running and queued requests."""
        if not self.buckets or not self._queue or not self.loop.width_can_change:
            return
        wanted = self.bucket(self.num_running + len(self._queue))
        if wanted > self.width:
            self.loop.set_width(wanted)

    def _narrow(self, running: list[_Request]) -> None:
        """Before a step with nobody waiting: move the running requests into the first slots
        and step over the smallest bucket that holds them, so a step's cost follows the requests
        running, not the slots allocated."""
        if not self.buckets or self._queue or not self.loop.width_can_change:
            return
        wanted = self.bucket(len(running))
        if wanted >= self.width or not self._narrowing_pays(wanted):
            return
        free = [slot for slot in range(wanted) if self._slots[slot] is None]
        moves = []
        for request in running:
            if request.slot >= wanted:
                dst = free.pop(0)
                moves.append((request.slot, dst))
                self._slots[dst], self._slots[request.slot] = request, None
                request.slot = dst
        self.loop.move_slots(moves)
        self.loop.set_width(wanted)

    def _narrowing_pays(self, wanted: int) -> bool:
        """Whether a step at width ``wanted`` is at least ``BUCKET_GAIN`` faster than one at the
        current width: the fastest steps seen at each, an unseen narrower one predicted by a line
        through the widths seen (a step's cost grows about linearly with its rows; with one width
        seen, or none: yes, to find out). Where steps cost the same at every width (small
        launch-bound models) moving requests and rebinding the state only adds time: -13% over
        a drain of specc-tiny on the H100 before this check (docs/benchmarks/run24.md)."""
        now = self.fastest_step.get(self.width)
        narrow = self.fastest_step.get(wanted)
        if narrow is None and len(self.fastest_step) >= 2:
            narrow = _line_at(self.fastest_step, wanted)
        return now is None or narrow is None or narrow <= (1.0 - BUCKET_GAIN) * now

    def run(self, requests) -> list[GenerationResult]:
        """Submit ``(prompt, max_new_tokens, eos_token_ids[, seed[, sampling]])`` requests, step
        until all finish, and return their results in order (``generate_batch``)."""
        rids = [self.submit(*request) for request in requests]
        while not self.idle:
            self.step()
        return [self.take(rid) for rid in rids]

    # --- bookkeeping -----------------------------------------------------------------------------

    def _commit(self, request: _Request, tokens: list[int]) -> StepEvent:
        step, stop = clip_committed(tokens, len(request.tokens), request.max_new_tokens, request.eos)
        request.tokens += step
        if not stop:
            return StepEvent(request.rid, step)
        result = self._finish(request, None)
        return StepEvent(request.rid, step, True, result.finished_by)

    def _finish(self, request: _Request, why: str | None) -> GenerationResult:
        if request.slot is not None:
            self.loop.release_slot(request.slot)
            self._slots[request.slot] = None
            request.stats.draft_forwards = self._draft_forwards() - request.draft_forwards_at_join
            request.slot = None
        result = GenerationResult.finish(request.tokens, request.stats, self.loop.method, request.eos)
        if why is not None:
            result.finished_by = why
        self._finished[request.rid] = result
        return result

    def _draft_forwards(self) -> int:
        drafter = self.loop.drafter
        return drafter.forwards if drafter is not None else 0


def _line_at(points: dict[int, float], x: int) -> float:
    """The least-squares line through ``points`` (x -> y, at least two x), evaluated at ``x``."""
    n = len(points)
    mean_x, mean_y = sum(points) / n, sum(points.values()) / n
    spread = sum((px - mean_x) ** 2 for px in points)
    slope = sum((px - mean_x) * (py - mean_y) for px, py in points.items()) / spread
    return mean_y + slope * (x - mean_x)


def _check_sampling(sampling) -> SamplingParams | None:
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams or None, got {type(sampling).__name__}")
    return sampling
