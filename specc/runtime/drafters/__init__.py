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
them; the drafter then feeds every row the same number m of trailing committed tokens (DFlash:
m trailing target hidden states, from a window of each row's newest ones), re-feeding (and
rewriting with the same values) some already-cached ones for rows that are behind by less than
m. A row that cannot join that one forward drafts *alone* in its slot (``slot_view``: a batch-1
forward on views of its cache rows): a row too short to re-feed m tokens. A request that joins
a batch has its prompt read into its slot's cache at its prefill (DFlash: the prompt's hidden
states, in ``reset_slot``; the causal drafters: its tokens, ``feed_prompt``), so its first draft
joins the batched forward instead of reading the whole prompt alone. Rows the
loop marks inactive (finished, free slots) ride along in the batched forward with inputs whose
cache writes land past anything they keep. Batch 1 takes the same slicing path as before (no
extra device ops).

Where things are:

- ``base``: ``Drafter``, the interface the loops call, with its defaults.
- ``causal``: ``CausalDrafter``, what ``ARDraft`` and ``PardDraft`` share (a causal LM step).
- ``ar``, ``pard``, ``dflash``: one strategy each.
- ``rows``: the row helpers the strategies share (positions and cache lengths, token windows,
  a step's call in the batch or alone in its slot, which rows draft alone).
- here: :data:`DRAFTERS`, ``drafts_ahead`` and ``drafter_from_manifest``.
"""

from __future__ import annotations

from specc.runtime.drafters.ar import ARDraft
from specc.runtime.drafters.base import Drafter
from specc.runtime.drafters.causal import CausalDrafter
from specc.runtime.drafters.dflash import DFlashDraft
from specc.runtime.drafters.pard import PardDraft

__all__ = ["ARDraft", "CausalDrafter", "DFlashDraft", "DRAFTERS", "Drafter", "PardDraft", "drafter_from_manifest",
           "drafts_ahead"]

DRAFTERS: dict[str, type[Drafter]] = {cls.name: cls for cls in (ARDraft, PardDraft, DFlashDraft)}


def drafts_ahead(strategy: str | None) -> bool:
    """Whether the drafting strategy ``strategy`` (a :data:`DRAFTERS` key) drafts ahead at batch
    > 1 (overrides ``Drafter.draft_ahead_rows``): what the cost model asks before pricing a
    batched one-level step's host work as hidden behind the next draft."""
    cls = DRAFTERS.get(strategy or "")
    return cls is not None and cls.draft_ahead_rows is not Drafter.draft_ahead_rows


def drafter_from_manifest(name: str, step, section: dict | None = None) -> Drafter | None:
    """The registered drafting strategy ``name`` over ``step``, or None for plain AR (no
    drafter registered under that name)."""
    cls = DRAFTERS.get(name)
    return None if cls is None or step is None else cls.from_manifest(step, section)
