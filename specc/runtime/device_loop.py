"""The production speculative loop: batch-shaped state on the device, one small host copy per step.

Every piece of loop state is per row (slot): the committed sequences ``seq`` [B, L] (device), the
target's ``DecodingState`` whose ``lengths`` [B] count the tokens each row has in the target
cache (= committed - 1: the last committed token is fed by the next step), per-row committed
counts and live flags (host mirrors, updated from the step's one device -> host copy). Batch 1
is one case of it. A request enters a slot by ``prefill_slot`` (its prompt alone, a batch-1
forward on views of the slot's state rows, so prompts of any lengths share a batch) and leaves
by ``release_slot``; ``speculate`` runs one step over every slot of the current width: the first
``batch`` of the ``capacity`` slots allocated (``set_width`` binds views of those rows, a batch
bucket; ``move_slots`` moves requests into a lower slot first). ``specc.runtime.batching``
schedules requests over the slots (continuous batching); ``generate`` / ``generate_batch`` go
through it. Drafters read ``seq`` and return drafts [B, k] as device tensors
(``Drafter.propose_rows``), the verify input is assembled on the device, the verifier
(``specc.runtime.verifiers.ChainVerifier``: greedy acceptance, one batched kernel) decides per
row on the device, the committed tokens are written back into ``seq`` and the state's lengths
advance on the device (greedy, one level: decision and commit are one function of device tensors,
``_accept_chain``, one CUDA graph on a GPU as the tree step's functions are); the host learns the
step's outcome from one copy of B x (k + 2) integers. An AR drafter feeds each draft to the next forward without leaving the GPU. A free
slot stays in the batch but commits nothing (its draft cap is 0 and its length is frozen).

Tree mode (``tree_budget`` N > 0 with a drafter that gives per-position distributions,
``Drafter.supports_tree``): each step builds a draft tree of N drafted nodes from the drafter's
per-position logits on the device (``specc.runtime.trees.build_tree``), runs the target's tree
verify step (``tree_target``: the model definition with ``tree_mask``, or the compiled
``TreeTargetStep``) once over the N + 1 nodes with their ancestor mask and positions base + depth,
accepts the longest matching root path (``TreeVerifier``), commits the path's tokens plus the
target's token at its last node, compacts the path's K/V into place
(``DecodingState.commit(accepted + 1, path)``) and hands DFlash the target's hidden states
gathered along the path. Still one host copy per step, and static shapes (N per budget).

Ragged verify (``ragged_target``: a step with ``ragged_rows``, by default the target itself when it
has them, e.g. ``CausalLM``): with per-request draft lengths (``speculate(budgets, [k_b, ...])``)
or two-level verification, when rows verify different numbers of tokens (their own k_b, a cap at
their budget, none for a free slot), the live rows' blocks [last, d_1 .. d_k_b] are packed into
one [1, T] forward with no padding (``specc.runtime.ragged.PackedRows``) and its outputs
unpacked into the padded [B, k + 1, ...] layout the verifiers and drafters take, so acceptance is
decided exactly as before. Drafting still drafts the largest k_b for every row in one batched
forward; only verification is per row. A step with one k for the batch and one level verifies
dense as before (free slots ride along).

Two-level verification (``two_level_k1`` = k1, chain steps, greedy and sampling; needs a ragged
step): level 1 verifies [last, d_1 .. d_k1] of every live row; the rows that accepted all k1
drafts (and drafted more) go on to level 2, a packed verify of their d_k1+1 .. d_k_b written right
after level 1's entries. Level 1's decision stands for the rows that stopped there; greedy, the
verifier decides the rest of the others' drafts on level 2's logits (``start`` = k1, ``rows``);
sampling, the policy verifies the two levels' logits joined per row. Either way the decision is
exactly a one-level verify's (sampling: the same per-position random numbers, the same tokens). Level 2's rows are known only after level 1 (a second small
device -> host copy per step). Without a ragged step (e.g. a hybrid target, whose recurrent state
cannot continue from level 1's), and in the batch-invariant kernel mode (``verifies_ragged``), the
loop verifies in one level.

At temperature > 0 the decoding policy (``specc.runtime.policy``: each request's own sampling
parameters and seed, set at its prefill; greedy requests may share the batch) samples the drafts
and verifies by speculative sampling (``specc.runtime.sampling_verify``) at the same points of the
step; while every request is greedy the loop makes the calls it always made.

Drafting ahead (``draft_ahead``, opt-in until timed on a GPU; batch 1, greedy chains, the loop's own k):
a step whose caller will step again with the budgets it leaves (``speculate(..., ahead=True)``:
the scheduler without a draft-length rule) launches the next step's draft right after its host
copy and the drafter's bookkeeping, before returning, so the GPU drafts while the host does the
scheduler's work (EOS checks, events, token lists) and the next step's Python. The draft is the
one the next step would make (the same call on the same state, only earlier); the next step
takes it, and refuses one that does not match its committed length and k. A request that ends
instead releases its slot, which drops the draft (one wasted draft on the GPU at an EOS).

Drafting ahead at batch > 1 (``batch_draft_ahead``, the engine's default on CUDA; greedy chains in one level, every
slot live, the loop's own k, a drafter with ``draft_ahead_rows``: DFlash, PARD): the step copies
its decision to a pinned host buffer behind an event, launches the next step's draft from device
state alone (the drafter's full window: DFlash's slid on the device by the accepted counts), and
only then waits for the event, so the GPU drafts while the host reads the decision and does the
step's and the scheduler's bookkeeping. The next step takes the drafts when its committed
lengths and k are the ones they were made for; an admission, a release or a width change drops
them (the drafter's host bookkeeping waits for the step that takes them: ``took_ahead``).

Whole-step graphs (``step_graphs``, set by ``engine.build_loop`` on CUDA unless
``SPECC_STEP_GRAPHS=0``; batch 1, greedy chains in one level, greedy trees, sampled chains): the
step's draft, verify, acceptance and commit as one CUDA graph per drafting shape, over buffers at
fixed addresses, launched ahead of the scheduler's bookkeeping when it promises to
step again (``specc.runtime.step_graphs``). The same calls as the unfused step, so the same tokens;
steps it does not apply to run unfused.

Same algorithm and statistics as the eager reference loop (``specc.runtime.eager``), which is a
separate implementation of the same surface, not a base class of this one.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled
from specc.result import GenerationResult, as_prompt_list
from specc.runtime.loop import SpeculativeLoop
from specc.runtime.policy import GreedyPolicy, SamplingPolicy
from specc.runtime.ragged import PackedRows, ragged_capable
from specc.runtime.state import DecodingState, bind_rows, reserve_block, slot_view, state_buffers
from specc.runtime.trees import DraftTree
from specc.runtime.uploads import upload
from specc.runtime.verifiers import ChainVerifier, TreeVerifier, Verifier


def greedy_accept(drafts: torch.Tensor, posterior: torch.Tensor):
    """drafts [B, k], posterior [B, k + 1] -> (accepted [B], committed [B, k + 1]): the chain
    verifier on the target's greedy tokens (kept for callers of the old name)."""
    return ChainVerifier().verify_tokens(drafts, posterior)


class PartTimer:
    """Wall time per loop part (prefill / draft / verify / accept; a tree step also splits off
    plan, the tree's construction, and commit, the KV compaction, DFlash context and host copy
    after acceptance). Synchronises the device at
    each boundary, so it perturbs what it measures a little: on only when asked (profile=True)."""

    def __init__(self, device: torch.device):
        self.device, self.parts, self._last = device, {}, None

    def mark(self, part: str | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        if self._last is not None:
            name, start = self._last
            self.parts[name] = self.parts.get(name, 0.0) + now - start
        self._last = (part, now) if part else None


class EventTimer:
    """Device time per loop part without synchronising (``profile = "events"``): each boundary
    records a CUDA event (the CPU: host time), and ``parts`` (read after the run; it
    synchronises once) sums the device time between consecutive events per part. The device's
    timeline is continuous, so the parts add up to the run's wall time, and a part's time is
    what it cost the GPU: its kernels, or the host's lateness where the GPU waited for the host
    (``between``: from the end of one step, after its host copy, to the next step's first launch,
    i.e. the host's bookkeeping between steps, during which the GPU idles)."""

    def __init__(self, device: torch.device):
        self.device, self._marks, self._parts = device, [], None
        self._cuda = device.type == "cuda"

    def mark(self, part: str | None) -> None:
        if self._cuda:
            stamp = torch.cuda.Event(enable_timing=True)
            stamp.record()
        else:
            stamp = time.perf_counter()
        self._marks.append((part, stamp))
        self._parts = None

    @property
    def parts(self) -> dict:
        if self._parts is None:
            if self._cuda:
                torch.cuda.synchronize(self.device)
            parts: dict = {}
            for (name, start), (_, end) in zip(self._marks, self._marks[1:]):
                sec = start.elapsed_time(end) / 1e3 if self._cuda else end - start
                parts[name or "between"] = parts.get(name or "between", 0.0) + sec
            self._parts = parts
        return self._parts


class _NoTimer:
    parts: dict = {}

    def mark(self, part) -> None:
        pass


class DeviceSpeculativeDecoder(SpeculativeLoop):
    """``capture_shapes``: before the first generation's first step, call the drafter with every
    input shape it can see (``Drafter.capture_shapes``) so graphed steps are all captured up
    front. Set on CUDA, where the engine also drafts the full k at the end of the budget
    (``cap_to_budget=False``: the surplus is clipped) so that verification has one shape.
    ``batch``: rows the state is allocated for (``generate_batch`` reallocates for another B).
    ``ragged_target``: the step for packed (ragged) verifies, called as ``step(ids [1, T],
    positions [1, T], cache_len [R], row_slots=[R], row_starts=[R + 1])`` and sharing the target's
    state; None: the target itself when it has ``ragged_rows``, else none (every verify is dense). ``two_level_k1``: drafts verified at the
    first level of two-level verification (None: one level; may be set after construction)."""

    # True / "events": time the loop's parts (``part_seconds`` after a run); or a timer class
    # (``device -> timer`` with ``mark(part)`` and ``parts``, e.g. an ``EventTimer`` subclass)
    profile: bool | str | Callable = False
    _timer = _NoTimer()
    capture_shapes = False
    _shapes_captured: set = frozenset()  # widths whose drafting shapes ran (``capture_shapes``)
    _packing = False  # this step packs rows that verify fewer tokens (per-request k or two levels)
    _caps: tuple | None = None  # (per-row caps, their device copy) of the last step
    draft_ahead = False  # batch 1: launch the next step's draft before returning (module doc)
    batch_draft_ahead = False  # batch > 1: launch the next step's draft before the host read (module doc)
    _ahead: tuple | None = None  # ((committed tokens, k), drafts) made ahead for the next step
    _host_buffer: torch.Tensor | None = None  # pinned: the step's decision, read while the GPU drafts ahead
    step_graphs = False  # batch 1: each step as one CUDA graph (``specc.runtime.step_graphs``)
    step_graph_capture = None  # how those graphs are made (None: CUDA graphs; the CPU tests pass a stand-in)
    step_graph_on_result = None  # called when a whole step's result is read (host-time profiles)
    _step_graphs = None  # the ``StepGraphs`` of the current seq buffer and state
    _ahead_step: tuple | None = None  # (committed tokens, graph key) of a whole step launched ahead
    vocab_size: int | None = None  # the target's vocabulary, where known (an engine sets it): larger ids are refused

    def __init__(self, target, drafter=None, num_draft: int = 4, max_len: int = 2048,
                 cap_to_budget: bool = True, verifier: Verifier | None = None, batch: int = 1,
                 tree_budget: int = 0, tree_target=None, tree_topk: int | None = None, ragged_target=None,
                 two_level_k1: int | None = None):
        self.target, self.drafter, self.num_draft = target, drafter, num_draft
        if ragged_target is None and ragged_capable(target):
            ragged_target = target
        self.ragged_target = ragged_target if ragged_capable(ragged_target) else None
        self.two_level_k1 = two_level_k1
        self.last_level2_rows: list[int] = []  # slots whose drafts went on to level 2 in the last step
        self.cap_to_budget = cap_to_budget
        self.verifier = verifier or ChainVerifier()
        # tree verification: N drafted nodes per step (0: chains); tree_target: the target's tree
        # verify step (a model definition serves both; a compiled artifact has a TreeTargetStep)
        self.tree_budget = int(tree_budget) if drafter is not None and drafter.supports_tree else 0
        self.tree_target = tree_target if tree_target is not None else target
        self.tree_topk = tree_topk  # candidate tokens per position (None: the budget; 1: a chain-shaped tree)
        self.tree_verifier = TreeVerifier()
        if drafter is not None and drafter.needs_target_hidden:
            if self.ragged_target is not target and hasattr(self.ragged_target, "capture_layers"):
                self.ragged_target.capture_layers = tuple(drafter.spec.target_layer_ids)
            target.capture_layers = tuple(drafter.spec.target_layer_ids)
        self._steps_k1: dict = {}
        self.resize(max_len, batch)

    def use_verifiers(self, chain: Verifier | None = None, tree: TreeVerifier | None = None) -> None:
        """Swap the chain and/or tree verifier (e.g. an acceptance replay,
        ``specc.runtime.replay``); the tree step's graphs hold the old one, so they are dropped."""
        if chain is not None:
            self.verifier = chain  # drops the chain step's graph (the ``verifier`` setter)
        if tree is not None:
            self.tree_verifier, self._tree_graphs = tree, None
            self._step_graphs, self._ahead_step = None, None  # whole tree steps hold it too

    @property
    def verifier(self) -> Verifier:
        """The chain verifier (greedy decisions; sampling's acceptance tests). Setting it drops
        the chain step's graph, which holds the old one."""
        return self._verifier

    @verifier.setter
    def verifier(self, verifier: Verifier) -> None:
        self._verifier, self._chain_graph = verifier, None
        self._step_graphs, self._ahead_step = None, None  # their graphs hold the old verifier

    def resize(self, max_len: int, batch: int | None = None) -> None:
        """(Re)allocate the decoding state for ``batch`` rows of up to ``max_len`` tokens."""
        self._tree_graphs = None  # the tree step's graphs (commit holds the state's buffers)
        self._chain_graph = None  # the chain step's accept + commit graph (likewise)
        self._step_graphs, self._ahead_step = None, None  # whole-step graphs (likewise)
        self.max_len, self.batch = max_len, batch or getattr(self, "capacity", None) or getattr(self, "batch", 1)
        length = max_len + max(self.num_draft, self.tree_budget) + 1
        if getattr(self.ragged_target, "token_buckets", False):  # room for a bucketed verify's padding
            length += self.ragged_target.pad_room(self.batch * (self.num_draft + 1))
        reserve_block(self.target, max(self.num_draft, self.tree_budget) + 1)  # hybrid targets' per-node states
        state = self.target.setup_caches(self.batch, length)
        if not isinstance(state, DecodingState):  # a model definition allocated its own buffers
            state = DecodingState.adopt(self.target, self.batch, length)
        self.state = self._slots_state = state
        for step in dict.fromkeys((self.tree_target, self.ragged_target)):
            if step is not None and step is not self.target:  # a separate step shares the target's state
                from specc.runtime.graphs import GraphedStep

                graphed = isinstance(step, GraphedStep)
                state.bind(step.step if graphed else step)
                if graphed:
                    step.graphs.clear()  # captured graphs point at the old buffers
        # every slot's buffers as each step holds them: what ``set_width`` binds the first rows of
        self._step_buffers = [(step, state_buffers(step)) for step in
                              dict.fromkeys((self.target, self.tree_target, self.ragged_target)) if step is not None]
        self.capacity = self.batch  # slots allocated; ``batch``: the slots a step runs over (``set_width``)
        if self.drafter is not None:  # room for the shape capture's writes past a full-length prompt
            self.drafter.setup(max_len + 2 * (self.num_draft + 1), self.batch)
            if hasattr(self.drafter, "keep_slots"):  # every slot's caches, as ``_step_buffers`` for the steps
                self.drafter.keep_slots()
        self._shapes_captured = set()  # widths whose drafting shapes ran; graphs went with the old caches
        self._ahead = None

    def _arange(self, n: int) -> torch.Tensor:
        steps = self._steps_k1.get(n)
        if steps is None:
            steps = torch.arange(n, device=self.target.device)[None]
            if n <= 2 * self.num_draft + 2:  # per-step shapes are kept, prompt lengths are not
                self._steps_k1[n] = steps
        return steps

    def _target_rows(self, ids: torch.Tensor):
        """The target over ``ids`` [B, Q] written at each row's ``state.lengths``."""
        lengths = self.state.lengths
        out = self.target(ids, lengths[:, None] + self._arange(ids.shape[1]), lengths)
        return out if isinstance(out, tuple) else (out, None)

    @torch.inference_mode()
    def forced_argmax(self, prompt, tokens, on_block=None) -> list[int]:
        """Target argmax at each position of ``tokens`` when fed them (token forcing): prefill
        on the prompt, then verify-sized blocks through the KV cache (row 0), each committed
        whole as a step's accepted block is (a hybrid target's GDN state: the snapshot of the
        block's last token). ``on_block(logits)``: called after the prefill and after each
        block once it is committed (``specc.verify.state_audit`` reads the state there)."""
        prompt, tokens = as_prompt_list(prompt), list(tokens)
        if self.batch != 1:
            self.resize(self.max_len, 1)
        dev = self.target.device
        self.state.lengths.zero_()
        logits, _ = self._target_rows(torch.tensor([prompt], dtype=torch.long, device=dev))
        self.state.lengths += len(prompt)
        if on_block is not None:
            on_block(logits)
        out = [int(logits[0, -1].argmax())]
        if self.tree_budget:
            return out + self._forced_tree(tokens, on_block)[: len(tokens) - 1]
        block = self.num_draft + 1
        for start in range(0, len(tokens) - 1, block):
            chunk = tokens[start:start + block][: len(tokens) - 1 - start]
            logits, _ = self._target_rows(torch.tensor([chunk], dtype=torch.long, device=dev))
            self.state.commit(torch.full((1,), len(chunk), dtype=torch.long, device=dev))
            if on_block is not None:
                on_block(logits)
            out += logits[0].argmax(-1).tolist()
        return out[: len(tokens)]

    def _forced_tree(self, tokens: list[int], on_block=None) -> list[int]:
        """Token forcing through the tree verify step: each block of stock's tokens is one branch
        of a tree of ``tree_budget + 1`` nodes whose other nodes are distractors (a sibling of
        every branch node, then children of the root), so the mask, the positions and the KV
        compaction of a non-contiguous accepted path are all exercised; the branch is committed."""
        dev = self.target.device
        n_nodes = self.tree_budget + 1
        branch_max = max(1, min(self.num_draft, self.tree_budget // 2))  # branch nodes after the root
        vocab_hint = max(tokens) + 1  # distractor ids stay below the largest id seen
        out: list[int] = []
        start = 0
        while start < len(tokens) - 1:
            chunk = tokens[start:start + branch_max + 1][: len(tokens) - start]
            toks, parents, depths, branch = [chunk[0]], [-1], [0], [0]
            room = n_nodes - len(chunk)  # distractor nodes
            for d in range(1, len(chunk)):
                if room > 0:  # a distractor sibling first: the branch's slots are not contiguous
                    room -= 1
                    toks.append((chunk[d] + 1) % vocab_hint)
                    parents.append(branch[-1])
                    depths.append(d)
                toks.append(chunk[d])
                parents.append(branch[-1])
                depths.append(d)
                branch.append(len(toks) - 1)
            while len(toks) < n_nodes:  # more distractors under the root
                toks.append((chunk[0] + len(toks)) % vocab_hint)
                parents.append(0)
                depths.append(1)

            tree = DraftTree(torch.tensor([toks], device=dev), torch.tensor([parents], device=dev),
                             torch.tensor([depths], device=dev), torch.zeros(1, n_nodes, device=dev))
            lengths = self.state.lengths
            res = self.tree_target(tree.tokens, tree.positions(lengths), lengths, tree.ancestor_mask())
            logits = res[0] if isinstance(res, tuple) else res
            out += logits[0, branch].argmax(-1).tolist()
            path = torch.tensor([branch], device=dev)
            self.state.commit(torch.tensor([len(branch)], device=dev), path)
            if on_block is not None:
                on_block(logits[:, branch])
            start += len(branch)
        return out

    def generate_batch(self, prompts, max_new_tokens, eos_token_ids=(), sampling=None, seeds=None,
                       batch_size: int | None = None, buckets: bool = True) -> list[GenerationResult]:
        """Generation for several prompts (any lengths), ``batch_size`` rows at a time (default:
        all at once) with continuous batching (``specc.runtime.batching``): per prompt the same
        tokens as that prompt alone. ``max_new_tokens``: one budget or one per prompt.
        ``sampling``: one ``SamplingParams`` for every prompt or one per prompt (None: greedy);
        ``seeds``: one per prompt (default: each prompt's params' seed); ``buckets``: the
        scheduler's batch buckets (``BatchScheduler``)."""
        from specc.runtime.batching import BatchScheduler

        prompts = [as_prompt_list(p) for p in prompts]
        budgets = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(budgets) != len(prompts):
            raise ValueError(f"{len(budgets)} max_new_tokens for {len(prompts)} prompts")
        per_prompt = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"sampling: {len(per_prompt)} params given for {len(prompts)} prompts")
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"seeds: {len(seeds)} given for {len(prompts)} prompts")
        with torch.inference_mode():
            scheduler = BatchScheduler(self, max(1, min(batch_size or len(prompts), len(prompts))), buckets=buckets)
            requests = zip(prompts, budgets, [eos_token_ids] * len(prompts), seeds, per_prompt)
            return scheduler.run(list(requests))

    def _loop(self, input_ids, max_new_tokens: int, eos_token_ids=(), sampling=None):
        from specc.runtime.batching import BatchScheduler

        scheduler = BatchScheduler(self, 1, sampling=sampling)
        rid = scheduler.submit(as_prompt_list(input_ids), max_new_tokens, eos_token_ids)
        for event in scheduler.admit():  # the prefill's token reaches the caller at once
            yield from event.tokens
        while not scheduler.idle:
            for event in scheduler.decode():
                yield from event.tokens
        return scheduler.take(rid)

    # --- slots: what a scheduler (``specc.runtime.batching.BatchScheduler``) drives -------------

    def open_slots(self, rows: int, sampling=None) -> None:
        """Start over with ``rows`` free slots (reallocating the state when the batch changes).
        ``sampling``: the ``SamplingParams`` of a request prefilled without its own (None or
        temperature 0: greedy); each request may bring its own (``prefill_slot``)."""
        self._sampling = None if sampling is None or sampling.greedy else sampling
        # a SamplingPolicy is made at the first sampled request's prefill (it needs the vocabulary);
        # until then every request is greedy and the greedy path runs unchanged
        self.policy = GreedyPolicy()
        if rows != self.capacity:
            self.resize(self.max_len, rows)
        k_max = self.num_draft if self.drafter is not None else 0
        shape = (rows, self.max_len + k_max + 2)
        seq = getattr(self, "_seq_slots", None)
        if (seq is not None and tuple(seq.shape) == shape and seq.device == self.target.device
                and (torch.is_inference_mode_enabled() or not seq.is_inference())):
            seq.zero_()  # the same buffer: the chain step's graph writes into it
        else:
            self._seq_slots = torch.zeros(shape, dtype=torch.long, device=self.target.device)
        self._slots_state.lengths.zero_()
        if self.drafter is not None:
            self.drafter.forwards = 0
            self.drafter.open_rows(rows)
        self.n, self.live = [], []  # committed tokens per slot (host mirror of state.lengths + 1), live flags
        self._bind_width(rows)
        timer = self.profile if callable(self.profile) else {True: PartTimer, "events": EventTimer}.get(self.profile)
        self._timer = timer(self.target.device) if timer else _NoTimer()

    # --- batch buckets: steps over the first rows of the allocated slots -------------------------

    @property
    def width_can_change(self) -> bool:
        """Whether ``set_width`` / ``move_slots`` may run: more than one slot allocated and a
        drafter that can narrow its rows (``Drafter.set_width``)."""
        return self.capacity > 1 and (self.drafter is None or hasattr(self.drafter, "set_width"))

    def set_width(self, rows: int) -> None:
        """Run the following steps over the first ``rows`` of the ``capacity`` slots (a batch
        bucket), so that a step's cost follows the requests running rather than the slots
        allocated: the state, ``seq`` and the drafter's caches are bound as views of the
        allocation's first rows (no copy; what a step commits is the allocation's), and the
        slots from ``rows`` on must be free (``move_slots`` compacts). ``rows`` >= 2 unless it
        is the capacity: batch 1 keeps its own drafting and whole-step paths, chosen when a
        loop is opened. CUDA graphs are per shape and the buffers do not move, so graphs
        captured at a width are replayed whenever the loop is back at it."""
        if rows == self.batch:
            return
        if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= self.capacity:
            raise ValueError(f"width must be an integer in [1, {self.capacity}], got {rows!r}")
        if rows == 1 and self.capacity > 1:
            raise ValueError("a width of 1 is the capacity's alone (batch 1 drafts and steps differently)")
        if not self.width_can_change:
            raise RuntimeError("this loop's width cannot change (one slot, or a drafter without set_width)")
        busy = [b for b in range(rows, self.batch) if self.live[b]]
        if busy:
            raise RuntimeError(f"slots {busy} are in use past width {rows} (move them first: move_slots)")
        self._bind_width(rows)

    def _bind_width(self, rows: int) -> None:
        """Bind the first ``rows`` slots of the allocation (``set_width``; ``open_slots``: all)."""
        self.state = self._slots_state if rows == self.capacity else self._slots_state.narrowed(rows)
        for step, buffers in self._step_buffers:
            bind_rows(step, buffers, rows)
        self.seq = self._seq_slots if rows == self.capacity else self._seq_slots[:rows]
        self.n = (self.n + [0] * rows)[:rows]
        self.live = (self.live + [False] * rows)[:rows]
        self.batch = rows
        self._live_mask, self._caps, self._ahead, self._ahead_step = None, None, None, None
        if self.drafter is not None and hasattr(self.drafter, "set_width"):
            self.drafter.set_width(rows)
        if isinstance(self.policy, SamplingPolicy):
            self.policy.set_width(rows)

    def move_slots(self, moves: list[tuple[int, int]]) -> None:
        """Move the request in slot ``src`` to the free slot ``dst`` for each ``(src, dst)`` (below
        the width; the sources are then free): the target's state rows (``DecodingState.move``),
        the committed tokens and the drafter's rows, one copy per buffer for all the moves and no
        device read. How a scheduler compacts the running requests into the first slots before
        a narrower width (``width_can_change``)."""
        if not self.width_can_change:
            raise RuntimeError("this loop's slots cannot move (one slot, or a drafter without move_slots)")
        src, dst = [m[0] for m in moves], [m[1] for m in moves]
        for a, b in moves:
            if not (0 <= a < self.batch and 0 <= b < self.batch) or not self.live[a] or self.live[b]:
                raise ValueError(f"move_slot({a}, {b}): needs a live source and a free destination below "
                                 f"width {self.batch}")
        if len(set(src) | set(dst)) != 2 * len(moves):
            raise ValueError(f"moves {moves}: every slot may appear once")
        if not moves:
            return
        self.state.move(src, dst, max(self.n[a] for a in src))  # n[b] - 1 tokens are in the cache
        s, d = upload(src, self.seq.device), upload(dst, self.seq.device)
        self.seq[d] = self.seq[s]
        if self.drafter is not None:
            self.drafter.move_slots(src, dst)
        if isinstance(self.policy, SamplingPolicy):
            self.policy.move_rows(src, dst)
        for a, b in moves:
            self.n[b], self.live[b] = self.n[a], True
            self.n[a], self.live[a] = 0, False
        self._live_mask, self._ahead, self._ahead_step = None, None, None

    def move_slot(self, src: int, dst: int) -> None:
        """``move_slots([(src, dst)])``."""
        self.move_slots([(src, dst)])

    def prefill_slot(self, slot: int, prompt: list[int], seed: int | None = None, sampling=None) -> int:
        """Run ``prompt`` through the target into ``slot`` alone (a batch-1 forward on views of
        the slot's state rows; the other slots are untouched), start the drafter's sequence
        there, and return the first generated token (one host sync). ``sampling``: the request's
        ``SamplingParams`` (None: the slots' default, ``open_slots``); ``seed``: its seed (None:
        the params')."""
        plen = len(prompt)
        if not 0 < plen <= self.max_len:
            raise ValueError(f"prompt of {plen} tokens for a loop of max_len {self.max_len}")
        params = self._sampling if sampling is None else sampling
        params = None if params is None or params.greedy else params
        dev = self.target.device
        self._ahead = self._ahead_step = None
        self._timer.mark("prefill")
        self.seq[slot, :plen] = upload(prompt, dev)  # queued: the prefill's one host read is its first token
        ids = self.seq[slot:slot + 1, :plen]
        step = getattr(self.target, "eager", None) or self.target  # a one-off shape: never graphed
        with slot_view(self.target, slot) if self.batch > 1 else contextlib.nullcontext():
            out = step(ids, self._arange(plen), torch.zeros(1, dtype=torch.long, device=dev))
        logits, context = out if isinstance(out, tuple) else (out, None)
        self.state.lengths[slot] = plen  # the first generated token's K/V lands with the first verify step
        if params is None and isinstance(self.policy, GreedyPolicy):
            first = logits[:, -1].argmax(-1)
        else:
            if isinstance(self.policy, GreedyPolicy):  # the first sampled request: every other row greedy
                self.policy = self._sampling_policy(logits.shape[-1])
            self.policy.start_row(slot, (params.seed if params is not None else 0) if seed is None else seed,
                                  self.seq[slot, :plen], params)
            first = self.policy.first_row(slot, logits[:, -1], torch.tensor([plen], device=dev))
        self.seq[slot, plen] = first[0]
        self.n[slot], self.live[slot], self._live_mask = plen + 1, True, None
        if self.drafter is not None:
            self.drafter.reset_slot(slot, plen, context)
            if self.batch > 1 and hasattr(self.drafter, "feed_prompt"):
                self.drafter.feed_prompt(slot, ids)
        return int(first[0])

    def _sampling_policy(self, vocab: int) -> SamplingPolicy:
        """The SamplingPolicy of a generation's first sampled request, every row greedy: the one
        kept from an earlier generation of this batch size and vocabulary (``restart``), so that
        whole-step graphs captured over its tensors stay valid, else a new one."""
        kept = getattr(self, "_kept_sampling", None)
        dev = self.target.device
        if (kept is not None and kept.capacity == self.capacity and kept.vocab == vocab
                and kept.seeds.device == dev and kept.seeds.is_inference() == torch.is_inference_mode_enabled()):
            kept.restart()
        else:  # made for every slot, bound to the width (``set_width``)
            kept = SamplingPolicy([None] * self.capacity, torch.zeros(self.capacity, dtype=torch.long, device=dev),
                                  self._seq_slots[:, :1], vocab)
            self._kept_sampling = kept
        kept.set_width(self.batch)
        return kept

    def release_slot(self, slot: int) -> None:
        """Free ``slot`` (its request finished or was cancelled); a later prefill reuses it."""
        self.live[slot], self._live_mask, self._ahead, self._ahead_step = False, None, None, None
        self.state.release(slot)
        self.n[slot] = 0
        if self.drafter is not None:
            self.drafter.release_slot(slot)

    @property
    def part_seconds(self) -> dict:
        """Seconds per loop part of the run so far (``profile``: True, synchronising at every
        boundary, ``PartTimer``; "events", device time from CUDA events, ``EventTimer``; a timer
        class, its ``parts``); empty when not profiling."""
        return dict(self._timer.parts)

    def speculate(self, budgets: list[int], num_draft: int | list[int] | None = None,
                  ahead: bool = False) -> tuple[list[list[int]], int]:
        """One speculative step over every slot. ``budgets[b]``: tokens live slot b may still
        commit (>= 1); ``num_draft``: drafts per row this step (at most the loop's; None: the
        loop's, e.g. a goodput rule's choice, ``specc.runtime.adaptive``), or one per slot (per-request
        draft lengths: verified ragged when the loop has a ragged step, ``verifies_ragged``;
        otherwise every row drafts and verifies the largest). Returns (per slot [accepted, committed
        tokens...] from the step's device -> host copy: slot b committed ``row[1:row[0] + 2]``, free
        slots commit nothing; tree nodes verified, 0 for a chain step). Clipping at EOS / budgets is
        the caller's. ``ahead``: unless its request finishes, the caller's next call is
        ``speculate(budgets minus what this step commits)`` with the same ``num_draft`` (None):
        with ``draft_ahead`` at batch 1 the next step's draft is launched before this returns."""
        seq, n, rows, dev, timer = self.seq, self.n, self.batch, self.target.device, self._timer
        live = [b for b in range(rows) if self.live[b]]
        k, caps, active, per_row = 0, None, None, False
        row_caps = [0] * rows  # drafts each slot may accept this step (free slots: 0)
        if rows > 1:
            if self._live_mask is None:
                self._live_mask = upload([int(x) for x in self.live], dev)
            active = self._live_mask
        if self.drafter is not None:
            if self.capture_shapes and rows not in self._shapes_captured and self.num_draft > 0:
                self.drafter.capture_shapes(seq, self.num_draft)
                self._shapes_captured.add(rows)
            per_row = isinstance(num_draft, (list, tuple))  # then: verified per row when the loop can
            if per_row and len(num_draft) != rows:
                raise ValueError(f"num_draft: {len(num_draft)} drafts given for {rows} slots")
            wanted = ([max(0, min(int(x), self.num_draft)) for x in num_draft] if per_row else
                      [self.num_draft if num_draft is None else max(0, min(int(num_draft), self.num_draft))] * rows)
            k = max(wanted[b] for b in live)
            k = min(k, max(budgets[b] - 1 for b in live)) if self.cap_to_budget else k
            per_row = per_row and self.verifies_ragged and not self.tree_budget
            for b in live:
                cap = wanted[b] if per_row else k
                row_caps[b] = max(0, min(cap, k, budgets[b] - 1) if self.cap_to_budget else min(cap, k))
            if rows > 1:
                caps = self._caps_on_device(row_caps)
        drafting = None if rows == 1 or all(self.live) else self.live  # which rows' drafts are wanted
        made_ahead, self._ahead = self._ahead, None
        step_ahead, self._ahead_step = self._ahead_step, None
        timer.mark("draft")
        nodes = 0  # tree nodes verified this step (0: a chain step)
        drafted_ahead = None  # the next step's drafts, when this step launched them (``batch_draft_ahead``)
        self.last_level2_rows = []
        if made_ahead is not None and (self.tree_budget or not isinstance(self.policy, GreedyPolicy)
                                       or made_ahead[0] != self._ahead_key(k)):
            raise RuntimeError(f"a draft made ahead for (committed tokens, k) = {made_ahead[0]} does not match "
                               f"this step's {self._ahead_key(k)}")
        graphs = self._whole_step_graphs()
        whole = self._whole_step_key(graphs, k, per_row) if made_ahead is None else None
        if step_ahead is not None and step_ahead != (n[0], whole):
            raise RuntimeError(f"a step launched ahead for (committed tokens, graph key) = {step_ahead} does not "
                               f"match this step's ({n[0]}, {whole})")
        if whole is not None and (step_ahead is not None or graphs.ready(whole)):
            if step_ahead is None:  # (one launched ahead is already on the GPU)
                graphs.launch(whole)
            host, context = graphs.result(k), graphs.context
            nodes = whole[2] + 1 if whole[2] else 0
            if self.drafter is not None:
                self.drafter.drafted_on_device(n, whole[1], k)
        elif self.tree_budget and k > 0:
            host, context, nodes = self._tree_step(seq, n, k, caps, active, timer, drafting)
            if graphs is not None and rows == 1 and isinstance(self.policy, GreedyPolicy):
                graphs.ran_unfused(k, self.tree_budget)
        else:
            policy = self.policy
            q = None
            if k == 0:
                drafts = seq[:, :0]
            elif made_ahead is not None:
                drafts = made_ahead[1]
                if rows > 1:  # made by ``draft_ahead_rows``: its host bookkeeping is now
                    self.drafter.took_ahead(n, k)
            elif isinstance(policy, GreedyPolicy):
                drafts = self._draft_rows(seq, n, k, drafting)
            else:
                drafts, q = policy.draft(self.drafter, seq, n, k, self.state.lengths, drafting)
            timer.mark("verify")
            if rows == 1:
                last = seq[:, n[0] - 1:n[0]]
                row_caps = [k]
            else:
                last = seq.gather(1, self.state.lengths[:, None])
            if caps is None and rows > 1:
                caps = torch.zeros(rows, dtype=torch.long, device=dev)  # no drafts: commit one token
            self._packing = per_row or (bool(self.two_level_k1) and self.verifies_ragged)  # rows differ
            logits, context, level1 = self._chain_logits(torch.cat([last, drafts], dim=1), drafts, q, row_caps, caps)
            timer.mark("accept")
            if isinstance(policy, GreedyPolicy) and level1 is None:  # decision + commit: one graph on CUDA
                accepted, committed = self._chain_accept_fn()(drafts, logits, caps, active)
            else:
                if isinstance(policy, GreedyPolicy):
                    accepted, committed = self._accept_level2(drafts, logits, row_caps, level1)
                else:
                    accepted, committed = policy.verify_chain(self.verifier, drafts, q, logits, caps,
                                                              self.state.lengths)
                    policy.observe(committed, accepted * active if active is not None else accepted)
                self._commit_chain(accepted, committed, active)
            decision = torch.cat([accepted[:, None], committed], dim=1)
            if ahead and level1 is None and self._batch_ahead_ok(budgets, k, per_row):
                host, drafted_ahead = self._read_drafting_ahead(decision, accepted, context)
            else:
                host = decision.tolist()  # the step's one device -> host copy
            if graphs is not None and rows == 1:  # kernels of a k-draft step are compiled: its graphs may be captured
                graphs.ran_unfused(k, 0, sampled=not isinstance(policy, GreedyPolicy))
        acc = [row[0] if self.live[b] else 0 for b, row in enumerate(host)]
        if self.drafter is not None:
            self.drafter.accepted_rows(n, acc, k, context)
        for b in live:
            n[b] += acc[b] + 1
        if drafted_ahead is not None:
            self._ahead = (self._ahead_key(self.num_draft), drafted_ahead)
        if ahead:
            budget = budgets[0] - acc[0] - 1 if rows == 1 else 0
            if not self._step_ahead(budget, num_draft):
                self._draft_ahead(budget, num_draft)
        timer.mark(None)
        return host, nodes

    @property
    def runs_ahead(self) -> bool:
        """Whether a step may launch work of the next one before returning (``draft_ahead``,
        ``batch_draft_ahead``, ``step_graphs``), so that a scheduler without a draft-length rule
        passes ``ahead``."""
        return bool(self.draft_ahead or self.batch_draft_ahead or self.step_graphs)

    def _ahead_key(self, k: int) -> tuple:
        """What a draft made ahead is for: (committed tokens, k), per row at batch > 1."""
        return (self.n[0] if self.batch == 1 else tuple(self.n), k)

    def _batch_ahead_ok(self, budgets: list[int], k: int, per_row: bool) -> bool:
        """Whether this greedy chain step (one level, verified) may draft the next step's tokens
        before its host read (``batch_draft_ahead``, module doc): batch > 1, every slot live, one
        k for the batch, a drafter that drafts ahead, no per-part profile (whose parts it would
        blur), and the next step's k known now: the loop's own, which the budgets cannot cap
        whatever this step commits."""
        if not (self.batch_draft_ahead and self.batch > 1 and all(self.live) and not per_row and k > 0
                and self.drafter is not None and not self.tree_budget and not self.profile
                and isinstance(self.policy, GreedyPolicy)):
            return False
        return not self.cap_to_budget or max(budgets) - (k + 1) - 1 >= self.num_draft

    def _read_drafting_ahead(self, decision: torch.Tensor, accepted: torch.Tensor, context):
        """The step's host read (rows of [accepted, committed...]) with the next step's draft
        launched between the copy and the wait (``Drafter.draft_ahead_rows``), so that the GPU
        drafts while the host reads the decision and does the step's bookkeeping. On CUDA the
        decision goes to a pinned buffer behind an event; the host waits for that event, not
        for the draft. Returns (rows, the drafts or None where the drafter could not)."""
        cuda = decision.device.type == "cuda"
        if cuda:
            buf = self._host_buffer
            if buf is None or buf.shape != decision.shape or buf.dtype != decision.dtype:
                buf = self._host_buffer = torch.empty(decision.shape, dtype=decision.dtype, pin_memory=True)
            buf.copy_(decision, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        drafts = self.drafter.draft_ahead_rows(self.seq, self.state.lengths, accepted, context, self.num_draft)
        if not cuda:
            return decision.tolist(), drafts
        copied.synchronize()
        return buf.tolist(), drafts

    def _whole_step_graphs(self):
        """The loop's ``StepGraphs`` (made for the current ``seq``) when whole-step graphs are on
        and can be made here (CUDA, or a capture stand-in), else None."""
        if not self.step_graphs or self.profile:
            return None
        if self.step_graph_capture is None and self.target.device.type != "cuda":
            return None
        graphs = self._step_graphs
        if graphs is None or graphs.seq is not self.seq:
            from specc.runtime.step_graphs import StepGraphs, cuda_capture

            graphs = self._step_graphs = StepGraphs(self, self.step_graph_capture or cuda_capture)
        return graphs

    def _whole_step_key(self, graphs, k: int, per_row: bool = False):
        """The whole-step graph key of this step (``StepGraphs.key``: batch 1, a greedy tree or
        chain step or a sampled chain step) when it verifies in one level, else None."""
        if graphs is None or per_row or (self.two_level_k1 and self.verifies_ragged and k > self.two_level_k1):
            return None
        return graphs.key(k)

    def _step_ahead(self, budget: int, num_draft) -> bool:
        """Launch the next step's whole-step graph now (``ahead``): batch 1, a live row with
        ``budget`` tokens left, the loop's own k, its graph captured (or capturable). Whether it
        was launched (if not, ``draft_ahead`` may still draft ahead)."""
        graphs = self._whole_step_graphs()
        if graphs is None or self.batch != 1 or not self.live[0] or budget < 1 or num_draft is not None:
            return False
        k = self.num_draft if self.drafter is not None else 0
        k = min(k, budget - 1) if self.cap_to_budget else k
        key = self._whole_step_key(graphs, k)
        if key is None or not graphs.ready(key):  # (captured now if its kernels are compiled)
            return False
        graphs.launch(key)
        self._ahead_step = (self.n[0], key)
        return True

    def _draft_ahead(self, budget: int, num_draft) -> None:
        """Launch the next step's draft now (``draft_ahead``, module doc) when the next step is
        known: batch 1, a live row with ``budget`` tokens left after this step, the loop's own k
        (capped at the budget as the next step caps it), a greedy chain step in one level, and no
        per-part profile (whose parts it would blur)."""
        if not (self.draft_ahead and self.batch == 1 and self.live[0] and budget >= 1 and num_draft is None
                and self.drafter is not None and not self.tree_budget and not self.two_level_k1
                and isinstance(self.policy, GreedyPolicy) and not self.profile):
            return
        k = min(self.num_draft, budget - 1) if self.cap_to_budget else self.num_draft
        if k > 0:
            self._ahead = ((self.n[0], k), self._draft_rows(self.seq, self.n, k, None))

    def _caps_on_device(self, row_caps: list[int]) -> torch.Tensor:
        """The step's per-row draft caps [B] on the device. They change only when a row joins,
        leaves or nears its budget, so a step with last step's caps reuses its copy (read-only
        downstream) instead of queueing another host -> device copy."""
        key = tuple(row_caps)
        if self._caps is None or self._caps[0] != key:
            self._caps = (key, upload(row_caps, self.target.device))
        return self._caps[1]

    @property
    def two_level_k1(self) -> int | None:
        """Drafts checked at level 1 of two-level verification (None: one level)."""
        return self._two_level_k1

    @two_level_k1.setter
    def two_level_k1(self, k1: int | None) -> None:
        if k1 is not None and (not isinstance(k1, int) or isinstance(k1, bool) or k1 < 1):
            raise ValueError(f"two_level_k1 must be an integer >= 1 or None, got {k1!r}")
        self._two_level_k1 = k1

    @property
    def verifies_ragged(self) -> bool:
        """Whether chain verifies can be packed per row (a ragged step): per-request draft lengths
        then cost only the tokens each row verifies, and two-level verification is possible. Not
        in the batch-invariant kernel mode (``specc.codegen.kernels.batch_invariant``): a request
        alone verifies dense, so in a batch it must too (the ragged kernel tiles otherwise); the
        loop then verifies every row's largest k in one level, with per-row caps."""
        return self.ragged_target is not None and not batch_invariant_enabled()

    def graph_stats(self) -> dict:
        """Per CUDA-graphed step (``steps``, as ``engine.build_loop`` wrapped them), per tree
        function (``tree_plan`` / ``tree_accept`` / ``tree_commit``) and the greedy chain step's
        accept + commit (``chain_accept``, once a chain step ran): graphs captured, replays,
        eager calls and why a shape could not be captured; empty where nothing is graphed (the
        CPU). What a benchmark reports to show which parts of its steps replayed graphs."""
        return {name: step.stats() for name, step in self.graphed_steps().items()}

    def graphed_steps(self) -> dict:
        """Every graphed callable of the loop by name: the steps as ``engine.build_loop`` wrapped
        them (by role) and ``graphed_functions``; what ``graph_stats`` reports and what
        ``graphs.replay_seconds`` names a replay log by."""
        steps = {role: step for role, step in getattr(self, "steps", {}).items() if hasattr(step, "stats")}
        return {**steps, **self.graphed_functions()}

    def graphed_functions(self) -> dict:
        """The loop's own graphed functions around the verify forward, by name (``tree_plan`` /
        ``tree_accept`` / ``tree_commit``, ``chain_accept``) and its whole-step graphs (``step``,
        ``step_graphs``), as made so far (at their first call; none on the CPU): what
        ``graph_stats`` reports and ``warm_up`` counts."""
        from specc.runtime.graphs import GraphedStep

        fns = {f"tree_{name}": fn for name, fn in (self._tree_graphs or {}).items()}
        fns["chain_accept"] = getattr(self, "_chain_graph", None)
        out = {name: fn for name, fn in fns.items() if isinstance(fn, GraphedStep)}
        step_graphs = getattr(self, "_step_graphs", None)
        if step_graphs is not None and step_graphs.captures:
            out["step"] = step_graphs
        return out

    def _chain_logits(self, block, drafts, q, row_caps: list[int], caps):
        """The target's logits (and captured hidden states, else None) for the chain block
        ``block`` = [last, drafts] [B, k + 1], row b verifying its first ``row_caps[b] + 1``
        tokens (free slots: none), and level 1's decision (None for one level). One level, or two
        (``two_level_k1``, module doc): level 1 over the first k1 drafts, level 2 only for the rows
        that accepted all of them. Positions a row did not verify hold zeros; its cap keeps every
        verifier from reading them. Greedy: level 1's decision stands for the rows that stopped
        there and the verifier decides the others' remaining drafts (``_accept_level2``). Sampling:
        the policy verifies the joined logits once more (its random numbers are functions of the
        position, so it decides level 1's positions as level 1 did)."""
        k, rows = drafts.shape[1], block.shape[0]
        counts = [c + 1 if rows == 1 or self.live[b] else 0 for b, c in enumerate(row_caps)]
        k1 = self.two_level_k1
        if not k1 or not self.verifies_ragged or k <= k1 or max(row_caps) <= k1:
            return (*self._verify_rows(block, counts), None)
        caps1 = [min(c, k1) for c in row_caps]
        logits1, hidden1 = self._verify_rows(block[:, :k1 + 1], [min(c, k1 + 1) for c in counts])
        caps1_t = upload(caps1, block.device)
        if isinstance(self.policy, GreedyPolicy):
            accepted1, committed1 = self.verifier.verify(drafts[:, :k1], logits1, caps1_t)
        else:
            accepted1, committed1 = self.policy.verify_chain(self.verifier, drafts[:, :k1], q[:, :k1], logits1,
                                                             caps1_t, self.state.lengths)
        level1 = accepted1.tolist()  # level 1's host copy: which rows go on
        go = [b for b in range(rows) if counts[b] and row_caps[b] > k1 and level1[b] == k1]
        self.last_level2_rows = go
        if go:
            counts2 = [row_caps[b] - k1 if b in go else 0 for b in range(rows)]
            logits2, hidden2 = self._verify_rows(block[:, k1 + 1:], counts2, offset=k1 + 1)
        else:  # no row goes on: the step ends at level 1
            logits2 = logits1.new_zeros(rows, k - k1, logits1.shape[-1])
            hidden2 = None if hidden1 is None else hidden1.new_zeros(rows, k - k1, hidden1.shape[-1])
        logits = torch.cat([logits1, logits2], dim=1)
        hidden = None if hidden1 is None else torch.cat([hidden1, hidden2], dim=1)
        return logits, hidden, (accepted1, committed1, go)

    def _accept_level2(self, drafts, logits, row_caps: list[int], level1):
        """Greedy two-level decision: level 1's (accepted, committed) for every row, then the
        verifier over the remaining drafts of the rows that went on (``start`` = k1: their
        block position; ``rows``: their indices, for verifiers that draw per row and position,
        ``ReplayVerifier``), joined: a row that went on accepts k1 + its level-2 count."""
        accepted1, committed1, go = level1
        k, k1, rows = drafts.shape[1], self.two_level_k1, drafts.shape[0]
        committed = torch.cat([committed1, committed1.new_zeros(rows, k - k1)], dim=1)
        if not go:
            return accepted1, committed
        dev = drafts.device
        go_t = upload(go, dev)
        caps2 = upload([row_caps[b] - k1 for b in go], dev)
        accepted2, committed2 = self.verifier.verify(drafts[go_t, k1:], logits[go_t, k1:], caps2, start=k1, rows=go_t)
        accepted = accepted1.index_put((go_t,), (k1 + accepted2).to(accepted1.dtype))
        committed = committed.index_put((go_t,), torch.cat([committed[go_t, :k1], committed2.to(committed.dtype)], 1))
        return accepted, committed

    def _verify_rows(self, block: torch.Tensor, counts: list[int], offset: int = 0):
        """The target over ``block`` [B, W], row b's first ``counts[b]`` tokens written at
        ``state.lengths[b] + offset`` onward: (logits [B, W, V], hidden [B, W, n*H] or None).
        Dense (``_target_rows``) at offset 0 when every row takes all W tokens, when there is no
        ragged step, or in a step with one k for the batch and one level (rows then compute their
        whole block: free slots ride along, caps stop rows); otherwise one packed forward of the
        ragged step, unpacked (zeros where no token)."""
        width = block.shape[1]
        if offset == 0 and (self.ragged_target is None or not self._packing or all(c == width for c in counts)):
            return self._target_rows(block)
        if self.ragged_target is None:
            raise RuntimeError("a verify past the rows' lengths needs a ragged step")
        # a graphed ragged step (``token_buckets``) takes every slot as a row and T padded to a bucket
        packed = PackedRows.of(counts, width, block.device, bucket=getattr(self.ragged_target, "token_buckets", False))
        if packed.num_tokens == 0:
            raise RuntimeError("a packed verify with no tokens")
        lengths = self.state.lengths
        # by keyword: a model definition's forward has tree_mask before them, a compiled ragged step does not
        out = self.ragged_target(packed.tokens(block), packed.positions(lengths, offset),
                                 packed.cache_len(lengths, offset), row_slots=packed.row_slots,
                                 row_starts=packed.row_starts)
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        return packed.unpack(logits), None if hidden is None else packed.unpack(hidden)

    def _draft_rows(self, seq, n, k, drafting, logits: bool = False):
        """The drafter's ``propose_rows`` (``propose_logits_rows``), told which rows are live only
        when some are not (drafters written before slots take no ``active``)."""
        fn = self.drafter.propose_logits_rows if logits else self.drafter.propose_rows
        return fn(seq, n, k) if drafting is None else fn(seq, n, k, active=drafting)

    def _chain_accept_fn(self):
        """``_accept_chain``, wrapped in a ``GraphedStep`` on CUDA (``capture_shapes``): the greedy
        chain decision and commit are dozens of small launches (argmax, acceptance, the seq
        scatter, the state's commit, replay draws), one graph replay instead. The commit advances
        the state's lengths (and selects hybrid targets' snapshots), so it is not idempotent:
        no warm-up, the first call of a shape eager, the second captured and replayed (as the tree
        commit). The graph holds the verifier, the state's buffers and ``seq``: dropped with
        them (``resize``, a new chain verifier, a new ``seq``)."""
        fn = getattr(self, "_chain_graph", None)
        if fn is None or self._chain_graph_seq is not self._seq_slots:
            fn = self._accept_chain
            if self.capture_shapes:
                from specc.runtime.graphs import GraphedStep

                fn = GraphedStep(fn, max_tokens=1 << 30, warmup=0, eager_first=True)
            self._chain_graph, self._chain_graph_seq = fn, self._seq_slots
        return fn

    def _accept_chain(self, drafts, logits, caps, active):
        """The greedy chain step after the verify forward, device tensors only (no host sync, so
        it can be one CUDA graph): the verifier's decision over ``drafts`` [B, k] and ``logits``
        [B, k + 1, V] (``caps`` [B]: drafts each row may accept, None: all k), then the commit
        (``_commit_chain``; ``active`` [B]: live rows, None: every row). Returns (accepted [B],
        committed [B, k + 1])."""
        accepted, committed = self.verifier.verify(drafts, logits, caps)
        self._commit_chain(accepted, committed, active)
        return accepted, committed

    def _commit_chain(self, accepted, committed, active):
        """Write row b's committed tokens into ``seq`` right after its last committed token
        (positions ``state.lengths[b] + 1`` onward, on the device) and commit ``accepted + 1``
        positions of the state (0 for a free row: ``active`` [B] 0/1, None: every row live)."""
        self._write_committed(committed)
        self.state.commit(accepted + 1 if active is None else (accepted + 1) * active)

    def _write_committed(self, committed):
        """Row b's committed tokens ``committed`` [B, W] into ``seq`` right after its last committed
        token (positions ``state.lengths[b] + 1`` onward; entries past a row's count are rewritten
        by its next step)."""
        lengths = self.state.lengths
        self.seq.scatter_(1, lengths[:, None] + self._arange(committed.shape[1] + 1)[:, 1:],
                          committed.to(self.seq.dtype))

    @staticmethod
    def _along_path(hidden, path):
        """The target's hidden states ``hidden`` [B, N, n*H] at the accepted path's nodes ``path``
        [B, P] (DFlash's context after a tree step; entries past a path's end are junk)."""
        return hidden.gather(1, path.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1]))

    def _tree_step(self, seq, n, k, caps, active, timer, drafting=None):
        """One tree step on the device (see the module doc): returns (the step's one host copy,
        rows of [accepted, committed...]; the target's hidden states along the accepted paths
        (DFlash context) or None; nodes verified)."""
        lengths = self.state.lengths
        root = seq.gather(1, lengths[:, None])[:, 0]  # the last committed token (not yet in the cache)
        draft_logits = self._draft_rows(seq, n, k, drafting, logits=True)  # [B, k, V], one forward
        timer.mark("plan")
        tree_fns = self._tree_fns()
        policy = self.policy
        tokens, parents, depths, positions, mask = tree_fns["plan"](policy.tree_logits(draft_logits, lengths), root,
                                                                    lengths, self.tree_budget, self.tree_topk)
        timer.mark("verify")
        out = self.tree_target(tokens, positions, lengths, mask)
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        timer.mark("accept")
        if caps is None and seq.shape[0] > 1:
            caps = torch.full_like(lengths, k)
        accepted, committed, path = policy.accept_tree(tree_fns["accept"], tokens, parents, depths, mask, logits, caps,
                                                       k, lengths)
        timer.mark("commit")
        if active is not None:
            accepted = accepted * active
        self._write_committed(committed)
        tree_fns["commit"](accepted + 1 if active is None else (accepted + 1) * active, path)
        context = None
        if hidden is not None:  # DFlash: the target's hidden states of the committed path
            context = self._along_path(hidden, path)
        host = torch.cat([accepted[:, None], committed], dim=1).tolist()  # the step's one device -> host copy
        return host, context, tokens.shape[1]

    def _tree_fns(self) -> dict:
        """The tree step's on-device work around the verify forward: ``plan`` (build the tree, its
        positions and ancestor mask) and ``accept`` (greedy tree acceptance). Dozens of small ops
        each; on CUDA (``capture_shapes``) each is one CUDA graph, replayed every step, so their
        launches do not add to the step (outputs are static buffers, consumed within the step)."""
        fns = getattr(self, "_tree_graphs", None)
        if fns is None:
            fns = {"plan": self.tree_verifier.plan, "accept": self._accept_tree, "commit": self._commit_path}
            if self.capture_shapes:
                from specc.runtime.graphs import GraphedStep

                # not idempotent, so captured at their second call with no warm-up: commit moves K/V
                # in place, and accept advances a replay verifier's draw counter (a warm-up would
                # skip draws: the graphed loop would then replay another acceptance than the unfused)
                once = ("commit", "accept")
                fns = {name: GraphedStep(fn, max_tokens=1 << 30, warmup=0 if name in once else 2,
                                         eager_first=name in once) for name, fn in fns.items()}
            self._tree_graphs = fns
        return fns

    def _commit_path(self, accepted_plus_one, path):
        """The state's tree commit (KV compaction of every layer: one launch each), a graph on CUDA."""
        self.state.commit(accepted_plus_one, path)

    def _accept_tree(self, tokens, parents, depths, mask, logits, caps, k):
        tree = DraftTree.planned(tokens, parents, depths, mask)
        res = self.tree_verifier.verify_tree(tree, logits, caps, depth=k)
        return res.accepted, res.committed, res.path
