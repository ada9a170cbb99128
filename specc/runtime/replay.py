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
target's own token at position ``a_b``.

The uniforms are counter-based (``specc.sampling.rng.uniform``): computed with integer tensor
ops on the device from a few words, with no generator state and no host sync, so a run is
reproducible. Which words, two modes:

- ``lengths`` given (a callable returning the rows' committed lengths [B], e.g.
  ``lambda: loop.state.lengths``): u_{b,i} is a function of the seed, the row b and the absolute
  position ``lengths[b] + i`` of the draft it tests, like counter-based sampling, so a verify is
  a function of its inputs. Each position is tested in one step only up to its first rejection
  and the next step tests the positions after the rejected one, so no draw that decided anything
  is used twice; one-level and two-level runs of the same requests replay the same acceptance.
- without: u_{b,i} is a function of the seed, a step counter (one per step), b and i.

Both modes are device work with no host sync and no host value baked into the launches (the
seed word and the step counter are long tensors on the device, updated in place: the counter
by ``draw``, both by :meth:`ReplayVerifier.reset`), so the device loop's greedy chain
step, graphed on CUDA (``device_loop._accept_chain``), replays fresh draws every step.
``record=True`` keeps a history of host-visible clones per call, which a graph cannot replay:
a capture of a recording verifier is refused (the loop then runs that function eagerly and
``graph_stats`` says why), so recording still works, ungraphed.

**Two-level verification** (the device loop's ``two_level_k1``): level 1 calls ``verify`` with the
first k1 drafts of every row (``start=0``: a new step); level 2 calls it for the rows that accepted
all k1, with their remaining drafts, ``start=k1`` and ``rows=`` their indices in the step's batch:
the same step, positions k1 + 1 .., each with its own alpha. A row that went on then accepts
exactly what one call with all k drafts would have drawn: level 1's decision is the prefix of the
full one, in both modes.

**The committed tokens are not the model's output**: accepted drafts are committed whether or
not the target agrees. Replay is for timing only; every report that uses it says so.

Draft trees replay a per-rank model instead (``specc.runtime.tree_replay.TreeReplayVerifier``):
per depth it draws which of the drafter's ranked candidates the target picks, walks the tree
along it, and shapes the tree by the model (``TREE_REPLAY_NOTICE``). With one rank per depth it
accepts what this verifier accepts for the same alphas.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

from specc.runtime.verifiers import Verifier
from specc.sampling.rng import ACCEPT, uniform

__all__ = ["ReplayVerifier", "InPlaceTensors", "REPLAY_NOTICE", "TREE_REPLAY_NOTICE"]

REPLAY_NOTICE = ("acceptance replayed from a stated model: accepted counts are drawn, not decided by the target; "
                 "the committed tokens are NOT the model's real output (timing only)")
TREE_REPLAY_NOTICE = ("per depth the rank the target picks is drawn from the per-rank model (ranks independent "
                      "across depths, as the model assumes) and the tree is the model's best tree over the drafter's "
                      "own top candidates; the draft, tree verify forward, KV compaction and drafter context are real")


def _refuse_in_capture(what: str) -> None:
    """Raise when called inside a CUDA graph capture: ``what`` needs host work that a replay
    would not repeat (``GraphedStep`` then runs the step eagerly and records the reason)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"ReplayVerifier cannot be captured in a CUDA graph with {what}")


class InPlaceTensors(dict):
    """A replay verifier's draw state on the device (step counters, seed words), one tensor per
    key (a device, or rows and a device), made by ``make(key)`` at its first lookup and from then
    on only updated in place: a captured CUDA graph keeps reading the tensors it captured, so a
    restart or a new seed must rewrite them, not replace them (:meth:`remake`). They are made
    outside inference mode: the loop draws under it, a benchmark resets outside it, and an
    inference tensor refuses an in-place update there."""

    def __init__(self, make: Callable[[Hashable], torch.Tensor]):
        super().__init__()
        self.make = make

    @classmethod
    def counters(cls) -> "InPlaceTensors":
        """Per-device step counters: [1] long, starting at 0 (key: the device's name)."""
        return cls(lambda device: torch.zeros(1, dtype=torch.long, device=device))

    def __missing__(self, key):
        with torch.inference_mode(False):
            tensor = self[key] = self.make(key)
        return tensor

    def most_steps(self) -> int:
        """Of step counters (:meth:`counters`): the largest count over the devices, 0 before any
        draw (reads the device tensors: a sync)."""
        return max((int(c) for c in self.values()), default=0)

    def remake(self) -> None:
        """Rewrite every tensor in place with what ``make`` gives now (after a restart or re-seed)."""
        for key, tensor in self.items():
            tensor.copy_(self.make(key))


class ReplayVerifier(Verifier):
    """``alphas``: per-position conditional acceptance probabilities (alpha_1, alpha_2, ...);
    ``seed``: the draws' seed (:meth:`reset` starts the steps over); ``lengths``: the rows'
    committed lengths (see the module docstring; needed for two-level verification). ``history``
    keeps every row's accepted count per call as device tensors when ``record`` is set."""

    name = "replay"

    def __init__(self, alphas: Sequence[float], seed: int = 0, source: str = "", record: bool = False,
                 lengths: Callable[[], torch.Tensor] | None = None):
        alphas = [float(a) for a in alphas]
        if any(not 0.0 <= a <= 1.0 for a in alphas):
            raise ValueError("acceptance probabilities must lie in [0, 1]")
        self.alphas, self.seed, self.source, self.record = alphas, int(seed), source, record
        self.lengths = lengths
        self._counters = InPlaceTensors.counters()  # per device: steps begun so far (the draws' counter)
        self._seed_words = InPlaceTensors(  # per device: [1] long, the seed's word of the draws
            lambda device: torch.full((1,), self._word(), dtype=torch.long, device=device))
        self._alpha_cache: dict = {}
        self.history: list[torch.Tensor] = []

    @property
    def step(self) -> int:
        """Steps begun so far (verify calls with ``start`` 0); reads the device counter (a sync)."""
        return self._counters.most_steps()

    def reset(self, seed: int | None = None) -> None:
        """Restart the draws (same sequence again unless a new ``seed`` is given), in place so
        that captured graphs draw the restarted sequence."""
        if seed is not None:
            self.seed = int(seed)
        self._counters.remake()
        self._seed_words.remake()
        self.history.clear()

    def _word(self) -> int:
        return (self.seed & 0x7FFFFFFF) << 32

    def _device_words(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(step counter, seed word) on ``device``, made at its first draw there."""
        key = str(device)
        if key not in self._counters:
            _refuse_in_capture("its step counter on a new device")
        return self._counters[key], self._seed_words[key]

    def _alpha(self, k: int, device) -> torch.Tensor:
        key = (k, str(device))
        t = self._alpha_cache.get(key)
        if t is None:
            _refuse_in_capture(f"the acceptance probabilities of {k} drafts")  # a host -> device copy
            last = self.alphas[-1] if self.alphas else 0.0
            vals = [self.alphas[i] if i < len(self.alphas) else last for i in range(k)]
            t = torch.tensor(vals, dtype=torch.float32, device=device)
            self._alpha_cache[key] = t
        return t

    def _uniforms(self, rows: int, k: int, device: torch.device, start: int, ids: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(start + 1, start + k + 1, device=device, dtype=torch.long)[None]
        counter, word = self._device_words(device)
        if self.lengths is not None:
            lengths = self.lengths().to(device=device, dtype=torch.long)
            if lengths.dim() != 1 or (start == 0 and lengths.shape[0] != rows):
                raise ValueError(f"ReplayVerifier: {rows} rows but lengths of shape {tuple(lengths.shape)}")
            return uniform(word | ids, lengths[ids][:, None] + offsets, ACCEPT)  # (seed, row), position
        seeds = (word | (counter & 0xFFFFFFFF)).expand(rows)
        return uniform(seeds, (ids[:, None] << 12) + offsets, ACCEPT)  # (seed, step), (row, draft)

    def draw(self, rows: int, k: int, device, max_drafts: torch.Tensor | None = None, *, start: int = 0,
             row_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Accepted drafts per row [rows] (long, on ``device``) among drafted positions
        start + 1 .. start + k: ``start`` 0 begins a step, > 0 continues the current one (level 2
        of a two-level step); ``row_ids`` [rows]: the rows' indices in the step's batch (default
        0 .. rows - 1)."""
        device = torch.device(device)
        alpha = self._alpha(start + k, device)[start:] if k else None  # before the counter moves: may refuse a capture
        if start == 0:
            self._device_words(device)[0].add_(1)  # in place: a graph replay advances it too
        if k == 0:
            return torch.zeros(rows, dtype=torch.long, device=device)
        ids = torch.arange(rows, device=device) if row_ids is None else row_ids.to(device=device, dtype=torch.long)
        u = self._uniforms(rows, k, device, int(start), ids)
        ok = (u < alpha).to(torch.long)
        accepted = ok.cumprod(dim=1).sum(dim=1)
        if max_drafts is not None:
            accepted = torch.minimum(accepted, max_drafts.to(accepted.device))
        return accepted

    def verify(self, drafts, target_logits, max_drafts=None, *, start: int = 0, rows: torch.Tensor | None = None):
        return self.verify_tokens(drafts, target_logits.argmax(-1), max_drafts, start=start, rows=rows)

    def verify_tokens(self, drafts, target_tokens, max_drafts=None, *, start: int = 0,
                      rows: torch.Tensor | None = None):
        """``start`` / ``rows``: level 2 of a two-level step (the module docstring)."""
        if self.record:
            _refuse_in_capture("a recorded history (record=True)")
        n, k = drafts.shape
        accepted = self.draw(n, k, drafts.device, max_drafts, start=start, row_ids=rows)
        committed = target_tokens.clone()
        if k:
            take = torch.arange(k, device=drafts.device)[None] < accepted[:, None]
            committed[:, :k] = torch.where(take, drafts, target_tokens[:, :k])
            # the target's token lands right after the accepted prefix
            committed.scatter_(1, accepted[:, None], target_tokens.gather(1, accepted[:, None]))
        if self.record:
            self.history.append(accepted.clone())
        return accepted, committed
