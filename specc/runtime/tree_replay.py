"""Tree acceptance replay: a tree verifier that decides the accepted path from a per-rank model.

The chain replay (``specc.runtime.replay.ReplayVerifier``) makes random-weight benchmarks at real
sizes commit what a trained pair would; this is the same for draft trees. A tree acceptance
model (``specc.search.tree_acceptance.TreeAcceptanceModel``) states ``p[d][r]``: the probability
that the target's token at depth d is the drafter's rank-r candidate there, given that the path
up to depth d - 1 was accepted. Per step and row, :class:`TreeReplayVerifier` walks from the
root: at depth d it draws which rank (if any) the target "picks", ``r_d = #{r : u_d >=
cdf_d[r]}`` with ``u_d`` uniform and ``cdf_d`` the running sum of ``p[d]`` (past the recorded ranks
the pick is a miss), moves to the current node's child of that rank if the tree has it, else
stops. It commits the path's drafted tokens followed by the target's own token (its argmax) at
the last accepted node, capped by ``max_drafts`` as every verifier is.

Two things besides the decision are the model's, both stated in every report:

- **The tree's shape.** A random drafter's distributions are nearly flat, so the best-first
  tree the runtime builds from them (``runtime.trees.build_tree``) would be all depth-1 nodes.
  :meth:`TreeReplayVerifier.plan` therefore builds the tree from the drafter's top candidates
  re-weighted by the model: at position d the drafter's rank-r token gets log p[d][r] (the
  rest of the vocabulary shares the remaining mass), then runs the real ``plan_tree`` on those
  logits. The tree is the model's best tree (the one ``TreeAcceptanceModel.best_tree`` and the
  cost model price), its tokens are the drafter's own candidates, and the plan's work is the
  real plan's plus one top-k and one scatter over [B, D, V].
- **Ranks are sorted.** Each depth's probabilities are sorted descending (a measured row is
  non-increasing up to noise), so the tree's i-th child of a node (children in slot order: the
  best-first construction orders siblings by probability) is the rank-i candidate.

A node's rank among its siblings is its index among the nodes with the same parent, in slot
order. With one rank per depth (``p[d] = [alpha_d]``, a chain model) the walk accepts depth d
exactly when ``u_d < alpha_d``: the chain replay's rule, so a chain-shaped tree (``tree_topk=1``)
accepts what the chain replay does for the same alphas.

Everything else in the step stays real: the draft forward, the tree verify forward over every
node, the KV compaction of the accepted path and the DFlash context gathered along it. The draws
are counter-based (``specc.sampling.rng``, seeded: a function of the seed, the row, a step
counter kept on the device and the depth), so the decision is device-only tensor work with
static shapes and no host sync, and the graphed accept function (``device_loop._tree_fns``)
replays it: the counter is advanced in place inside the graph.

**The committed tokens are not the model's output** (``specc.runtime.replay.REPLAY_NOTICE``):
replay is for timing only.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from specc.runtime.replay import InPlaceTensors
from specc.runtime.trees import DraftTree, accept_matched, plan_tree
from specc.runtime.verifiers import TreeVerifier, VerifyResult
from specc.sampling import rng

__all__ = ["TreeReplayVerifier", "sibling_ranks", "draw_ranks"]

# draw position = step counter * stride + depth (depths < 4096); rng.uniform reads 32 bits of it,
# so the draws repeat after 2**20 steps (a benchmark makes thousands)
_POSITION_STRIDE = 1 << 12


def sibling_ranks(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] long: each node's index among the nodes with the same parent, in slot order (the
    root: 0). In a best-first tree that is its rank among its parent's children."""
    n = parents.shape[1]
    same = parents[:, :, None] == parents[:, None, :]  # [B, i, j]
    earlier = torch.ones(n, n, dtype=torch.bool, device=parents.device).tril(-1)  # j < i
    return (same & earlier).sum(-1)


def draw_ranks(u: torch.Tensor, cdf: torch.Tensor) -> torch.Tensor:
    """Ranks picked by uniforms ``u`` [B, D] from per-depth cumulative rank probabilities ``cdf``
    [D, R]: the first r with u < cdf[d, r]; -1 (a miss: no rank the model records) past them."""
    rank = (u[..., None] >= cdf[None]).sum(-1)
    return torch.where(rank < cdf.shape[-1], rank, torch.full_like(rank, -1))


class TreeReplayVerifier(TreeVerifier):
    """``p``: per-depth rank probabilities (``p[d - 1][r]``; depths past the list reuse the last
    row; each row a sub-probability vector, sorted descending here); ``seed``: the draws' seed
    (:meth:`reset` restarts or re-seeds them in place, so captured graphs stay valid)."""

    name = "tree-replay"

    def __init__(self, p: Sequence[Sequence[float]], seed: int = 0, source: str = ""):
        rows = [sorted((float(x) for x in row), reverse=True) for row in p]
        if not rows or any(not row for row in rows):
            raise ValueError("a tree acceptance replay needs at least one rank probability per depth")
        for d, row in enumerate(rows, 1):
            if any(not 0.0 <= x <= 1.0 for x in row) or sum(row) > 1 + 1e-6:
                raise ValueError(f"rank probabilities at depth {d} are not a sub-probability vector: {row}")
        self.p, self.seed, self.source = rows, int(seed), source
        self._tables: dict = {}
        self._counters = InPlaceTensors.counters()  # per device: steps drawn so far
        self._seeds = InPlaceTensors(lambda key: self._row_seeds(*key))  # per (rows, device): the rows' seeds

    @classmethod
    def from_model(cls, model, seed: int = 0) -> "TreeReplayVerifier":
        """From a ``TreeAcceptanceModel``."""
        return cls(model.p, seed=seed, source=model.source)

    @property
    def step(self) -> int:
        """Steps drawn so far (the on-device counter; reading it syncs), as ``ReplayVerifier.step``."""
        return self._counters.most_steps()

    def reset(self, seed: int | None = None) -> None:
        """Restart the draws (the same sequence again unless a new ``seed`` is given)."""
        if seed is not None:
            self.seed = int(seed)
        self._counters.remake()
        self._seeds.remake()

    # ------------------------------------------------------------------ the model on the device

    def _rows(self, depth: int) -> list[list[float]]:
        return [self.p[min(d, len(self.p) - 1)] for d in range(depth)]

    def _table(self, depth: int, device, vocab: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cdf [D, R], planning logits of the named ranks [D, R], of every other token [D]) for
        ``depth`` drafted positions and a vocabulary of ``vocab``; R = the longest row (shorter
        rows padded with probability 0). Planning logits: log p[d][r] for a named rank, an equal
        share of the remaining mass for the unnamed tokens, kept below every named rank of
        positive probability so that the i-th child of a node is always the rank-i candidate;
        ranks of probability 0 come last."""
        key = (depth, vocab, str(device))
        table = self._tables.get(key)
        if table is None:
            rows = self._rows(depth)
            width = max(len(r) for r in rows)
            probs = torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float64)
            cdf = probs.cumsum(-1).clamp(max=1.0)
            positive = probs > 0
            named = probs.clamp(min=1e-300).log()
            lowest = torch.where(positive, named, torch.full_like(named, math.inf)).amin(-1)  # [D]
            unnamed = max(vocab - width, 1)
            share = ((1.0 - probs.sum(-1)).clamp(min=1e-30) / unnamed).log()
            share = torch.minimum(share, lowest - 1.0)
            logits = torch.where(positive, named, share[:, None] - 30.0)  # far below: no mass to speak of
            table = (cdf.to(torch.float32).to(device), logits.to(torch.float32).to(device),
                     share.to(torch.float32).to(device))
            self._tables[key] = table
        return table

    def _row_seeds(self, rows: int, device) -> torch.Tensor:
        return (self.seed << 20) + torch.arange(rows, dtype=torch.long, device=device)

    def uniforms(self, rows: int, depth: int, device) -> torch.Tensor:
        """[rows, depth] uniforms of the next step (advances the on-device step counter)."""
        dev = torch.device(device)
        counter, seeds = self._counters[str(dev)], self._seeds[(rows, str(dev))]
        counter.add_(1)
        position = counter * _POSITION_STRIDE + torch.arange(depth, device=dev)
        return rng.uniform(seeds, position[None].expand(rows, depth), rng.ACCEPT)

    # ------------------------------------------------------------------ the tree's shape

    def plan_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[B, D, V] logits whose best-first tree is the model's: the drafter's rank-r token at
        position d gets log p[d][r], every other token an equal share of the remaining mass."""
        bsz, depth, vocab = draft_logits.shape
        _, named, share = self._table(depth, draft_logits.device, vocab)
        width = min(named.shape[1], vocab)
        top = draft_logits.topk(width, dim=-1).indices  # [B, D, R]: the drafter's candidates by rank
        out = share[None, :, None].expand(bsz, depth, vocab).clone()
        return out.scatter_(-1, top, named[None, :, :width].expand(bsz, -1, -1))

    def plan(self, draft_logits, root_tokens, base, budget, topk=None):
        return plan_tree(self.plan_logits(draft_logits), root_tokens, base, budget, topk)

    # ------------------------------------------------------------------ the decision

    def verify_tree_tokens(self, tree, target_tokens, max_drafts=None, depth=None) -> VerifyResult:
        if depth is None:
            depth = int(tree.depths.max()) if tree.num_nodes else 0
        u = self.uniforms(tree.tokens.shape[0], max(depth, 1), tree.tokens.device)
        return self.decide(tree, target_tokens, u, max_drafts, depth)

    def decide(self, tree: DraftTree, target_tokens: torch.Tensor, u: torch.Tensor,
               max_drafts: torch.Tensor | None = None, depth: int | None = None) -> VerifyResult:
        """The replayed acceptance for given uniforms ``u`` [B, D] (``u[b, d - 1]`` decides depth
        d): ``VerifyResult`` as ``TreeVerifier`` returns it (accepted, committed [B, D + 1],
        path [B, D + 1])."""
        if depth is None:
            depth = int(tree.depths.max()) if tree.num_nodes else 0
        cdf, _, _ = self._table(max(depth, 1), tree.tokens.device)
        picked = draw_ranks(u[:, : cdf.shape[0]], cdf)  # [B, D]
        at_depth = picked.gather(1, (tree.depths - 1).clamp(min=0, max=picked.shape[1] - 1))  # [B, N]
        matched = sibling_ranks(tree.parents) == at_depth
        accepted, path = accept_matched(tree, matched, depth)
        if max_drafts is not None:
            accepted = torch.minimum(accepted, max_drafts.to(accepted.dtype))
            steps = torch.arange(path.shape[1], device=path.device)[None]
            path = torch.where(steps <= accepted[:, None], path, torch.full_like(path, -1))
        node = path.clamp(min=0)
        own = target_tokens.gather(1, node)  # the target's token after each path node
        nxt = torch.cat([tree.tokens.gather(1, node[:, 1:]), own[:, -1:]], dim=1)  # the path's next drafted token
        steps = torch.arange(path.shape[1], device=path.device)[None]
        committed = torch.where(steps < accepted[:, None], nxt, own)
        return VerifyResult(accepted, committed, path)
