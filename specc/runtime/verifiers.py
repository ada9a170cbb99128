"""Verifiers: decide, on the device and over a batch, which drafted tokens the target accepts.

A speculative step feeds the target a block per row (:class:`VerifyInput`) and gets logits for
every block position; a verifier turns (drafts, target logits) into how many tokens each row
commits and which ones. It runs on the device with no host sync; the loop copies the result
to the host once per step.

- :class:`ChainVerifier` (greedy, a chain of k drafts): the longest prefix of drafts equal to the
  target's argmax, then the target's own token. The one greedy-acceptance implementation in
  specc: the batched kernel ``specc.codegen.kernels.greedy.greedy_accept`` (Triton on the GPU,
  its torch reference elsewhere). The stock loops (``specc.stock``) keep their own host code on
  purpose: they are the independent oracle.

- :class:`TreeVerifier` (greedy, a draft tree of N nodes, ``specc.runtime.trees``): the longest
  root path whose every token is the target's argmax at its parent, then the target's own token
  at the path's last node (the bonus). ``VerifyInput.parents`` / ``tree_mask`` carry the tree;
  the result's ``path`` gives the accepted nodes' block slots, which
  ``DecodingState.commit(accepted + 1, path)`` compacts into place.

Ragged (packed) verifies and two-level verification are the device loop's
(``specc.runtime.device_loop``): it unpacks their logits into the padded ``[B, k + 1, V]`` layout
and calls the same verifiers, with per-row caps, so the decision rule has one implementation.
"""

from __future__ import annotations

import dataclasses

import torch

from specc.codegen.kernels.greedy import greedy_accept

__all__ = ["VerifyInput", "VerifyResult", "Verifier", "ChainVerifier", "TreeVerifier", "VERIFIERS"]


@dataclasses.dataclass
class VerifyInput:
    """What the target sees in a verify step. ``tokens`` [B, Q]: the last committed token then
    the drafts; ``positions`` [B, Q]; ``cache_len`` [B]: tokens already in the target's state;
    ``parents`` [B, Q] (tree: parent slot per node, -1 root; None for a chain); ``tree_mask``
    [B, Q, Q] (None for a chain); ``query_lens`` [B] (ragged rows; None = all Q)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    cache_len: torch.Tensor
    parents: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    query_lens: torch.Tensor | None = None


@dataclasses.dataclass
class VerifyResult:
    """``accepted`` [B]: drafts accepted per row (a row commits ``accepted + 1`` tokens);
    ``committed`` [B, k + 1]: row b's committed tokens are ``committed[b, :accepted[b] + 1]``
    (entries after are junk); ``path`` [B, P]: tree verifiers only, the block slots of the
    accepted nodes in order (None for a chain: the accepted positions are the prefix)."""

    accepted: torch.Tensor
    committed: torch.Tensor
    path: torch.Tensor | None = None


class Verifier:
    """Base of verifiers: ``verify(drafts [B, k], target_logits [B, k + 1, V]) -> (accepted [B],
    committed [B, k + 1])`` on the device, no host sync. ``max_drafts`` [B] (optional) caps the
    drafts a row may accept (0 for a finished row, or a per-row speculation length). Two-level
    verification's second call passes the remaining drafts of the rows that go on with ``start``
    (their block position, k1) and ``rows`` (their indices in the step's batch): a verifier whose
    decision is a function of its inputs ignores them."""

    name = ""

    def verify(self, drafts: torch.Tensor, target_logits: torch.Tensor,
               max_drafts: torch.Tensor | None = None, *, start: int = 0,
               rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def verify_tokens(self, drafts: torch.Tensor, target_tokens: torch.Tensor,
                      max_drafts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The same from the target's greedy tokens [B, k + 1] instead of its logits."""
        raise NotImplementedError


class ChainVerifier(Verifier):
    """Greedy chain acceptance: ``accepted[b]`` = the longest prefix where
    ``drafts[b, j] == argmax(target_logits[b, j])``; the committed tokens are the target's own
    tokens over that prefix plus one (equal to the drafts where accepted), so ``committed`` is
    simply the target's argmax."""

    name = "chain"

    def verify(self, drafts, target_logits, max_drafts=None, *, start=0, rows=None):
        return self.verify_tokens(drafts, target_logits.argmax(-1), max_drafts)

    def verify_tokens(self, drafts, target_tokens, max_drafts=None):
        accepted, _ = greedy_accept(drafts, target_tokens, max_drafts, opt_in=True)
        return accepted, target_tokens


class TreeVerifier(Verifier):
    """Greedy tree acceptance (``specc.runtime.trees.accept_tree``) over a ``DraftTree``.

    ``verify_tree(tree, target_logits [B, N, V], max_drafts)`` -> ``VerifyResult`` with
    ``accepted`` [B] (drafted tokens accepted, capped by ``max_drafts``), ``committed`` [B, D + 1]
    (row b commits ``committed[b, :accepted[b] + 1]``: the path's tokens then the bonus, which
    are the target's argmax at the path's nodes, since every accepted node matched it) and
    ``path`` [B, D + 1] (node indices of the accepted path from the root, -1 past its end).
    On the device, no host sync (depth-many small ops)."""

    name = "tree"

    def plan(self, draft_logits: torch.Tensor, root_tokens: torch.Tensor, base: torch.Tensor, budget: int,
             topk: int | None = None):
        """The tree a step verifies, from the drafter's per-position logits [B, D, V]
        (``specc.runtime.trees.plan_tree``: tokens, parents, depths, positions, ancestor mask).
        A verifier owns it so that an acceptance replay can state the tree's shape too."""
        from specc.runtime.trees import plan_tree

        return plan_tree(draft_logits, root_tokens, base, budget, topk)

    def verify_tree(self, tree, target_logits: torch.Tensor, max_drafts: torch.Tensor | None = None,
                    depth: int | None = None) -> VerifyResult:
        return self.verify_tree_tokens(tree, target_logits.argmax(-1), max_drafts, depth)

    def verify_tree_tokens(self, tree, target_tokens: torch.Tensor,
                           max_drafts: torch.Tensor | None = None, depth: int | None = None) -> VerifyResult:
        """``depth``: the drafted positions the tree came from (fixes the path's width, no sync)."""
        from specc.runtime.trees import accept_tree

        accepted, path = accept_tree(tree, target_tokens, depth)
        if max_drafts is not None:
            accepted = torch.minimum(accepted, max_drafts.to(accepted.dtype))
            steps = torch.arange(path.shape[1], device=path.device)[None]
            path = torch.where(steps <= accepted[:, None], path, torch.full_like(path, -1))
        committed = target_tokens.gather(1, path.clamp(min=0))
        return VerifyResult(accepted, committed, path)

    def verify(self, drafts, target_logits, max_drafts=None):
        raise TypeError("TreeVerifier verifies a draft tree: call verify_tree(tree, target_logits)")

    verify_tokens = verify


VERIFIERS: dict[str, type[Verifier]] = {"chain": ChainVerifier, "tree": TreeVerifier}
