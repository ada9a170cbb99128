"""What a speculation method is: the one place that knows how a target and a drafter work together.

A ``Method`` owns every decision that used to be an ``if method == ...`` scattered through the
code base: which drafter checkpoints it accepts (pairing checks), how the pair is loaded (with
weights, or weightless on the meta device for the cost model), how many drafts per step it
proposes by default and which counts the search may try, which runtime drafting strategy runs it,
which drafter step shapes the cost model prices, what the artifact manifest records about the
drafter, and which stock (HF transformers) loop is its reference.

Methods are registered by name (``specc.methods.registry``); a user method is a subclass
registered with ``@register_method`` or through the ``specc.methods`` entry-point group.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from specc.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from specc.result import GenerationResult
    from specc.runtime.drafters import Drafter


@dataclasses.dataclass
class LoadedPair:
    """specc.models definitions of a pair, ready to trace or run.

    ``target``: the target CausalLM (``capture_layers`` set when the drafter reads hidden states);
    ``draft``: the drafter's step module (None for plain AR); ``draft_spec``: extra drafter facts
    the runtime needs (the DFlash block spec), else None."""

    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    draft_spec: Any = None

    @property
    def draft_cache_extra(self) -> int:
        """Cache slots the drafter needs past the committed tokens (a DFlash block)."""
        return int(getattr(self.draft_spec, "block_size", 0) or 0)


@dataclasses.dataclass(frozen=True)
class DraftShape:
    """One drafter forward the cost model prices: symbol values besides B and C (``Q`` rows,
    ``N`` context rows for DFlash) and how many such forwards a step makes."""

    values: dict[str, int]
    count: int = 1


class Method:
    """Base class of speculation methods. Subclasses set the class attributes and override the
    hooks they need; the defaults describe a method with no drafter (plain AR).

    In the hooks, ``pair`` is a resolved ``specc.pairing.Pair`` and ``target`` / ``drafter`` are
    ``specc.pairing.Checkpoint``s (not imported here: pairing asks the methods, not the reverse)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: checkpoint kinds (``specc.models.registry.classify``) this method can use as its drafter
    drafter_kinds: ClassVar[tuple[str, ...]] = ()
    #: checkpoint kinds for which this method is the default when no --method is given
    default_for: ClassVar[tuple[str, ...]] = ()
    #: drafts per step the search may try (filtered by ``max_num_draft``)
    k_choices: ClassVar[tuple[int, ...]] = ()
    #: name of the runtime drafting strategy (``specc.runtime.drafters.DRAFTERS``)
    strategy: ClassVar[str | None] = None
    #: whether one drafter forward gives a distribution at every drafted position
    #: (``draft_logits``; the runtime's ``Drafter.propose_logits_rows``): tree verification
    supports_tree: ClassVar[bool] = False

    @property
    def uses_drafter(self) -> bool:
        return bool(self.drafter_kinds)

    # ------------------------------------------------------------------ pairing

    def check_pair(self, target, drafter) -> None:
        """Raise ``UserError`` (one line) when ``drafter`` cannot serve ``target`` this way."""
        if not self.uses_drafter:
            if drafter is not None:
                raise UserError(f"--method {self.name} runs the target alone; drop --drafter or choose another method")
            return
        if drafter is None:
            raise UserError(f"--method {self.name} needs a --drafter")
        if drafter.kind not in self.drafter_kinds:
            raise UserError(f"--method {self.name} does not fit {drafter.name} (a {drafter.kind} checkpoint)")
        tv, dv = target.raw.get("vocab_size"), drafter.raw.get("vocab_size")
        if tv != dv:
            raise UserError(f"vocabulary mismatch: target {target.name} has {tv} tokens, drafter {drafter.name} has {dv}")

    # ------------------------------------------------------------------ drafts per step

    def default_num_draft(self, drafter_raw: dict | None) -> int:
        """Drafts per step when the user and the cost model say nothing."""
        return 0

    def max_num_draft(self, drafter_raw: dict | None) -> int | None:
        """The largest drafts per step the drafter can produce (None: no limit)."""
        return None

    def limit_reason(self, drafter_raw: dict | None) -> str:
        """Why ``max_num_draft`` is what it is, for error messages ("" when unlimited)."""
        return ""

    def num_draft(self, requested: int | None, drafter_raw: dict | None) -> int:
        """Resolve a requested drafts-per-step (None: the default); refuse what cannot run."""
        if not self.uses_drafter:
            return 0
        k = self.default_num_draft(drafter_raw) if not requested else int(requested)
        limit = self.max_num_draft(drafter_raw)
        if k < 1 or (limit is not None and k > limit):
            bound = f"1..{limit}" if limit is not None else ">= 1"
            why = self.limit_reason(drafter_raw)
            raise UserError(f"--num-draft {k} does not fit method {self.name} (allowed: {bound}"
                            + (f"; {why}" if why else "") + ")")
        return k

    def search_k_choices(self, drafter_raw: dict | None, start: int) -> list[int]:
        """Drafts-per-step values the search tries around ``start``."""
        if not self.uses_drafter:
            return []
        limit = self.max_num_draft(drafter_raw)
        ks = sorted({k for k in (*self.k_choices, start) if k >= 1 and (limit is None or k <= limit)})
        return ks or [start]

    # ------------------------------------------------------------------ loading

    def bind(self, target: torch.nn.Module, draft: torch.nn.Module | None) -> LoadedPair:
        """Wire a loaded target and drafter definition together (shared by real and meta loading)."""
        return LoadedPair(target, draft if self.uses_drafter else None)

    def load(self, pair, dtype: torch.dtype = torch.float32, device: Any = "cpu") -> LoadedPair:
        """The pair's specc.models definitions with their weights."""
        from specc.models.registry import load_model

        target = load_model(pair.target.path, dtype, device, with_tokenizer=False).model
        draft = None
        if self.uses_drafter:
            draft = load_model(pair.drafter.path, dtype, device, with_tokenizer=False).model
        return self.bind(target, draft)

    def load_meta(self, target_config: Any, drafter_config: Any = None, dtype: Any = None) -> LoadedPair:
        """The pair built from config.json alone on the meta device (real shapes, no weights)."""
        from specc.ir.trace import meta_model

        target = meta_model(target_config, dtype=dtype).model
        draft = None
        if self.uses_drafter and drafter_config is not None:
            draft = meta_model(drafter_config, dtype=dtype).model
        return self.bind(target, draft)

    # ------------------------------------------------------------------ runtime

    def drafter_for(self, draft_step, pair) -> "Drafter | None":
        """The runtime drafting strategy over a draft step: the specc.models definition
        (``LoadedPair.draft``) or its compiled step (same call signature)."""
        return None

    def draft_inputs(self, values: dict[str, int], batch: int, context: int, pair, device: Any,
                     dtype: torch.dtype) -> tuple:
        """Random inputs of one drafter forward of shape ``values`` (a ``DraftShape``'s) at
        ``context`` committed tokens, for timing it. Default: a causal drafter step."""
        q = int(values.get("Q", 1))
        vocab = int(pair.target.raw["vocab_size"])
        ids = torch.randint(0, vocab, (batch, q), device=device)
        pos = torch.arange(context, context + q, device=device)[None].expand(batch, -1).contiguous()
        return ids, pos, torch.full((batch,), context, dtype=torch.long, device=device)

    def manifest_drafter(self, pair, loaded: LoadedPair) -> dict[str, Any]:
        """Method-specific facts the artifact records about the drafter (read back by the runtime)."""
        return {}

    def draft_logits(self, loaded: LoadedPair, pair, seq: torch.Tensor, hidden: torch.Tensor | None,
                     num_draft: int) -> torch.Tensor | None:
        """The drafter's logits [num_draft, V] for the drafts after the committed ``seq`` [1, n]
        (its last token not yet seen by the target), computed from scratch (no cache reuse).
        ``hidden``: the target's captured hidden states of ``seq[:, :-1]`` when the drafter reads
        them. None when the method has no per-position draft distribution (trees need one)."""
        return None

    # ------------------------------------------------------------------ cost model

    def draft_shapes(self, num_draft: int, committed: int) -> list[DraftShape]:
        """Drafter forwards per step the cost model prices, given ``committed`` tokens per step."""
        return []

    # ------------------------------------------------------------------ stock reference

    def load_stock_drafter(self, pair, dtype: torch.dtype, device: Any):
        """The drafter as its published inference loads it (HF transformers), or None."""
        return None

    def stock_generate(self, target, draft, pair, prompt, max_new_tokens: int, num_draft: int | None,
                       eos_token_ids) -> "GenerationResult":
        """Run the method's published reference loop (HF models) greedily."""
        from specc.stock import generate_ar

        return generate_ar(target, prompt, max_new_tokens, eos_token_ids)

    def __repr__(self) -> str:
        return f"<method {self.name}>"
