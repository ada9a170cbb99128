"""Proposers: where search candidates come from.

A proposer looks at the search state (the current best configuration, its gap report, what was
tried, the memory) and returns :class:`Candidate` configurations. The driver predicts every
candidate with the cost model, checks the promising ones by token forcing and keeps the best.

    class MyProposer(Proposer):
        name = "mine"

        def propose(self, ctx: SearchContext) -> list[Candidate]:
            best = ctx.best.candidate
            return [best.with_passes("target", best.passes["target"] + ",my_pass", mechanism="my_pass on")]

Built in:

- :class:`MemoryProposer` (round 1): validated configurations from the memory of this
  deployment, then of the family's other deployments, tried first.
- :class:`BuiltinProposer`: drafts per step (``num_draft``; the DFlash block bounds it), each
  fusion pass on/off (both roles), and ``pack_weights_12bit`` per layer group (all target
  linears, all but the LM head, the first half, the second half of the layers, the drafter) when
  a pass of that name is registered.
  Tree shapes and two-level thresholds plug in later as further proposers.
- ``specc.search.llm_proposer.LLMProposer``: asks an OpenAI-compatible chat endpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

# Passes the built-in proposer toggles (when registered), in their canonical pipeline order;
# dce always stays last.
FUSIONS = ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear")
PACK_12BIT = "pack_weights_12bit"
PACK_OPTIONS = ("pack_include", "pack_exclude", "pack_base", "pack_version")  # the options pack_weights_12bit reads
CANONICAL = FUSIONS + (PACK_12BIT,)
ROLES = ("target", "drafter")


def split_pipeline(pipeline: str) -> list[str]:
    return [p.strip() for p in (pipeline or "").split(",") if p.strip()]


def join_pipeline(items) -> str:
    return ",".join(items)


def with_pass(pipeline: str, name: str) -> str:
    """Insert ``name`` at its canonical place (dce stays last); no-op if present."""
    items = split_pipeline(pipeline)
    if name in items:
        return pipeline
    rank = {n: i for i, n in enumerate(CANONICAL)}
    pos = len(items)
    if "dce" in items:
        pos = items.index("dce")
    if name in rank:
        for i, item in enumerate(items):
            if item in rank and rank[item] > rank[name]:
                pos = min(pos, i)
                break
    items.insert(pos, name)
    return join_pipeline(items)


def without_pass(pipeline: str, name: str) -> str:
    return join_pipeline([p for p in split_pipeline(pipeline) if p != name])


@dataclasses.dataclass
class Candidate:
    """One configuration: passes per role, drafts per step, pass options per role.

    ``mechanism`` says what changed relative to the configuration it came from; ``origin`` which
    proposer made it; ``sandbox`` that it contains untrusted pass code (evaluated in a subprocess);
    ``check_always`` that it is compiled and token-forced even when the cost model predicts no gain
    (sandboxed candidates always are: their prediction comes from the sandbox).
    """

    passes: dict[str, str]
    num_draft: int
    options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    mechanism: str = "baseline"
    origin: str = "builtin"
    reason: str = ""
    sandbox: bool = False
    check_always: bool = False
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # pass ref -> sha256 pinned when proposed

    def parameters(self) -> dict[str, Any]:
        return {"passes": dict(sorted(self.passes.items())), "num_draft": self.num_draft,
                "options": {r: dict(sorted(o.items())) for r, o in sorted(self.options.items()) if o}}

    def key(self) -> str:
        return json.dumps(self.parameters(), sort_keys=True)

    def with_(self, **changes) -> "Candidate":
        changes.setdefault("reason", "")
        changes.setdefault("check_always", False)
        return dataclasses.replace(self, **changes)

    def with_passes(self, role: str, pipeline: str, **changes) -> "Candidate":
        passes = dict(self.passes)
        passes[role] = pipeline
        return self.with_(passes=passes, **changes)

    def pipeline(self, role: str = "target") -> str:
        return self.passes.get(role, "")

    @property
    def single_pipeline(self) -> str | None:
        """The pipeline when every role uses the same one without options (what `specc compile` takes)."""
        values = set(self.passes.values())
        if len(values) == 1 and not any(self.options.values()):
            return values.pop()
        return None

    def describe(self) -> str:
        parts = []
        pipes = set(self.passes.values())
        if len(pipes) == 1:
            parts.append(f"passes [{next(iter(pipes)) or '-'}]")
        else:
            parts += [f"{role} [{p or '-'}]" for role, p in sorted(self.passes.items())]
        if self.num_draft:
            parts.append(f"k={self.num_draft}")
        opts = {r: o for r, o in self.options.items() if o}
        if opts:
            parts.append("options " + json.dumps(opts, sort_keys=True))
        return " ".join(parts)

    @classmethod
    def from_parameters(cls, params: dict[str, Any], **kwargs) -> "Candidate":
        passes = params.get("passes") or {}
        if isinstance(passes, str):
            passes = {"target": passes, "drafter": passes}
        return cls(passes=dict(passes), num_draft=int(params.get("num_draft") or 0),
                   options={r: dict(o) for r, o in (params.get("options") or {}).items()}, **kwargs)


class Proposer:
    """Base class: ``propose(ctx) -> list[Candidate]``."""

    name = "proposer"

    def propose(self, ctx) -> list[Candidate]:  # pragma: no cover - interface
        raise NotImplementedError


def _pipeline_usable(pipeline: str, registered) -> bool:
    for item in split_pipeline(pipeline):
        if item.startswith("+"):
            path = item[1:].rpartition(":")[0]
            if (path.endswith(".py") or "/" in path) and not os.path.isfile(path):
                return False
        elif item not in registered:
            return False
    return True


class MemoryProposer(Proposer):
    """Validated configurations remembered for this family: this deployment first, then others."""

    name = "memory"

    def propose(self, ctx) -> list[Candidate]:
        if ctx.round != 1 or ctx.memory is None:
            return []
        out: list[Candidate] = []
        sources = [(ctx.memory, "memory")] + [(m, f"memory:{m.deployment}") for m in ctx.siblings]
        for mem, origin in sources:
            for e in mem.validated(ctx.model_name, ctx.drafter_name, ctx.method, notes=getattr(ctx, "notes", None)):
                cand = Candidate.from_parameters(e.parameters, mechanism=e.mechanism, origin=origin,
                                                 reason=f"validated on {e.deployment or mem.deployment} {e.date[:10]}")
                # pass code that was checked in the sandbox (LLM-written) stays there, even once validated
                cand.sandbox = bool(e.sandbox) and any(i.startswith("+") for p in cand.passes.values()
                                                       for i in split_pipeline(p))
                if not all(_pipeline_usable(p, ctx.passes) for p in cand.passes.values()):
                    continue
                roles = set(ctx.roles)
                cand.passes = {r: p for r, p in cand.passes.items() if r in roles}
                for r in roles:
                    cand.passes.setdefault(r, ctx.best.candidate.passes.get(r, ""))
                cand.options = {r: o for r, o in cand.options.items() if r in roles}
                if not ctx.k_choices:  # the method has no drafter
                    cand.num_draft = 0
                elif e.drafter != ctx.drafter_name or e.method != ctx.method or cand.num_draft not in ctx.k_choices:
                    cand.num_draft = ctx.best.candidate.num_draft  # k is a property of the drafter
                out.append(cand)
        return out


class BuiltinProposer(Proposer):
    """Pass sets and parameters around the current best (see the module docstring)."""

    name = "builtin"
    MECHANISMS = ("k", "fusion", "12bit")

    def __init__(self, mechanisms: tuple[str, ...] = MECHANISMS):
        """``mechanisms``: which groups to propose: "k" (drafts per step), "fusion" (fusion passes
        on/off), "12bit" (pack_weights_12bit per layer group)."""
        unknown = set(mechanisms) - set(self.MECHANISMS)
        if unknown:
            raise ValueError(f"unknown mechanisms {sorted(unknown)} (known: {', '.join(self.MECHANISMS)})")
        self.mechanisms = tuple(mechanisms)

    def propose(self, ctx) -> list[Candidate]:
        best = ctx.best.candidate
        top = ctx.gap_report.top() if ctx.gap_report is not None else None
        top_name = top.name if top is not None else ""
        groups: dict[str, list[Candidate]] = {"k": [], "fusion": [], "12bit": []}

        for k in ctx.k_choices:
            if k != best.num_draft:
                groups["k"].append(best.with_(num_draft=k, mechanism=f"num_draft {best.num_draft} -> {k}",
                                              origin=self.name, reason="drafter cost vs accepted tokens"))
        for name in FUSIONS:
            if name not in ctx.passes:
                continue
            on = {r: name in split_pipeline(best.passes.get(r, "")) for r in ctx.roles}
            if all(on.values()):
                passes = {r: without_pass(best.passes[r], name) for r in ctx.roles}
                mech = f"{name} off"
            else:
                passes = {r: with_pass(best.passes.get(r, ""), name) for r in ctx.roles}
                mech = f"{name} on"
            groups["fusion"].append(best.with_(passes=passes, mechanism=mech, origin=self.name,
                                               reason="fewer launches and bytes"))
        if "dce" in ctx.passes and any(split_pipeline(best.passes.get(r, "")) and "dce" not in
                                       split_pipeline(best.passes.get(r, "")) for r in ctx.roles):
            passes = {r: with_pass(best.passes.get(r, ""), "dce") if best.passes.get(r) else "" for r in ctx.roles}
            groups["fusion"].append(best.with_(passes=passes, mechanism="dce on", origin=self.name,
                                               reason="drop originals of fused weights"))
        if PACK_12BIT in ctx.passes:
            groups["12bit"] += self._pack_candidates(ctx, best)

        order = ["k", "fusion", "12bit"]
        if "launch" in top_name:
            order = ["fusion", "k", "12bit"]
        elif "linear" in top_name or "LM head" in top_name:
            order = ["12bit", "fusion", "k"]
        elif "drafter" in top_name:
            order = ["k", "12bit", "fusion"]
        out = []
        for g in order:
            if g not in self.mechanisms:
                continue
            for c in groups[g]:
                c.reason = (c.reason + f"; gap leader: {top_name}") if top_name else c.reason
                out.append(c)
        return out

    def _pack_candidates(self, ctx, best: Candidate) -> list[Candidate]:
        """pack_weights_12bit on all target layers, on each half, on everything but the LM head,
        and on the drafter. Layer groups go through the pass's ``pack_include`` option (weight-name
        substrings ``layers.<i>.``), the LM head through ``pack_exclude``."""
        out = []
        layers = ctx.num_layers.get("target", 0)
        target_has = PACK_12BIT in split_pipeline(best.passes.get("target", ""))
        target_opts = dict(best.options.get("target", {}))
        base_opts = {k: v for k, v in target_opts.items() if k not in PACK_OPTIONS}
        groups: list[tuple[str, dict[str, Any]]] = [("all target linears", {}),
                                                    ("target linears except the LM head", {"pack_exclude": ["lm_head"]})]
        if layers >= 2:
            half = layers // 2
            groups += [(f"target layers 0-{half - 1}", {"pack_include": [f"layers.{i}." for i in range(half)]}),
                       (f"target layers {half}-{layers - 1}",
                        {"pack_include": [f"layers.{i}." for i in range(half, layers)]})]
        for label, extra in groups:
            opts = {**base_opts, **extra}
            if target_has and opts == target_opts:
                continue
            cand = best.with_passes("target", with_pass(best.passes.get("target", ""), PACK_12BIT),
                                    mechanism=f"{PACK_12BIT} on {label}", origin=self.name,
                                    reason="fewer weight bytes per step")
            cand.options = {**best.options, "target": opts}
            out.append(cand)
        if target_has:
            cand = best.with_passes("target", without_pass(best.passes["target"], PACK_12BIT),
                                    mechanism=f"{PACK_12BIT} off (target)", origin=self.name)
            cand.options = {**best.options, "target": base_opts}
            out.append(cand)
        if "drafter" in ctx.roles:
            pipe = best.passes.get("drafter", "")
            if PACK_12BIT in split_pipeline(pipe):
                out.append(best.with_passes("drafter", without_pass(pipe, PACK_12BIT),
                                            mechanism=f"{PACK_12BIT} off (drafter)", origin=self.name))
            else:
                out.append(best.with_passes("drafter", with_pass(pipe, PACK_12BIT),
                                            mechanism=f"{PACK_12BIT} on drafter", origin=self.name,
                                            reason="fewer drafter weight bytes"))
        return out
