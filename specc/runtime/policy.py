"""How a loop picks tokens: greedy or sampling, chosen once per generation.

The loops (``specc.runtime.device_loop``, ``specc.runtime.eager``) call a policy at each point
where greedy decoding and speculative sampling differ: the prefill's token, drafting, chain
verification, the draft tree's scores, tree verification, and after each commit. ``decoding_policy``
returns :class:`GreedyPolicy` for temperature 0 / no params, which makes exactly the calls the
greedy loop always made (same ops, same results); :class:`SamplingPolicy` otherwise, which holds
each row's params (``specc.sampling.rows.RowParams``: a continuous batch mixes requests with
different temperatures, top-k / top-p / min-p, penalties and seeds, greedy rows among them), one
seed per row and, when some row has a repetition penalty, the set of tokens each row has seen (on
the device, [B, V + 1] bool: the last column absorbs masked-out writes). A greedy row of a
SamplingPolicy has a one-hot distribution at its argmax: speculative sampling then commits its
greedy tokens exactly.

Graph safety: a row's parameters are tensor entries written when its request enters the slot
(``start_row``), so a step's shapes and its device values do not steer Python. Three things are
decided on the host from the requests' params, and only when a request enters: the loop switches
from GreedyPolicy to a SamplingPolicy at the first sampled request, the seen set is allocated at
the first request with a repetition penalty (until then the penalty's ops are skipped), and top-k /
top-p / min-p run once some request has used them (``RowParams.used``).

Positions: ``lengths`` [B] (the decoding state's lengths) is the sequence index of each row's last
committed token, so a step decides positions lengths + 1, ...; ``first`` gets the prefill token's
position itself. The random numbers of a decision at position i are ``rng.uniform(seed, i, draw)``.
"""

from __future__ import annotations

import torch

from specc.sampling import rng
from specc.sampling.params import SamplingParams
from specc.sampling.rows import RowParams, process_rows, rows_probs
from specc.runtime.sampling_verify import SamplingChainVerifier, SamplingTreeVerifier
from specc.runtime.uploads import upload

__all__ = ["GreedyPolicy", "SamplingPolicy", "decoding_policy"]


class GreedyPolicy:
    """Greedy decoding: the calls the loops made before sampling existed."""

    sampling = None

    def first(self, logits_last: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return logits_last.argmax(-1)

    def draft(self, drafter, seq, n, k, lengths, active=None):
        return (drafter.propose_rows(seq, n, k) if active is None else drafter.propose_rows(seq, n, k, active=active)), None

    def draft_list(self, drafter, seq: list[int], k: int, lengths) -> tuple[list[int], torch.Tensor | None]:
        """The eager loop's host-list form: ``drafter.propose`` (which may give fewer than k)."""
        return drafter.propose(seq, k), None

    def verify_chain(self, verifier, drafts, q, logits, caps, lengths):
        return verifier.verify(drafts, logits, caps)

    def tree_logprobs(self, draft_logits: torch.Tensor, lengths) -> torch.Tensor:
        return draft_logits.float().log_softmax(-1)

    def verify_tree(self, verifier, tree, logits, caps, depth, lengths):
        return verifier.verify_tree(tree, logits, caps, depth=depth)

    def tree_logits(self, draft_logits: torch.Tensor, lengths) -> torch.Tensor:
        """What the device loop's tree planner (``trees.plan_tree``) builds the tree from."""
        return draft_logits

    def accept_tree(self, greedy_accept, tokens, parents, depths, mask, logits, caps, depth, lengths):
        """The device loop's tree acceptance over the planned tree's tensors: ``greedy_accept``
        (the loop's, CUDA-graphed on a GPU) -> (accepted, committed, path)."""
        return greedy_accept(tokens, parents, depths, mask, logits, caps, depth)

    def observe(self, committed, accepted) -> None:
        pass


class SamplingPolicy:
    """Speculative sampling (``specc.runtime.sampling_verify``) for one generation's rows.
    ``params``: one SamplingParams for every row, or one per row (None or greedy: a greedy row)."""

    def __init__(self, params, seeds: torch.Tensor, prompts: torch.Tensor, vocab: int,
                 chain_verifier: SamplingChainVerifier | None = None):
        rows = prompts.shape[0]
        per_row = list(params) if isinstance(params, (list, tuple)) else [params] * rows
        if len(per_row) != rows:
            raise ValueError(f"sampling params: {len(per_row)} given for {rows} rows")
        self.sampling, self.seeds, self.vocab = params, seeds, vocab
        self.rows = RowParams.of(per_row, prompts.device)
        self.chain = chain_verifier or SamplingChainVerifier()
        self.tree = SamplingTreeVerifier()
        self.seen = None
        if any(p is not None and not p.greedy and p.uses_history for p in per_row):
            self.seen = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=prompts.device)
            self.seen.scatter_(1, prompts.clamp(max=vocab), True)
        # every row's tensors; ``set_width`` binds views of the first ones (a batch bucket)
        self._all = (self.seeds, self.rows, self.seen)

    @property
    def capacity(self) -> int:
        """Rows the policy was made for (its width may be fewer: ``set_width``)."""
        return self._all[1].rows

    def set_width(self, rows: int) -> None:
        """Sample for the first ``rows`` rows (``DeviceSpeculativeDecoder.set_width``): views of
        every row's seeds, parameters and seen sets (all rows: the tensors themselves)."""
        seeds, params, seen = self._all
        if rows == params.rows:
            self.seeds, self.rows, self.seen = seeds, params, seen
            return
        self.seeds = seeds[:rows]
        self.rows = RowParams(*(t[:rows] for t in params._tensors()), used=params.used)
        self.seen = None if seen is None else seen[:rows]

    def move_rows(self, src: list[int], dst: list[int]) -> None:
        """Rows ``src`` take rows ``dst`` (pairwise; slot moves): seeds, parameters, seen sets.
        The random numbers are functions of (seed, position), not of the row."""
        seeds, params, seen = self._all
        s, d = upload(src, seeds.device), upload(dst, seeds.device)  # queued: no host sync
        for tensor in (seeds, *params._tensors(), *(() if seen is None else (seen,))):
            tensor[d] = tensor[s]

    def _base(self, shape_mid: int | None = None):
        if self.seen is None:
            return None
        base = self.seen[:, : self.vocab]
        return base if shape_mid is None else base[:, None].expand(-1, shape_mid, -1)

    def _with(self, tokens: torch.Tensor) -> torch.Tensor:
        """The seen set plus ``tokens`` [B, m] (context tokens not committed yet)."""
        extra = torch.zeros_like(self.seen).scatter_(1, tokens, True)
        return (self.seen | extra)[:, : self.vocab]

    def probs(self, logits: torch.Tensor, seen, rows: RowParams | None = None) -> torch.Tensor:
        """Each row's distribution (``rows``: the parameters of ``logits``' rows; default every
        row's). A drafter's logits may carry padding columns past the target's vocabulary: cut."""
        return rows_probs(logits[..., : self.vocab], self.rows if rows is None else rows, seen)

    def first(self, logits_last, position):
        token = rng.sample(self.probs(logits_last, self._base()), rng.uniform(self.seeds, position, rng.TARGET))
        self.observe(token[:, None], torch.zeros_like(token))
        return token

    def draft(self, drafter, seq, n, k, lengths, active=None):
        """Drafts [B, k] drawn from the drafter's processed distributions q [B, k, V]. A parallel
        drafter without a repetition penalty draws all positions in one batch of ops (the same
        numbers as position by position: each draw is a function of its own position).
        ``active``: the live slots when some are free (the drafters' ``active``)."""
        start = lengths + 1
        kw = {} if active is None else {"active": active}
        if drafter.supports_tree and self.seen is None:
            q = self.probs(drafter.propose_logits_rows(seq, n, k, **kw), None)
            positions = start[:, None] + torch.arange(k, device=start.device)[None]
            return rng.sample(q, rng.uniform(self.seeds, positions, rng.DRAFT)), q
        # tokens picked so far per row (-1: none yet): a solo row (drafting alone) picks for itself
        picked = torch.full((seq.shape[0], k), -1, dtype=torch.long, device=seq.device)

        def pick(logits: torch.Tensor, j: int, rows=None):
            index = slice(None) if rows is None else torch.tensor(rows, device=seq.device)
            seen = None
            if self.seen is not None:
                before = picked[index, :j]
                extra = torch.zeros(before.shape[0], self.vocab + 1, dtype=torch.bool, device=seq.device)
                extra.scatter_(1, torch.where(before >= 0, before, torch.full_like(before, self.vocab)), True)
                seen = (self.seen[index] | extra)[:, : self.vocab]
            q = self.probs(logits, seen, None if rows is None else self.rows.index(index))
            token = rng.sample(q, rng.uniform(self.seeds[index], start[index] + j, rng.DRAFT))
            picked[index, j] = token
            return token, q

        return drafter.propose_sampled_rows(seq, n, k, pick, **kw)

    def draft_list(self, drafter, seq: list[int], k: int, lengths):
        drafted, q = self.draft(drafter, torch.tensor([seq], device=lengths.device), [len(seq)], k, lengths)
        return drafted[0].tolist(), q

    def _chain_seen(self, drafts: torch.Tensor):
        """[B, k + 1, V]: the context after each block input (drafts before it included)."""
        if self.seen is None:
            return None
        bsz, k = drafts.shape
        hot = torch.nn.functional.one_hot(drafts, self.vocab).cumsum(1) > 0  # [B, k, V]
        hot = torch.cat([torch.zeros_like(hot[:, :1]) if k else hot.new_zeros(bsz, 1, self.vocab), hot], dim=1)
        return hot | self._base(k + 1)

    def verify_chain(self, verifier, drafts, q, logits, caps, lengths):
        p = self.probs(logits, self._chain_seen(drafts))
        res = self.chain.verify(drafts, q, p, self.seeds, lengths + 1, caps)
        return res.accepted, res.committed

    def tree_logprobs(self, draft_logits, lengths):
        return self.tree_logits(draft_logits, lengths).log_softmax(-1)

    def _tree_seen(self, tree):
        if self.seen is None:
            return None
        hot = torch.nn.functional.one_hot(tree.tokens, self.vocab).float()
        hot[:, 0] = 0  # the root is the last committed token: already seen
        paths = torch.bmm(tree.ancestor_mask().float(), hot) > 0  # each node's path tokens
        return paths | self._base(tree.num_nodes)

    def verify_tree(self, verifier, tree, logits, caps, depth, lengths):
        p = self.probs(logits, self._tree_seen(tree))
        return self.tree.verify_tree(tree, p, self.seeds, lengths + 1, caps, depth)

    def tree_logits(self, draft_logits, lengths):
        """Processed logits (-inf where a token cannot be sampled): the planner's log_softmax of
        them is ``tree_logprobs``."""
        return process_rows(draft_logits[..., : self.vocab], self.rows, self._base(draft_logits.shape[1]))

    def accept_tree(self, greedy_accept, tokens, parents, depths, mask, logits, caps, depth, lengths):
        from specc.runtime.trees import DraftTree

        tree = DraftTree.planned(tokens, parents, depths, mask)
        res = self.verify_tree(None, tree, logits, caps, depth, lengths)
        self.observe(res.committed, res.accepted)
        return res.accepted, res.committed, res.path

    def restart(self) -> None:
        """Every row greedy again, for a new generation that reuses this policy (the device loop
        keeps one per batch size, so CUDA graphs captured over its tensors stay valid): params and
        seeds rewritten in place, the seen set dropped. ``RowParams.used`` stays: a processor no row
        has on changes no row's distribution (each is masked per row)."""
        seeds, params, _ = self._all
        for row in range(params.rows):
            params.set_row(row, None)
        seeds.zero_()
        self.seen, self._all = None, (seeds, params, None)
        self.set_width(params.rows)

    def start_row(self, slot: int, seed: int, prompt: torch.Tensor, params=None) -> None:
        """A request enters ``slot`` (continuous batching): its seed, its params (None: a greedy
        row) and, when it has a repetition penalty, its prompt as the seen set."""
        self.seeds[slot] = int(seed)
        self.rows.set_row(slot, params)
        if self.seen is None and params is not None and not params.greedy and params.uses_history:
            # the first request with a penalty: the other rows' sets are never read (penalty off)
            seeds, rows, _ = self._all
            self._all = (seeds, rows, torch.zeros(rows.rows, self.vocab + 1, dtype=torch.bool, device=prompt.device))
            self.set_width(self.rows.rows)
        if self.seen is not None:
            self.seen[slot] = False
            self.seen[slot].scatter_(0, prompt.clamp(max=self.vocab), True)

    def first_row(self, slot: int, logits_last: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """``first`` for one slot's prefill: ``logits_last`` [1, V], ``position`` [1]."""
        seen = None if self.seen is None else self.seen[slot:slot + 1, : self.vocab]
        probs = self.probs(logits_last, seen, self.rows.index(slice(slot, slot + 1)))
        token = rng.sample(probs, rng.uniform(self.seeds[slot:slot + 1], position, rng.TARGET))
        if self.seen is not None:
            self.seen[slot, token[0]] = True
        return token

    def observe(self, committed: torch.Tensor, accepted: torch.Tensor) -> None:
        """Add row b's committed tokens ``committed[b, :accepted[b] + 1]`` to its seen set."""
        if self.seen is None:
            return
        keep = torch.arange(committed.shape[1], device=committed.device)[None] <= accepted[:, None]
        self.seen.scatter_(1, torch.where(keep, committed, torch.full_like(committed, self.vocab)), True)


def decoding_policy(sampling: SamplingParams | None, rows: int, prompts: torch.Tensor, vocab: int,
                    seeds=None, chain_verifier=None):
    """GreedyPolicy when ``sampling`` is None or greedy, else a SamplingPolicy. ``seeds``: one
    per row (default: every row uses ``sampling.seed``); ``prompts`` [B, P] on the device."""
    if sampling is None or sampling.greedy:
        return GreedyPolicy()
    if seeds is None:
        seeds = [sampling.seed] * rows
    if len(seeds) != rows:
        raise ValueError(f"seeds: {len(seeds)} given for {rows} rows")
    for s in seeds:
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < 2 ** 63:
            raise ValueError(f"seeds must be integers in [0, 2**63), got {s!r}")
    seeds_t = torch.tensor(list(seeds), dtype=torch.long, device=prompts.device)
    return SamplingPolicy(sampling, seeds_t, prompts, vocab, chain_verifier)
