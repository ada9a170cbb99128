"""The production speculative loop: batch-shaped state on the device, one small host copy per step.

Every piece of loop state is per row (slot): the committed sequences ``seq`` [B, L] (device), the
target's ``DecodingState`` whose ``lengths`` [B] count the tokens each row has in the target
cache (= committed - 1: the last committed token is fed by the next step), per-row committed
counts and live flags (host mirrors, updated from the step's one device -> host copy). Batch 1
is one case of it. A request enters a slot by ``prefill_slot`` (its prompt alone, a batch-1
forward on views of the slot's state rows, so prompts of any lengths share a batch) and leaves
by ``release_slot``; ``speculate`` runs one step over every slot. ``specc.runtime.batching``
schedules requests over the slots (continuous batching); ``generate`` / ``generate_batch`` go
through it. Drafters read ``seq`` and return drafts [B, k] as device tensors
(``Drafter.propose_rows``), the verify input is assembled on the device, the verifier
(``specc.runtime.verifiers.ChainVerifier``: greedy acceptance, one batched kernel) decides per
row on the device, the committed tokens are written back into ``seq`` and the state's lengths
advance on the device; the host learns the step's outcome from one copy of B x (k + 2)
integers. An AR drafter feeds each draft to the next forward without leaving the GPU. A free
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

At temperature > 0 the decoding policy (``specc.runtime.policy``, chosen per scheduler: one set of
sampling parameters, one seed per request) samples the drafts and verifies by speculative sampling
(``specc.runtime.sampling_verify``) at the same points of the step; greedy generation makes the
calls it always made.

Same algorithm and statistics as the eager reference loop (``specc.runtime.eager``), which is a
separate implementation of the same surface, not a base class of this one.
"""

from __future__ import annotations

import contextlib
import time

import torch

from specc.result import GenerationResult, as_prompt_list
from specc.runtime.loop import SpeculativeLoop
from specc.runtime.policy import GreedyPolicy, decoding_policy
from specc.runtime.state import DecodingState, reserve_block, slot_view
from specc.runtime.trees import DraftTree
from specc.runtime.verifiers import ChainVerifier, TreeVerifier, Verifier


def greedy_accept(drafts: torch.Tensor, posterior: torch.Tensor):
    """drafts [B, k], posterior [B, k + 1] -> (accepted [B], committed [B, k + 1]): the chain
    verifier on the target's greedy tokens (kept for callers of the old name)."""
    return ChainVerifier().verify_tokens(drafts, posterior)


class PartTimer:
    """Wall time per loop part (prefill / draft / verify / accept). Synchronises the device at
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


class _NoTimer:
    parts: dict = {}

    def mark(self, part) -> None:
        pass


class DeviceSpeculativeDecoder(SpeculativeLoop):
    """``capture_shapes``: before the first generation's first step, call the drafter with every
    input shape it can see (``Drafter.capture_shapes``) so graphed steps are all captured up
    front. Set on CUDA, where the engine also drafts the full k at the end of the budget
    (``cap_to_budget=False``: the surplus is clipped) so that verification has one shape.
    ``batch``: rows the state is allocated for (``generate_batch`` reallocates for another B)."""

    profile = False  # set True to time the loop's parts (``self.part_seconds`` after a run)
    capture_shapes = False
    _shapes_captured = False

    def __init__(self, target, drafter=None, num_draft: int = 4, max_len: int = 2048,
                 cap_to_budget: bool = True, verifier: Verifier | None = None, batch: int = 1,
                 tree_budget: int = 0, tree_target=None, tree_topk: int | None = None):
        self.target, self.drafter, self.num_draft = target, drafter, num_draft
        self.cap_to_budget = cap_to_budget
        self.verifier = verifier or ChainVerifier()
        # tree verification: N drafted nodes per step (0: chains); tree_target: the target's tree
        # verify step (a model definition serves both; a compiled artifact has a TreeTargetStep)
        self.tree_budget = int(tree_budget) if drafter is not None and drafter.supports_tree else 0
        self.tree_target = tree_target if tree_target is not None else target
        self.tree_topk = tree_topk  # candidate tokens per position (None: the budget; 1: a chain-shaped tree)
        self.tree_verifier = TreeVerifier()
        if drafter is not None and drafter.needs_target_hidden:
            target.capture_layers = tuple(drafter.spec.target_layer_ids)
        self.part_seconds: dict = {}
        self._steps_k1: dict = {}
        self.resize(max_len, batch)

    def use_verifiers(self, chain: Verifier | None = None, tree: TreeVerifier | None = None) -> None:
        """Swap the chain and/or tree verifier (e.g. an acceptance replay,
        ``specc.runtime.replay``); the tree step's graphs hold the old one, so they are dropped."""
        if chain is not None:
            self.verifier = chain
        if tree is not None:
            self.tree_verifier, self._tree_graphs = tree, None

    def resize(self, max_len: int, batch: int | None = None) -> None:
        """(Re)allocate the decoding state for ``batch`` rows of up to ``max_len`` tokens."""
        self._tree_graphs = None  # the tree step's graphs (commit holds the state's buffers)
        self.max_len, self.batch = max_len, batch or getattr(self, "batch", 1)
        length = max_len + max(self.num_draft, self.tree_budget) + 1
        reserve_block(self.target, max(self.num_draft, self.tree_budget) + 1)  # hybrid targets' per-node states
        state = self.target.setup_caches(self.batch, length)
        if not isinstance(state, DecodingState):  # a model definition allocated its own buffers
            state = DecodingState.adopt(self.target, self.batch, length)
        self.state = state
        if self.tree_target is not self.target:  # a separate tree step shares the target's state
            from specc.runtime.graphs import GraphedStep

            graphed = isinstance(self.tree_target, GraphedStep)
            state.bind(self.tree_target.step if graphed else self.tree_target)
            if graphed:
                self.tree_target.graphs.clear()  # captured graphs point at the old buffers
        if self.drafter is not None:
            self.drafter.setup(max_len + self.num_draft + 1, self.batch)
        self._shapes_captured = False  # graphed steps drop their graphs with the old caches

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
    def forced_argmax(self, prompt, tokens) -> list[int]:
        """Target argmax at each position of ``tokens`` when fed them (token forcing): prefill
        on the prompt, then verify-sized blocks through the KV cache (row 0)."""
        prompt, tokens = as_prompt_list(prompt), list(tokens)
        if self.batch != 1:
            self.resize(self.max_len, 1)
        dev = self.target.device
        self.state.lengths.zero_()
        logits, _ = self._target_rows(torch.tensor([prompt], dtype=torch.long, device=dev))
        self.state.lengths += len(prompt)
        out = [int(logits[0, -1].argmax())]
        if self.tree_budget:
            return out + self._forced_tree(tokens)[: len(tokens) - 1]
        block = self.num_draft + 1
        for start in range(0, len(tokens) - 1, block):
            chunk = tokens[start:start + block][: len(tokens) - 1 - start]
            logits, _ = self._target_rows(torch.tensor([chunk], dtype=torch.long, device=dev))
            self.state.lengths += len(chunk)
            out += logits[0].argmax(-1).tolist()
        return out[: len(tokens)]

    def _forced_tree(self, tokens: list[int]) -> list[int]:
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
            start += len(branch)
        return out

    def generate_batch(self, prompts, max_new_tokens, eos_token_ids=(), sampling=None, seeds=None,
                       batch_size: int | None = None) -> list[GenerationResult]:
        """Generation for several prompts (any lengths), ``batch_size`` rows at a time (default:
        all at once) with continuous batching (``specc.runtime.batching``): per prompt the same
        tokens as that prompt alone. ``max_new_tokens``: one budget or one per prompt.
        ``sampling``: ``SamplingParams`` (None: greedy); ``seeds``: one per prompt (default:
        ``sampling.seed`` for each)."""
        from specc.runtime.batching import BatchScheduler

        prompts = [as_prompt_list(p) for p in prompts]
        budgets = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(budgets) != len(prompts):
            raise ValueError(f"{len(budgets)} max_new_tokens for {len(prompts)} prompts")
        with torch.inference_mode():
            scheduler = BatchScheduler(self, max(1, min(batch_size or len(prompts), len(prompts))), sampling=sampling)
            seeds = list(seeds) if seeds is not None else [None] * len(prompts)
            if len(seeds) != len(prompts):
                raise ValueError(f"seeds: {len(seeds)} given for {len(prompts)} prompts")
            return scheduler.run([(p, m, eos_token_ids, s) for p, m, s in zip(prompts, budgets, seeds)])

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
        ``sampling``: the ``SamplingParams`` every request of these slots decodes with (None or
        temperature 0: greedy)."""
        self._sampling = None if sampling is None or sampling.greedy else sampling
        self.policy = GreedyPolicy()  # a SamplingPolicy is made at the first prefill (it needs the vocabulary)
        if rows != self.batch:
            self.resize(self.max_len, rows)
        k_max = self.num_draft if self.drafter is not None else 0
        self.seq = torch.zeros(rows, self.max_len + k_max + 2, dtype=torch.long, device=self.target.device)
        self.n = [0] * rows  # committed tokens per slot (host mirror of state.lengths + 1)
        self.live = [False] * rows
        self._live_mask = None
        self.state.lengths.zero_()
        if self.drafter is not None:
            self.drafter.forwards = 0
            self.drafter.open_rows(rows)
        self.part_seconds = {}
        self._timer = PartTimer(self.target.device) if self.profile else _NoTimer()

    def prefill_slot(self, slot: int, prompt: list[int], seed: int | None = None) -> int:
        """Run ``prompt`` through the target into ``slot`` alone (a batch-1 forward on views of
        the slot's state rows; the other slots are untouched), start the drafter's sequence
        there, and return the first generated token (one host sync)."""
        plen = len(prompt)
        if not 0 < plen <= self.max_len:
            raise ValueError(f"prompt of {plen} tokens for a loop of max_len {self.max_len}")
        dev = self.target.device
        self._timer.mark("prefill")
        self.seq[slot, :plen] = torch.tensor(prompt, dtype=torch.long)
        ids = self.seq[slot:slot + 1, :plen]
        step = getattr(self.target, "eager", None) or self.target  # a one-off shape: never graphed
        with slot_view(self.target, slot) if self.batch > 1 else contextlib.nullcontext():
            out = step(ids, self._arange(plen), torch.zeros(1, dtype=torch.long, device=dev))
        logits, context = out if isinstance(out, tuple) else (out, None)
        self.state.lengths[slot] = plen  # the first generated token's K/V lands with the first verify step
        if self._sampling is None:
            first = logits[:, -1].argmax(-1)
        else:
            if isinstance(self.policy, GreedyPolicy):
                self.policy = decoding_policy(self._sampling, self.batch, self.seq[:, :1], logits.shape[-1],
                                              [self._sampling.seed] * self.batch)
            self.policy.start_row(slot, self._sampling.seed if seed is None else seed, self.seq[slot, :plen])
            first = self.policy.first_row(slot, logits[:, -1], torch.tensor([plen], device=dev))
        self.seq[slot, plen] = first[0]
        self.n[slot], self.live[slot], self._live_mask = plen + 1, True, None
        if self.drafter is not None:
            self.drafter.reset_slot(slot, plen, context)
        return int(first[0])

    def release_slot(self, slot: int) -> None:
        """Free ``slot`` (its request finished or was cancelled); a later prefill reuses it."""
        self.live[slot], self._live_mask = False, None
        self.state.release(slot)
        self.n[slot] = 0
        if self.drafter is not None:
            self.drafter.release_slot(slot)

    def speculate(self, budgets: list[int], num_draft: int | None = None) -> tuple[list[list[int]], int]:
        """One speculative step over every slot. ``budgets[b]``: tokens live slot b may still
        commit (>= 1); ``num_draft``: drafts per row this step (at most the loop's; None: the
        loop's, e.g. a goodput rule's choice, ``specc.runtime.adaptive``). Returns (per slot [accepted, committed tokens...] from the step's one
        device -> host copy: slot b committed ``row[1:row[0] + 2]``, free slots commit nothing;
        tree nodes verified, 0 for a chain step). Clipping at EOS / budgets is the caller's."""
        seq, n, rows, dev, timer = self.seq, self.n, self.batch, self.target.device, self._timer
        live = [b for b in range(rows) if self.live[b]]
        k, caps, active = 0, None, None
        if rows > 1:
            if self._live_mask is None:
                self._live_mask = torch.tensor([int(x) for x in self.live], dtype=torch.long, device=dev)
            active = self._live_mask
        if self.drafter is not None:
            if self.capture_shapes and not self._shapes_captured and self.num_draft > 0:
                self.drafter.capture_shapes(seq, self.num_draft)
                self._shapes_captured = True
            k = self.num_draft if num_draft is None else max(0, min(int(num_draft), self.num_draft))
            k = min(k, max(budgets[b] - 1 for b in live)) if self.cap_to_budget else k
            if rows > 1:
                row_caps = [0 if not self.live[b] else min(k, budgets[b] - 1) if self.cap_to_budget else k
                            for b in range(rows)]
                caps = torch.tensor(row_caps, dtype=torch.long, device=dev)
        drafting = None if rows == 1 or all(self.live) else self.live  # which rows' drafts are wanted
        timer.mark("draft")
        nodes = 0  # tree nodes verified this step (0: a chain step)
        if self.tree_budget and k > 0:
            host, context, nodes = self._tree_step(seq, n, k, caps, active, timer, drafting)
        else:
            policy = self.policy
            q = None
            if k == 0:
                drafts = seq[:, :0]
            elif isinstance(policy, GreedyPolicy):
                drafts = self._draft_rows(seq, n, k, drafting)
            else:
                drafts, q = policy.draft(self.drafter, seq, n, k, self.state.lengths, drafting)
            timer.mark("verify")
            if rows == 1:
                last = seq[:, n[0] - 1:n[0]]
            else:
                last = seq.gather(1, self.state.lengths[:, None])
            logits, context = self._target_rows(torch.cat([last, drafts], dim=1))
            timer.mark("accept")
            if caps is None and rows > 1:
                caps = torch.zeros(rows, dtype=torch.long, device=dev)  # no drafts: commit one token
            if isinstance(policy, GreedyPolicy):
                accepted, committed = self.verifier.verify(drafts, logits, caps)
            else:
                accepted, committed = policy.verify_chain(self.verifier, drafts, q, logits, caps, self.state.lengths)
                policy.observe(committed, accepted * active if active is not None else accepted)
            if rows == 1:
                seq[:, n[0]:n[0] + k + 1] = committed
                self.state.commit(accepted + 1)
            else:
                seq.scatter_(1, self.state.lengths[:, None] + self._arange(k + 2)[:, 1:], committed)
                self.state.commit((accepted + 1) * active)
            host = torch.cat([accepted[:, None], committed], dim=1).tolist()  # the step's one device -> host copy
        acc = [row[0] if self.live[b] else 0 for b, row in enumerate(host)]
        if self.drafter is not None:
            self.drafter.accepted_rows(n, acc, k, context)
        for b in live:
            n[b] += acc[b] + 1
        timer.mark(None)
        self.part_seconds = dict(timer.parts)
        return host, nodes

    def _draft_rows(self, seq, n, k, drafting, logits: bool = False):
        """The drafter's ``propose_rows`` (``propose_logits_rows``), told which rows are live only
        when some are not (drafters written before slots take no ``active``)."""
        fn = self.drafter.propose_logits_rows if logits else self.drafter.propose_rows
        return fn(seq, n, k) if drafting is None else fn(seq, n, k, active=drafting)

    def _tree_step(self, seq, n, k, caps, active, timer, drafting=None):
        """One tree step on the device (see the module doc): returns (the step's one host copy,
        rows of [accepted, committed...]; the target's hidden states along the accepted paths
        (DFlash context) or None; nodes verified)."""
        lengths = self.state.lengths
        root = seq.gather(1, lengths[:, None])[:, 0]  # the last committed token (not yet in the cache)
        draft_logits = self._draft_rows(seq, n, k, drafting, logits=True)  # [B, k, V], one forward
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
        if active is not None:
            accepted = accepted * active
        seq.scatter_(1, lengths[:, None] + self._arange(committed.shape[1] + 1)[:, 1:], committed)
        tree_fns["commit"](accepted + 1 if active is None else (accepted + 1) * active, path)
        context = None
        if hidden is not None:  # DFlash: the target's hidden states of the committed path
            context = hidden.gather(1, path.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1]))
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

                # commit moves K/V in place (not idempotent): captured at its second call, no warm-up
                fns = {name: GraphedStep(fn, max_tokens=1 << 30, warmup=0 if name == "commit" else 2,
                                         eager_first=name == "commit") for name, fn in fns.items()}
            self._tree_graphs = fns
        return fns

    def _commit_path(self, accepted_plus_one, path):
        """The state's tree commit (KV compaction of every layer: one launch each), a graph on CUDA."""
        self.state.commit(accepted_plus_one, path)

    def _accept_tree(self, tokens, parents, depths, mask, logits, caps, k):
        tree = DraftTree.planned(tokens, parents, depths, mask)
        res = self.tree_verifier.verify_tree(tree, logits, caps, depth=k)
        return res.accepted, res.committed, res.path
