"""Speculative sampling verification: the committed tokens are distributed exactly as the target's.

"Lossless" at temperature > 0 means *equal in distribution*: for every prefix, the next
committed token is distributed as the target's processed distribution p (``specc.sampling``)
given that prefix, so the joint distribution of the output equals plain sampling from the
target. It does not mean token-for-token equality with a plain sampler run with the same seed
(the random numbers are spent differently).

Chain (:class:`SamplingChainVerifier`, Leviathan et al. 2023 / Chen et al. 2023): drafts x_j were
sampled from the drafter's processed distribution q_j; x_j is accepted with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection the token is drawn from the residual
norm(max(p_j - q_j, 0)); after k acceptances a bonus token is drawn from p_k. A per-row cap
(``max_drafts``: finished rows, the token budget) that stops the chain at position c draws the
token at c from p_c (the cut depends on no random number, so this is exact too).

Tree (:class:`SamplingTreeVerifier`): the draft trees are built deterministically (best-first
from the drafter's processed log-probabilities, ``specc.runtime.trees``). At every node y ~ p
(the target's distribution after the node's path) is drawn; if a child carries y the walk moves
to it, else y is committed and the step ends. Each committed token is a draw from p given its
prefix: lossless for any tree. For a deterministic tree no lossless rule does better: the
committed token must be distributed as p, and the walk can only continue when that token is one
of the node's children, so P(continue) = sum of p over the children for every lossless rule; the
multi-draft recursive rejection of SpecInfer / SpecTr gains only when the children are random
draws from q, which ours are not. All nodes' draws are made at once (``uniform`` of the node's
absolute position: nodes of one depth share it, but a walk visits one node per depth), and the
walk is the greedy ``accept_tree`` over the drawn tokens: no per-depth host sync.

Random numbers come from ``specc.sampling.rng`` (seed, position, draw): no state, CUDA-graph safe.
"""

from __future__ import annotations

import torch

from specc.sampling import rng
from specc.runtime.verifiers import TreeVerifier, VerifyResult

__all__ = ["leviathan_accept", "SamplingChainVerifier", "SamplingTreeVerifier"]


def leviathan_accept(u: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Accept a draft x with probability min(1, p(x) / q(x)): u < p / q, without dividing."""
    return u * q_x < p_x


class SamplingChainVerifier:
    """Batched rejection sampling over chains. ``accept_rule(u, p_x, q_x) -> bool tensor`` is a
    parameter so tests can swap in a biased rule and check that the statistical tests catch it."""

    name = "sampling-chain"

    def __init__(self, accept_rule=leviathan_accept):
        self.accept_rule = accept_rule

    def verify(self, drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, seeds: torch.Tensor,
               start: torch.Tensor, max_drafts: torch.Tensor | None = None) -> VerifyResult:
        """``drafts`` [B, k] sampled from ``q`` [B, k, V] (None when k = 0); ``p`` [B, k + 1, V]:
        the target's processed distributions after each block input; ``seeds`` [B]; ``start``
        [B]: the sequence position of the first draft. Returns accepted [B] and committed
        [B, k + 1] (row b commits ``committed[b, :accepted[b] + 1]``)."""
        bsz, k = drafts.shape
        dev = drafts.device
        if k:
            positions = start[:, None] + torch.arange(k, device=dev)[None]
            p_x = p[:, :k].gather(2, drafts[..., None])[..., 0]
            q_x = q.gather(2, drafts[..., None])[..., 0]
            ok = self.accept_rule(rng.uniform(seeds, positions, rng.ACCEPT), p_x, q_x)
            natural = ok.to(torch.long).cumprod(1).sum(1)
        else:
            natural = torch.zeros(bsz, dtype=torch.long, device=dev)
        accepted = natural if max_drafts is None else torch.minimum(natural, max_drafts.to(natural.dtype))
        # draft `accepted` was tested and refused; a draft past the row's cap counts as not drafted
        # (the row then samples its bonus from p, as the same row with k = cap would: a seed gives
        # the same tokens whatever the batch's k)
        rejected = (natural == accepted) & (accepted < k)
        if max_drafts is not None:
            rejected = rejected & (accepted < max_drafts.to(accepted.dtype))
        p_a = p.gather(1, accepted[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
        dist = p_a
        if k:
            q_a = q.gather(1, accepted.clamp(max=k - 1)[:, None, None].expand(-1, 1, q.shape[-1]))[:, 0]
            residual = (p_a - q_a).clamp(min=0)
            use = rejected & (residual.sum(-1) > 0)  # p == q: a rejection has probability 0
            dist = torch.where(use[:, None], residual, p_a)
        token = rng.sample(dist, rng.uniform(seeds, start + accepted, rng.TARGET))
        committed = torch.cat([drafts, token[:, None]], dim=1)
        committed = committed.scatter(1, accepted[:, None], token[:, None])
        return VerifyResult(accepted, committed)


class SamplingTreeVerifier:
    """The tree rule of the module doc over a ``DraftTree`` (lossless for any tree)."""

    name = "sampling-tree"

    def __init__(self):
        self._walk = TreeVerifier()

    def verify_tree(self, tree, p: torch.Tensor, seeds: torch.Tensor, start: torch.Tensor,
                    max_drafts: torch.Tensor | None = None, depth: int | None = None) -> VerifyResult:
        """``p`` [B, N, V]: the target's processed distribution after each node; ``start`` [B]:
        the sequence position of the root's child (the first drafted position)."""
        drawn = rng.sample(p, rng.uniform(seeds, start[:, None] + tree.depths, rng.TARGET))  # [B, N]
        return self._walk.verify_tree_tokens(tree, drawn, max_drafts, depth)
