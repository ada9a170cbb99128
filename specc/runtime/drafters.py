"""Drafting strategies over step functions (model definitions or compiled steps).

A drafter sees the committed sequences of a batch of rows and proposes k tokens per row; after
verification it is told how many of each row's drafts were accepted so it can keep exactly the
valid part of its KV cache (caches are static: "truncation" is setting a length). Per-row
lengths are host lists mirrored from the loop's one host copy per step (they pick shapes); the
tokens stay on the device. Strategies, registered in :data:`DRAFTERS` by their ``name`` (the
speculation method's drafting strategy) and built from an artifact's manifest with
``from_manifest(step, section)``:

- ``ARDraft``: a small same-vocab causal LM, k sequential forwards (chain speculation).
- ``PardDraft``: committed tokens + (k - 1) ``pard_token`` slots, one causal forward.
- ``DFlashDraft``: target hidden states of newly committed tokens as context, one non-causal
  forward over [last token, mask x (b - 1)].

Rows of a batch may have committed different numbers of tokens since the drafter last saw
them; a causal drafter then feeds every row the same number m of trailing committed tokens,
re-feeding (and rewriting with the same values) some already-cached ones for rows that are
behind by less than m. Batch 1 takes the same slicing path as before (no extra device ops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specc.models.dflash import DFlashDrafter

if TYPE_CHECKING:  # pragma: no cover - annotations only: the runtime runs generated steps
    from specc.models.decoder import CausalLM


def _positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)[None]


def _length(start: int, device) -> torch.Tensor:
    return torch.full((1,), start, dtype=torch.long, device=device)


def _rows(starts: list[int], n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, n] (row b: starts[b] ..) and cache_len [B] (= starts) for a batch."""
    if len(starts) == 1:
        return _positions(starts[0], n, device), _length(starts[0], device)
    if len(set(starts)) == 1:
        return (_positions(starts[0], n, device).expand(len(starts), n).contiguous(),
                torch.full((len(starts),), starts[0], dtype=torch.long, device=device))
    cache_len = torch.tensor(starts, dtype=torch.long, device=device)
    return cache_len[:, None] + torch.arange(n, device=device)[None], cache_len


def _window(seq: torch.Tensor, starts: list[int], m: int) -> torch.Tensor:
    """Row b's tokens seq[b, starts[b] : starts[b] + m] -> [B, m]."""
    if len(set(starts)) == 1:
        return seq[:, starts[0]:starts[0] + m]
    if min(starts) < 0:
        raise NotImplementedError("rows too far apart to re-feed (prompts of unequal length or shorter than k)")
    index = torch.tensor(starts, dtype=torch.long, device=seq.device)[:, None] + torch.arange(m, device=seq.device)
    return seq.gather(1, index)


def _run(step, first: bool, *args):
    """Call a drafter step; its first call after ``reset`` (over the whole prompt, a shape that
    occurs once) bypasses CUDA-graph capture when the step is graphed (``GraphedStep.eager``)."""
    fn = getattr(step, "eager", None) if first else None
    return (fn or step)(*args)


class Drafter:
    """A drafting strategy. ``name``: its key in :data:`DRAFTERS` (``method`` is the old name of
    the same attribute). The batch interface (used by the device loop) is ``propose_rows`` /
    ``accepted_rows`` over per-row committed lengths; ``propose`` / ``accepted`` are the
    batch-1 host-list forms the eager reference loop uses."""

    name = "none"
    needs_target_hidden = False
    # whether ``propose_logits_rows`` gives a distribution at every drafted position from one
    # forward (parallel drafters): what a draft tree is built from (``specc.runtime.trees``)
    supports_tree = False
    forwards = 0

    @property
    def method(self) -> str:
        return self.name

    @classmethod
    def from_manifest(cls, step, section: dict | None) -> "Drafter":
        """Build from the drafter's step and the artifact manifest's ``drafter`` section."""
        return cls(step)

    def setup(self, max_len: int, batch: int = 1) -> None:
        """Allocate caches for ``batch`` rows of up to ``max_len`` tokens."""

    def reset(self, prompt, context: torch.Tensor | None) -> None:
        """Start new sequences. ``prompt``: a token list (one row) or per-row prompt lengths
        (``list[int]`` via :meth:`reset_rows`); ``context``: the target's captured hidden states
        of the prompts."""
        self.reset_rows([len(prompt)], context)

    def reset_rows(self, prompt_lens: list[int], context: torch.Tensor | None) -> None:
        self.lengths = [0] * len(prompt_lens)

    def propose_rows(self, seq: torch.Tensor, n: list[int], k: int) -> torch.Tensor:
        """Draft k tokens per row, [B, k] on the device, without a host sync. ``seq`` [B, L]
        holds the committed tokens; row b has ``n[b]`` (the last, ``seq[b, n[b] - 1]``, not
        yet seen by the target)."""
        raise NotImplementedError

    def propose_logits_rows(self, seq: torch.Tensor, n: list[int], k: int) -> torch.Tensor:
        """The drafter's logits at each of the k drafted positions, [B, k, V] on the device, from
        the same single forward ``propose_rows`` runs (its drafts are their argmax). Parallel
        drafters only (``supports_tree``): a tree step builds its draft tree from them."""
        raise NotImplementedError(f"the {self.name} drafter gives no per-position distributions (chains only)")

    def propose_sampled_rows(self, seq: torch.Tensor, n: list[int], k: int, pick):
        """Speculative sampling's drafts: ``pick(logits [B, V], j) -> (token [B], q [B, V])``
        draws the j-th draft from the drafter's logits there (``specc.runtime.policy``). Returns
        (drafts [B, k], q [B, k, V]). A parallel drafter picks each position from its one
        forward's logits (their marginals; each draft is drawn from exactly the q it reports)."""
        logits = self.propose_logits_rows(seq, n, k)
        picked = [pick(logits[:, j], j) for j in range(k)]
        return torch.stack([t for t, _ in picked], 1), torch.stack([q for _, q in picked], 1)

    def accepted_rows(self, n: list[int], accepted: list[int], k: int, context: torch.Tensor | None) -> None:
        """Verification of a step that began with ``n[b]`` committed tokens per row accepted
        ``accepted[b]`` of ``k`` drafts; ``context`` holds the target's captured hidden states
        of the step's inputs (DFlash)."""

    def propose_tokens(self, seq: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Batch-1 form of ``propose_rows``."""
        return self.propose_rows(seq, [n], k)

    def propose(self, seq: list[int], k: int) -> list[int]:
        """Host-list convenience (the eager reference loop uses it)."""
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        return self.propose_rows(ids, [len(seq)], k)[0].tolist()

    def propose_logits(self, seq: list[int], k: int) -> torch.Tensor:
        """Host-list form of ``propose_logits_rows``: [1, k, V] (the eager reference loop)."""
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        return self.propose_logits_rows(ids, [len(seq)], k)

    def accepted(self, seq_len: int, num_accepted: int, k: int, context: torch.Tensor | None) -> None:
        """Batch-1 form of ``accepted_rows``."""
        self.accepted_rows([seq_len], [num_accepted], k, context)

    def capture_shapes(self, seq: torch.Tensor, k: int) -> None:
        """Call the drafter step once with every input shape a generation with ``k`` drafts can
        produce, so that CUDA graphs (``GraphedStep``) are captured before timing starts rather
        than whenever an acceptance length first occurs. Runs right after ``reset``: what it
        writes into the KV cache lies in slots every real call rewrites before reading."""


class CausalDrafter(Drafter):
    """A drafter that is a causal LM step (specc CausalLM or its compiled step). ``lengths[b]``
    is how many committed tokens of row b its KV cache holds."""

    def __init__(self, model: CausalLM):
        self.model = model  # a CausalLM or a compiled step with the same call signature
        self.lengths = [0]

    @property
    def length(self) -> int:  # batch-1 view
        return self.lengths[0]

    def setup(self, max_len: int, batch: int = 1) -> None:
        self.model.setup_caches(batch, max_len)

    @property
    def device(self):
        return self.model.device

    def capture_shapes(self, seq, k):
        dev = self.model.device
        extra = self.mask_slots(k)
        rows = seq.shape[0]
        for fed in range(1, k + 2):  # newly committed tokens: 1 .. k + 1
            feed = seq[:, :1].expand(rows, fed + extra).contiguous()
            self.model(feed, *_rows([0] * rows, feed.shape[1], dev))

    def mask_slots(self, k: int) -> int:
        """Mask tokens appended after the newly committed ones in one drafting forward."""
        return 0

    def _fed(self, n: list[int]) -> tuple[list[int], int]:
        """(per-row start, m): feed every row its last m committed tokens."""
        m = max(nb - lb for nb, lb in zip(n, self.lengths))
        return [nb - m for nb in n], m


class ARDraft(CausalDrafter):
    name = "ar-draft"

    def propose_rows(self, seq, n, k):
        return self._propose(seq, n, k, lambda logits, j: (logits.argmax(-1), None))[0]

    def propose_sampled_rows(self, seq, n, k, pick):
        """Each draft drawn from the drafter's distribution after the drafts before it."""
        drafts, qs = self._propose(seq, n, k, pick)
        return drafts, torch.stack(qs, 1)

    def _propose(self, seq, n, k, pick):
        dev = self.model.device
        drafts, qs = [], []
        starts, m = self._fed(n)
        feed = _window(seq, starts, m)
        for j in range(k):
            self.forwards += 1
            first = all(s == 0 for s in starts)
            logits = _run(self.model, first, feed, *_rows(starts, feed.shape[1], dev))
            token, q = pick(logits[:, -1], j)
            drafts.append(token[:, None])  # fed back without leaving the GPU
            qs.append(q)
            starts = [s + feed.shape[1] for s in starts]
            feed = drafts[-1]
        return torch.cat(drafts, dim=1), qs

    def accepted_rows(self, n, accepted, k, context) -> None:
        if k:
            self.lengths = [nb + min(a, k - 1) for nb, a in zip(n, accepted)]


class PardDraft(CausalDrafter):
    name = "pard"

    def __init__(self, model: CausalLM, pard_token: int):
        super().__init__(model)
        self.pard_token = int(pard_token)

    @classmethod
    def from_manifest(cls, step, section):
        if not section or section.get("pard_token") is None:
            raise ValueError("a PARD drafter needs pard_token (manifest drafter section)")
        return cls(step, section["pard_token"])

    def mask_slots(self, k: int) -> int:
        return k - 1

    supports_tree = True

    def propose_logits_rows(self, seq, n, k):
        dev = self.model.device
        starts, m = self._fed(n)
        masks = torch.full((seq.shape[0], self.mask_slots(k)), self.pard_token, dtype=torch.long, device=dev)
        feed = torch.cat([_window(seq, starts, m), masks], dim=1)
        self.forwards += 1
        logits = _run(self.model, all(lb == 0 for lb in self.lengths), feed, *_rows(starts, feed.shape[1], dev))
        self.lengths = list(n)  # committed tokens stay, the mask slots are dropped
        return logits[:, -k:]  # the last committed token's and the mask positions' predictions

    def propose_rows(self, seq, n, k):
        return self.propose_logits_rows(seq, n, k).argmax(-1)


class DFlashDraft(Drafter):
    """Rows of a batch must carry the same number of context rows (equal acceptance so far);
    ragged DFlash contexts come with the batching issue."""

    name = "dflash"
    needs_target_hidden = True
    supports_tree = True

    def __init__(self, drafter: DFlashDrafter):
        """``drafter``: a DFlashDrafter or a compiled draft step exposing ``spec``/``device``."""
        self.drafter = drafter
        self.spec = drafter.spec
        self.lengths = [0]
        self.context: torch.Tensor | None = None
        self.context_lens = [0]

    @property
    def length(self) -> int:
        return self.lengths[0]

    def setup(self, max_len: int, batch: int = 1) -> None:
        self.drafter.setup_caches(batch, max_len)

    def reset_rows(self, prompt_lens, context) -> None:
        self.lengths, self.context = [0] * len(prompt_lens), context
        self.context_lens = list(prompt_lens)

    @property
    def device(self):
        return self.drafter.device

    def propose_rows(self, seq, n, k):
        return self.propose_logits_rows(seq, n, k).argmax(-1)

    def propose_logits_rows(self, seq, n, k):
        dev = self.drafter.device
        if len(set(self.context_lens)) > 1:
            raise NotImplementedError("DFlash rows with different context lengths (ragged acceptance) in one batch")
        c = self.context_lens[0]
        starts = [nb - 1 for nb in n]  # the block starts at the last committed token
        if any(lb + c != s for lb, s in zip(self.lengths, starts)):
            raise RuntimeError("DFlash drafter context out of step with the target")
        masks = torch.full((seq.shape[0], k), self.spec.mask_token_id, dtype=torch.long, device=dev)
        block = torch.cat([_window(seq, starts, 1), masks], dim=1)
        context = self.context if self.context.shape[1] == c else self.context[:, :c]
        self.forwards += 1
        first = all(lb == 0 for lb in self.lengths)
        logits = _run(self.drafter, first, block, context, *_rows(self.lengths, c + block.shape[1], dev))
        self.lengths = starts  # context K/V committed, block K/V dropped
        return logits

    def capture_shapes(self, seq, k):
        dev = self.drafter.device
        rows = seq.shape[0]
        block = torch.full((rows, k + 1), self.spec.mask_token_id, dtype=torch.long, device=dev)
        for n_ctx in range(1, k + 2):  # context rows after a step: accepted + 1 = 1 .. k + 1
            context = self.context[:, :1].expand(rows, n_ctx, -1).contiguous()
            self.drafter(block, context, *_rows([0] * rows, n_ctx + k + 1, dev))

    def accepted_rows(self, n, accepted, k, context) -> None:
        """``context``: the target's hidden states of the committed inputs of the step, in order
        (a chain: the block's prefix; a tree: gathered along the accepted path)."""
        if context is not None:
            self.context_lens = [a + 1 for a in accepted]
            self.context = context[:, : max(self.context_lens)]


DRAFTERS: dict[str, type[Drafter]] = {cls.name: cls for cls in (ARDraft, PardDraft, DFlashDraft)}


def drafter_from_manifest(name: str, step, section: dict | None = None) -> Drafter | None:
    """The registered drafting strategy ``name`` over ``step``, or None for plain AR (no
    drafter registered under that name)."""
    cls = DRAFTERS.get(name)
    return None if cls is None or step is None else cls.from_manifest(step, section)
