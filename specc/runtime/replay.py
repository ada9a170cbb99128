"""Acceptance replay: a verifier that forces each step's accepted count from a stated acceptance model.

At real model sizes specc benchmarks random weights in real shapes (real checkpoints cannot be
downloaded here). Random drafters agree with random targets almost never, so greedy acceptance
would time a system that commits one token per step. :class:`ReplayVerifier` keeps every cost
real (the drafter drafts, the target verifies the whole block, the state commits, the drafter
is told what was accepted) and replaces only the *decision*: row b accepts

    a_b = #leading positions i (1..k) with u_{b,i} < alpha_i,   u ~ U(0, 1) i.i.d.

drafts (capped by ``max_drafts``), with ``alpha_i`` the per-position conditional acceptance
probabilities of the acceptance model (``specc.search.acceptance.AcceptanceModel.alphas``,
positions past the list reuse the last one). It commits ``drafts[b, :a_b]`` followed by the
target's own token at position ``a_b``. The draws come from a seeded ``torch.Generator`` on the
device, so a run is reproducible and there is no host sync.

**The committed tokens are not the model's output**: accepted drafts are committed whether or
not the target agrees. Replay is for timing only; every report that uses it says so.

Draft trees replay a per-rank model instead (``specc.runtime.tree_replay.TreeReplayVerifier``):
per depth it draws which of the drafter's ranked candidates the target picks, walks the tree
along it, and shapes the tree by the model (``TREE_REPLAY_NOTICE``). With one rank per depth it
accepts what this verifier accepts for the same alphas.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specc.runtime.verifiers import Verifier

__all__ = ["ReplayVerifier", "REPLAY_NOTICE", "TREE_REPLAY_NOTICE"]

REPLAY_NOTICE = ("acceptance replayed from a stated model: accepted counts are drawn, not decided by the target; "
                 "the committed tokens are NOT the model's real output (timing only)")
TREE_REPLAY_NOTICE = ("per depth the rank the target picks is drawn from the per-rank model (ranks independent "
                      "across depths, as the model assumes) and the tree is the model's best tree over the drafter's "
                      "own top candidates; the draft, tree verify forward, KV compaction and drafter context are real")


class ReplayVerifier(Verifier):
    """``alphas``: per-position conditional acceptance probabilities (alpha_1, alpha_2, ...);
    ``seed``: the generator's seed (re-seeded by :meth:`reset`). ``history`` keeps every row's
    accepted count per step as device tensors when ``record`` is set (for histograms)."""

    name = "replay"

    def __init__(self, alphas: Sequence[float], seed: int = 0, source: str = "", record: bool = False):
        alphas = [float(a) for a in alphas]
        if any(not 0.0 <= a <= 1.0 for a in alphas):
            raise ValueError("acceptance probabilities must lie in [0, 1]")
        self.alphas, self.seed, self.source, self.record = alphas, int(seed), source, record
        self._gen: dict = {}
        self._alpha_cache: dict = {}
        self.history: list[torch.Tensor] = []

    def reset(self, seed: int | None = None) -> None:
        """Restart the draws (same sequence again unless a new ``seed`` is given)."""
        if seed is not None:
            self.seed = int(seed)
        self._gen.clear()
        self.history.clear()

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        gen = self._gen.get(key)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(self.seed)
            self._gen[key] = gen
        return gen

    def _alpha(self, k: int, device) -> torch.Tensor:
        key = (k, str(device))
        t = self._alpha_cache.get(key)
        if t is None:
            last = self.alphas[-1] if self.alphas else 0.0
            vals = [self.alphas[i] if i < len(self.alphas) else last for i in range(k)]
            t = torch.tensor(vals, dtype=torch.float32, device=device)
            self._alpha_cache[key] = t
        return t

    def draw(self, rows: int, k: int, device, max_drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Accepted drafts per row [rows] (long, on ``device``)."""
        if k == 0:
            return torch.zeros(rows, dtype=torch.long, device=device)
        u = torch.rand(rows, k, generator=self._generator(torch.device(device)), device=device)
        ok = (u < self._alpha(k, device)).to(torch.long)
        accepted = ok.cumprod(dim=1).sum(dim=1)
        if max_drafts is not None:
            accepted = torch.minimum(accepted, max_drafts.to(accepted.device))
        return accepted

    def verify(self, drafts, target_logits, max_drafts=None):
        return self.verify_tokens(drafts, target_logits.argmax(-1), max_drafts)

    def verify_tokens(self, drafts, target_tokens, max_drafts=None):
        rows, k = drafts.shape
        accepted = self.draw(rows, k, drafts.device, max_drafts)
        committed = target_tokens.clone()
        if k:
            take = torch.arange(k, device=drafts.device)[None] < accepted[:, None]
            committed[:, :k] = torch.where(take, drafts, target_tokens[:, :k])
            # the target's token lands right after the accepted prefix
            committed.scatter_(1, accepted[:, None], target_tokens.gather(1, accepted[:, None]))
        if self.record:
            self.history.append(accepted.clone())
        return accepted, committed
