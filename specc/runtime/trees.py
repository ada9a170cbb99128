"""Draft trees from per-position drafter distributions, built on the device.

A parallel drafter (DFlash, PARD) gives a distribution at every block position in one forward.
Verifying only the top-1 chain wastes the rest. DDTree (arXiv 2604.12989) keeps, under a node
budget, the draft prefixes with the highest path log-probability, where a prefix (r_1, ..., r_d)
picks the r_i-th most likely token at position i and scores sum_i logp_i[r_i].

Because the per-position distributions do not depend on the path, a prefix never scores above
its parent, so the ``budget`` best prefixes over all depths are closed under taking parents: they
form a tree. They can be found without a heap, depth by depth: the best prefixes of depth d all
extend one of the best ``budget`` prefixes of depth d - 1, so a beam of width ``budget`` over
(parent, rank) pairs followed by one top-``budget`` over all depths gives exactly the heap's
answer (ties broken by lower depth, then by the beam's order). That is ``depth`` small top-k calls
on [B, budget * topk] scores: no host sync, capturable in a CUDA graph; on the GPU the whole beam
is one kernel (``specc.codegen.kernels.tree_beam``: launches, not FLOPs, are its cost at batch 1).

``DraftTree`` is the batch-shaped result every tree consumer reads (attention mask, positions,
acceptance, KV commit): node 0 is the root (the last committed token), nodes are ordered so that
a parent precedes its children.
"""

from __future__ import annotations

import dataclasses

import torch

from specc.codegen.kernels.tree_beam import tree_beam
from specc.codegen.kernels.tree_mask import pack_tree_mask


@dataclasses.dataclass
class DraftTree:
    """A batch of draft trees with the same node count ``N`` (root included).

    tokens [B, N]: node tokens (node 0: the last committed token);
    parents [B, N]: parent node index (-1 for the root);
    depths [B, N]: 0 for the root, d for a token drafted at block position d;
    scores [B, N]: path log-probability (0 at the root)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])

    def ancestor_mask(self, max_depth: int | None = None) -> torch.Tensor:
        """[B, N, N] bool: mask[b, i, j] is True when node j is node i or one of its ancestors
        (the tree attention mask: a node attends to the committed cache and its own path).

        Vectorised (no per-node loop, no host sync with ``max_depth`` given): start from
        "self or parent" and square the relation ceil(log2(depth + 1)) times (bool matmuls).
        Kept on the tree after the first call: a step needs it for the verify forward and again
        for acceptance (any ``max_depth`` >= the tree's depth gives the same closure)."""
        cached = getattr(self, "_ancestors", None)
        if cached is not None:
            return cached
        b, n = self.parents.shape
        dev = self.parents.device
        eye = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n)
        # "j is i's parent" by comparison (one_hot would check its input on the host: no sync here)
        parent = self.parents[..., None] == torch.arange(n, device=dev)
        mask = eye | parent
        depth = max_depth if max_depth is not None else (int(self.depths.max()) if n else 0)
        reach = 1
        work = torch.float32 if dev.type == "cpu" else torch.float16  # exact: counts of paths <= N
        while reach < depth:
            m = mask.to(work)
            mask = torch.bmm(m, m) > 0
            reach *= 2
        self._ancestors = mask
        return mask

    def ancestor_words(self, max_depth: int | None = None) -> torch.Tensor:
        """[B, N, ceil(N / 32)] int32: :meth:`ancestor_mask` packed into bit words, the format the
        attention kernel reads (``specc.codegen.kernels.tree_mask``; compiled tree steps pack
        their mask input the same way once per step)."""
        return pack_tree_mask(self.ancestor_mask(max_depth))

    @classmethod
    def planned(cls, tokens, parents, depths, mask) -> "DraftTree":
        """The tree of a ``plan_tree`` result (no scores), keeping its ancestor ``mask``."""
        tree = cls(tokens, parents, depths, None)
        tree._ancestors = mask
        return tree

    def positions(self, base: torch.Tensor) -> torch.Tensor:
        """[B, N] sequence positions: ``base`` [B] (the root's position) + depth."""
        return base[:, None] + self.depths


def build_tree(logprobs: torch.Tensor, root_tokens: torch.Tensor, budget: int, topk: int | None = None) -> DraftTree:
    """Best-first draft tree of ``budget`` drafted nodes (plus the root) from per-position
    log-probabilities ``logprobs`` [B, D, V] (position d = the (d + 1)-th drafted token).

    ``topk``: candidate tokens per position (default: ``budget``, enough for any tree of that
    size). Returns a ``DraftTree`` of ``budget + 1`` nodes."""
    k = _candidates(logprobs, budget, topk)
    top_lp, top_tok = logprobs.float().topk(k, dim=-1)  # [B, D, k], sorted descending
    return tree_from_candidates(top_lp, top_tok, root_tokens, budget)


def _candidates(scores: torch.Tensor, budget: int, topk: int | None) -> int:
    """Candidate tokens per position for a tree of ``budget`` nodes over ``scores`` [B, D, V]."""
    if scores.dim() != 3:
        raise ValueError(f"logprobs must be [B, D, V], got {tuple(scores.shape)}")
    if budget < 1 or scores.shape[1] < 1:
        raise ValueError(f"need budget >= 1 and at least one drafted position (budget {budget}, "
                         f"depth {scores.shape[1]})")
    return min(topk or budget, scores.shape[2])


def top_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each row of ``logits`` [.., V] and their log-probabilities
    (fp32, descending): the top k of the logits as given, less the row's log-sum-exp. The ranks and
    values of ``logits.float().log_softmax(-1).topk(k)`` (up to fp32 rounding) without writing
    the [.., V] log-probabilities: on the GPU a top-k over bf16 logits takes half the radix
    passes of an fp32 one, and one row reduction replaces the softmax kernel, whose one block
    per row leaves the GPU idle at D = 15 rows (H200 run 7: softmax 35 us and fp32 top-k 62 us
    of a 31-node tree's 317 us plan, docs/benchmarks/h200-run7.md)."""
    top, tokens = logits.topk(k, dim=-1)
    return top.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True), tokens


def tree_from_candidates(top_lp: torch.Tensor, top_tok: torch.Tensor, root_tokens: torch.Tensor,
                         budget: int) -> DraftTree:
    """``build_tree`` from each position's candidates: ``top_lp`` [B, D, k] log-probabilities
    sorted descending and their tokens ``top_tok``."""
    bsz, depth, k = top_lp.shape
    dev = top_lp.device
    width = min(budget, k)
    if k >= budget:  # every depth's beam is `budget` wide: one kernel runs them all
        score, tok, parent = tree_beam(top_lp, top_tok, budget)  # [B, D, W] each
        # flat candidate index = depth-major concat; a parent index at depth d >= 1 shifts by (d - 1) * W
        shift = (torch.arange(depth, device=dev) - 1).clamp(min=0) * budget
        all_score, cand_tok = score.flatten(1), tok.flatten(1)
        cand_parent = (parent + shift[None, :, None]).flatten(1)  # depth 0: -1 stays -1
        cand_depth = torch.arange(1, depth + 1, device=dev).repeat_interleave(budget)[None].expand(bsz, -1)
    else:  # a vocabulary smaller than the budget: the beam widens with depth
        # depth 1: the beam is the top ranks of position 0
        beam_score = top_lp[:, 0, :width]  # [B, W1]
        beam_tok = top_tok[:, 0, :width]
        beam_parent = torch.full_like(beam_tok, -1)  # -1 = the root
        levels = [(beam_score, beam_tok, beam_parent)]
        for d in range(1, depth):
            cand = beam_score[:, :, None] + top_lp[:, d, None, :]  # [B, W, k]
            w = min(budget, cand.shape[1] * k)
            beam_score, flat = cand.flatten(1).topk(w, dim=-1)
            beam_tok = top_tok[:, d].gather(1, flat % k)
            levels.append((beam_score, beam_tok, flat // k))
        offsets, start = [], 0
        for lv in levels:
            offsets.append(start)
            start += lv[0].shape[1]
        all_score = torch.cat([lv[0] for lv in levels], dim=1)
        cand_depth = torch.cat([torch.full_like(lv[1], i + 1) for i, lv in enumerate(levels)], dim=1)
        cand_tok = torch.cat([lv[1] for lv in levels], dim=1)
        cand_parent = torch.cat([torch.where(lv[2] < 0, lv[2], lv[2] + (offsets[i - 1] if i else 0))
                                 for i, lv in enumerate(levels)], dim=1)  # parent as a candidate index
    # global top-`budget` over every depth; ties prefer shallower nodes (earlier in the concat)
    n_cand = all_score.shape[1]
    budget = min(budget, n_cand)
    order_key = all_score - torch.arange(n_cand, device=dev, dtype=all_score.dtype) * 1e-9
    _, chosen = order_key.topk(budget, dim=-1)
    chosen, _ = chosen.sort(dim=-1)  # concat order: depth-major, so parents precede children
    # map each candidate to its tree node index (1 + position in `chosen`), -1 when not chosen
    node_of = torch.full((bsz, n_cand), -1, dtype=torch.long, device=dev)
    node_of.scatter_(1, chosen, torch.arange(1, budget + 1, device=dev).expand(bsz, budget))
    parent_node = torch.where(cand_parent < 0, torch.zeros_like(cand_parent),
                              node_of.gather(1, cand_parent.clamp(min=0)))
    tokens = torch.cat([root_tokens.reshape(bsz, 1).to(torch.long), cand_tok.gather(1, chosen)], dim=1)
    parents = torch.cat([torch.full((bsz, 1), -1, dtype=torch.long, device=dev), parent_node.gather(1, chosen)], dim=1)
    depths = torch.cat([torch.zeros((bsz, 1), dtype=torch.long, device=dev), cand_depth.gather(1, chosen)], dim=1)
    scores = torch.cat([torch.zeros((bsz, 1), device=dev), all_score.gather(1, chosen)], dim=1)
    return DraftTree(tokens, parents, depths, scores)


def plan_tree(draft_logits: torch.Tensor, root_tokens: torch.Tensor, base: torch.Tensor, budget: int,
              topk: int | None = None):
    """A tree step's inputs from the drafter's per-position logits [B, D, V]: (tokens, parents,
    depths, positions, ancestor mask) of the ``build_tree`` tree over ``root_tokens`` [B] whose
    root sits at position ``base`` [B]. Tensors only and no host sync, so a CUDA graph can hold it."""
    k = _candidates(draft_logits, budget, topk)
    tree = tree_from_candidates(*top_logprobs(draft_logits, k), root_tokens, budget)
    depth = draft_logits.shape[1]
    return tree.tokens, tree.parents, tree.depths, tree.positions(base), tree.ancestor_mask(depth)


def accept_tree(tree: DraftTree, target_argmax: torch.Tensor,
                max_depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of the longest root path whose every token is the target's argmax at
    its parent. ``target_argmax`` [B, N]: the target's argmax after each node.

    Returns (accepted [B]: drafted tokens accepted, path [B, D + 1]: node indices of the accepted
    path from the root, -1 past its end). The committed tokens are the accepted path's drafted
    tokens then ``target_argmax`` at its last node (the bonus token). ``max_depth``: the
    drafted positions the tree was built from, when known (no host sync; else read from the
    tree)."""
    # a node is "matched" when its token is the target's choice after its parent
    matched = tree.tokens == target_argmax.gather(1, tree.parents.clamp(min=0))
    return accept_matched(tree, matched, max_depth)


def accept_matched(tree: DraftTree, matched: torch.Tensor,
                   max_depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The deepest root path of ``tree`` whose every drafted node is ``matched`` [B, N] (bool;
    the root's entry is ignored), as ``accept_tree`` returns it: (accepted [B], path [B, D + 1]).
    Greedy acceptance matches a node when its token is the target's argmax at its parent; an
    acceptance replay (``specc.runtime.tree_replay``) matches the nodes of the ranks it drew.
    At most one node per depth may be alive for the path to be unique (both matchings ensure it)."""
    bsz, n = tree.tokens.shape
    dev = tree.tokens.device
    matched = matched | (tree.depths == 0)  # the root is always on the path
    if max_depth is None:
        max_depth = int(tree.depths.max()) if n else 0
    # alive: matched and every ancestor matched, from the ancestor mask (no per-node loop)
    anc = tree.ancestor_mask(max_depth)  # [B, N, N]
    alive = ~(anc & ~matched[:, None, :]).any(-1)
    depth = torch.where(alive, tree.depths, torch.full_like(tree.depths, -1))
    best_depth, best_node = depth.max(dim=1)  # the deepest alive node (first one at a tie)
    # the path: the best node's ancestors, one per depth
    on_path = anc.gather(1, best_node[:, None, None].expand(-1, 1, n))[:, 0]  # [B, N]
    levels = torch.arange(max_depth + 1, device=dev)
    at = on_path[:, None, :] & (tree.depths[:, None, :] == levels[None, :, None])  # [B, D + 1, N]
    path = torch.where(at.any(-1), at.to(torch.int8).argmax(-1), torch.full((bsz, max_depth + 1), -1, device=dev))
    return best_depth, path.to(torch.long)
