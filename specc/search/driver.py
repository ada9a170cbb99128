"""The search driver: rounds of propose -> predict -> compile -> token forcing -> (measure) -> keep.

    result = Search(model, drafter, deployment="h200-bs1").run(rounds=3)
    result.best.candidate.describe(), result.best.prediction.summary()

Each round:

1. the current best configuration's prediction gives the **gap report** (cost_model.py);
2. the **proposers** (proposers.py; memory first, then built-in, optionally an LLM) return
   candidate configurations: passes per role, drafts per step, pass options;
3. every candidate is **predicted** with the cost model on meta-device IRs at the deployment's
   dtype (no weights needed) and the stock-measured acceptance model;
4. candidates predicted to beat the best (most promising first, memory candidates before the
   rest; at most ``max_verify`` a round) are **compiled** in memory (trace, passes with lint,
   lower, emit, instantiate) and **checked by token forcing** against stock on the calibration
   prompts; failures are rejected and remembered as such. A passing candidate's acceptance is
   re-measured from its own free decoding (so drafts-per-step changes are judged on real
   acceptance) and it is re-predicted; on a CUDA deployment with a GPU its step times are
   **measured** (CUDA graphs) and measured tokens/s decides;
5. the best is kept; an improvement is recorded in the **memory** (memory.py) as a validated
   mechanism with its predicted (and measured) gain over the configuration it improved on.

Pieces: ``choose.py`` (``choose_pipeline``, the cheap entry point for `specc compile`), ``meta_pair.py``
(weightless IRs), ``evaluated.py`` (records), ``measure.py`` (GPU timing), ``sandbox.py`` (the
confined worker for untrusted pass code and the verifier of its emitted modules),
``emitted_check.py`` (the kernel-ABI check of emitted modules), ``check.py`` (compile + token
forcing), ``defaults.py``.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any, Sequence

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.cost_model import CostModel, SystemPrediction
from specc.search.defaults import default_num_draft, default_pipeline, k_choices
from specc.search.defaults import one_line as _one_line
from specc.search.check import _check_sandboxed, check, system
from specc.search.evaluated import Evaluated, Reporter, SearchContext, SearchError, SearchResult
from specc.search.measure import measure_candidate
from specc.search.memory import pair_weights as _pair_weights
from specc.search.proposers import ROLES, BuiltinProposer, Candidate, MemoryProposer, Proposer

MIN_GAIN = 1e-3  # a candidate must beat the best by this fraction (predicted) to be checked and kept
MEASURED_MIN_GAIN = 1e-2  # ... and by this fraction when measured (timing noise)
SANDBOX_TIMEOUT_S = 300

__all__ = ["MEASURED_MIN_GAIN", "MIN_GAIN", "SANDBOX_TIMEOUT_S", "Search", "SearchError", "search"]


class Search:
    """A search session for one (target, drafter, method) on one deployment; see the module docstring.

    memory: a ``Memory``, a file/directory path, None (the default location) or False (none).
    device: where candidates are compiled and checked (default: the deployment's device when
      available, else CPU), in ``dtype`` (default: the deployment's dtype, so bf16 passes fire);
      predictions always use the deployment's dtype.
    runs / stock_acceptance: inject stock results (the sandbox worker does; tests may).
    """

    def __init__(self, model: str, drafter: str | None = None, *, method: str | None = None,
                 deployment: Any = "cpu", memory: Any = None, proposers: Sequence[Proposer] | None = None,
                 prompts: Sequence[Sequence[int]] | None = None, max_new_tokens: int = 16, num_prompts: int = 3,
                 start_pipeline: str | None = None, num_draft: int | None = None, max_verify: int = 3,
                 measure: bool | None = None, device: str | None = None, dtype: str | None = None,
                 tolerance: float | None = None,
                 context: int | None = None, reporter: Reporter | None = None, runs=None,
                 stock_acceptance: AcceptanceModel | None = None, sandbox_timeout: float = SANDBOX_TIMEOUT_S):
        import torch

        from specc.pairing import resolve_pair
        from specc.search.deployments import get_deployment
        from specc.search.memory import Memory, family_of

        self.pair = resolve_pair(model, drafter, method)
        self.method = self.pair.method
        self.deployment = get_deployment(deployment) if isinstance(deployment, str) else deployment
        dep = self.deployment
        cuda_ok = torch.cuda.is_available()
        self.device = device or ("cuda" if dep.device == "cuda" and cuda_ok else "cpu")
        if self.device == "cuda" and not cuda_ok:
            raise UserError("device cuda requested but no CUDA GPU is available")
        # Candidates are checked in the deployment's dtype (bf16 on CPU too when no GPU is lent):
        # dtype-specific passes (pack_weights_12bit packs bf16) then really run and are really checked.
        self.dtype = getattr(torch, dtype or dep.dtype)
        self.measure = (dep.device == "cuda" and self.device == "cuda") if measure is None else bool(measure)
        from specc.verify import DEFAULT_TOLERANCE

        self.tolerance = tolerance if tolerance is not None else DEFAULT_TOLERANCE[str(self.dtype).replace("torch.", "")]
        self.cost = CostModel(dep)
        self.context = context
        self.reporter = reporter or Reporter()
        self.max_new_tokens, self.num_prompts, self.max_verify = max_new_tokens, num_prompts, max_verify
        self.sandbox_timeout = sandbox_timeout
        self.roles: tuple[str, ...] = ROLES if self.pair.impl.uses_drafter else ("target",)
        self.family = family_of(self.pair.target.raw)
        if memory is False:
            self.memory = None
        elif isinstance(memory, Memory):
            self.memory = memory
        else:
            self.memory = Memory.open(self.family, dep.name, memory)
        self.proposers: list[Proposer] = list(proposers) if proposers is not None else [MemoryProposer(), BuiltinProposer()]
        if proposers is not None and not any(isinstance(p, MemoryProposer) for p in self.proposers):
            self.proposers.insert(0, MemoryProposer())
        k0 = num_draft if num_draft is not None else default_num_draft(self.pair)
        if not self.pair.impl.uses_drafter:
            k0 = 0
        self.k_choices = k_choices(self.pair, k0)
        pipe = default_pipeline() if start_pipeline is None else start_pipeline
        self.start = Candidate({r: pipe for r in self.roles}, k0, mechanism="baseline", origin="start")
        self._prompts = [list(p) for p in prompts] if prompts is not None else None
        self.runs = list(runs) if runs is not None else None
        self.stock_acceptance = stock_acceptance
        self._models: dict[str, Any] | None = None
        self._meta: dict[str, Any] | None = None
        self._meta_irs: dict[tuple, Any] = {}
        self._real: collections.OrderedDict = collections.OrderedDict()
        self.history: dict[str, Evaluated] = {}
        self._acceptance: dict[str, AcceptanceModel] = {}
        self.spec = None

    # ------------------------------------------------------------------ setup

    @property
    def model_name(self) -> str:
        return self.pair.target.name

    @property
    def drafter_name(self) -> str:
        return self.pair.drafter.name if self.pair.drafter else ""

    def _load_models(self) -> dict[str, Any]:
        if self._models is not None:
            return self._models
        loaded = self.pair.impl.load(self.pair, self.dtype, self.device)
        self.spec = loaded.draft_spec
        models: dict[str, Any] = {"target": loaded.target}
        if loaded.draft is not None:
            models["drafter"] = loaded.draft
        for m in models.values():
            m.setup_caches(1, 16)
        self._models = models
        return models

    def _meta_models(self) -> dict[str, Any]:
        if self._meta is not None:
            return self._meta
        pair = self.pair
        loaded = pair.impl.load_meta(pair.target.raw, pair.drafter.raw if pair.drafter else None,
                                     dtype=self.deployment.dtype)
        out: dict[str, Any] = {"target": loaded.target}
        if loaded.draft is not None:
            out["drafter"] = loaded.draft
        self._meta = out
        return out

    def prompts(self) -> list[list[int]]:
        if self._prompts is None:
            from specc.models.loading import load_tokenizer
            from specc.verify import calibration_prompts

            tokenizer = load_tokenizer(self.pair.target.path)
            self._prompts = calibration_prompts(tokenizer, int(self.pair.target.raw["vocab_size"]), count=self.num_prompts)
        return self._prompts

    def setup_stock(self) -> AcceptanceModel:
        """Stock on the calibration prompts: the tokens to force and the acceptance model."""
        if self.runs is not None and self.stock_acceptance is not None:
            return self.stock_acceptance
        from specc.stock.runner import StockSystem
        from specc.verify import StockRun, stock_margins

        k_max = max(self.k_choices) if self.k_choices else None
        self.reporter.message(f"stock {self.method}" + (f" (k={k_max})" if k_max else "") + f" on {len(self.prompts())} "
                              f"prompts x {self.max_new_tokens} tokens")
        stock = StockSystem(self.pair, k_max, self.dtype, self.device)
        runs, lengths = [], []
        for p in self.prompts():
            result = stock.generate(list(p), self.max_new_tokens)
            runs.append(StockRun(list(p), result.tokens, stock_margins(stock.target, list(p), result.tokens)))
            lengths.append(result.stats.accepted_lengths)
        self.runs = runs
        if k_max:
            self.stock_acceptance = AcceptanceModel.from_accepted_lengths(
                lengths, k_max, source=f"stock {self.method} k={k_max} on {len(runs)} calibration prompts x "
                                       f"{self.max_new_tokens} tokens")
        else:
            self.stock_acceptance = AcceptanceModel.none()
        del stock
        return self.stock_acceptance

    # ------------------------------------------------------------------ IRs

    def _trace(self, role: str, meta: bool):
        from specc.codegen.build import trace_step

        models = self._meta_models() if meta else self._load_models()
        return trace_step(models[role], role)

    def _run_passes(self, ir, pipeline: str, options: dict[str, Any], check: bool) -> dict:
        """Run a candidate's pipeline; with ``check`` the result must lint. Per-pass ``ensures``
        are not evaluated: pass options select subsets (pack_weights_12bit's ``pack_include``)
        that a pass's option-blind postcondition would reject; token forcing is the judge."""
        from specc.codegen.build import run_passes

        report = run_passes(ir, pipeline, options=options, check=False, lint=check)
        return {} if report is None else {r.name: r.changed for r in report.records}

    def meta_ir(self, role: str, cand: Candidate):
        """The candidate's IR for ``role`` on the meta device (for predictions), cached."""
        pipeline, options = cand.passes.get(role, ""), cand.options.get(role, {})
        key = (role, pipeline, json.dumps(options, sort_keys=True))
        if key not in self._meta_irs:
            ir = self._trace(role, meta=True)
            try:
                self._run_passes(ir, pipeline, options, check=False)
            except Exception:
                # a pass that needs weight values (e.g. packing) cannot run on meta: use the real IR
                ir = self.real_ir(role, cand)[0]
            self._meta_irs[key] = ir
        return self._meta_irs[key]

    def real_ir(self, role: str, cand: Candidate):
        """(IR after passes, linted; emitted step) for ``role`` with real weights, LRU-cached."""
        from specc.codegen.build import build_step

        pipeline, options = cand.passes.get(role, ""), cand.options.get(role, {})
        key = (role, pipeline, json.dumps(options, sort_keys=True))
        if key in self._real:
            self._real.move_to_end(key)
            return self._real[key]
        module = self._load_models()[role]
        extra = self.spec.block_size if role == "drafter" and self.spec is not None else 0
        # per-pass ``ensures`` are not evaluated (see _run_passes); the result must lint
        built = build_step(module, role, pipeline, options=options, check=False, lint=True, cache_extra_len=extra,
                           linear_choice=self.cost.linear_choice)  # as compile lowers: built and priced alike
        entry = (built.ir, built.emitted, built.lowering)
        self._real[key] = entry
        while len(self._real) > (2 * len(self.roles) if self.device == "cuda" else 8):
            self._real.popitem(last=False)
        return entry

    # ------------------------------------------------------------------ evaluation

    def acceptance_for(self, cand: Candidate) -> AcceptanceModel:
        if not self.pair.impl.uses_drafter:
            return AcceptanceModel.none()
        return self._acceptance.get(cand.key()) or self.stock_acceptance or AcceptanceModel.none()

    def predict(self, cand: Candidate, acceptance: AcceptanceModel | None = None) -> SystemPrediction:
        """The cost model's prediction of a candidate (meta-device IRs at the deployment's dtype)."""
        t_ir = self.meta_ir("target", cand)
        d_ir = self.meta_ir("drafter", cand) if "drafter" in self.roles else None
        return self.cost.predict(t_ir, d_ir, method=self.method, num_draft=cand.num_draft,
                                 acceptance=acceptance or self.acceptance_for(cand), context=self.context)

    # compile + token forcing (check.py) and GPU timing (measure.py): functions of a Search, bound here
    system = system
    check = check
    _check_sandboxed = _check_sandboxed
    measure_candidate = measure_candidate

    # ------------------------------------------------------------------ rounds

    def _context(self, round_: int, best: Evaluated) -> SearchContext:
        from specc.passes import available_passes

        siblings = self.memory.siblings() if self.memory is not None else []
        layers = {"target": int(self.pair.target.raw.get("num_hidden_layers", 0))}
        if self.pair.drafter is not None:
            layers["drafter"] = int(self.pair.drafter.raw.get("num_hidden_layers", 0))
        return SearchContext(round_, self.method, self.deployment, best,
                             best.prediction.gap_report() if best.prediction is not None else None, self.history,
                             self.memory, siblings, available_passes(), self.roles, layers, self.k_choices,
                             self.model_name, self.drafter_name, ir_summary=lambda: self.ir_summary(best.candidate))

    def ir_summary(self, cand: Candidate) -> str:
        """Node kinds and totals of the candidate's IRs (what an LLM proposer is shown)."""
        import collections as _c

        from specc.ir import fmt_bytes, fmt_flops

        lines = []
        if cand.sandbox:  # tracing it here would run untrusted pass code in this process
            return "(not shown: the configuration holds sandboxed pass code, traced only in the sandbox)"
        for role in self.roles:
            ir = self.meta_ir(role, cand)
            kinds = _c.Counter(ir.meta(n).kind for n in ir.graph.nodes)
            values = {"B": self.deployment.batch_size, "Q": max(cand.num_draft, 0) + 1, "C": 1024, "N": 4}
            tot = ir.totals().evaluate({k: v for k, v in values.items() if k in {str(s) for s in ir.symbols}})
            lines.append(f"{role} ({ir.title}), step {ir.step}, passes [{cand.passes.get(role) or '-'}]:")
            lines.append("  kinds: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
            lines.append(f"  at {values}: weights {fmt_bytes(tot['weight_bytes'])}, KV read {fmt_bytes(tot['cache_read'])}, "
                         f"total bytes {fmt_bytes(tot['bytes'])}, {fmt_flops(tot['flops'])}")
        return "\n".join(lines)

    def _predict_candidate(self, cand: Candidate) -> Evaluated:
        ev = Evaluated(cand)
        if cand.sandbox:
            ev.status = "pending (sandboxed)"
            return ev
        try:
            ev.prediction = self.predict(cand)
            ev.status = "predicted"
        except Exception as exc:
            ev.status, ev.error, ev.verified = "rejected: passes failed", _one_line(exc), False
        return ev

    def _remember(self, ev: Evaluated, parent: Evaluated | None) -> None:
        if self.memory is None:
            return
        from specc.search.memory import MemoryEntry, pass_sources

        gain = mgain = None
        sources = pass_sources(ev.candidate.passes.values())
        sources.update(ev.candidate.sources)  # pinned when proposed, before the sandbox ran it
        if parent is not None and ev.verified:
            gain = ev.predicted_tokens_per_s / parent.predicted_tokens_per_s if parent.predicted_tokens_per_s else None
            if ev.measured and parent.measured and ev.measured.get("tokens_per_s") and parent.measured.get("tokens_per_s"):
                mgain = ev.measured["tokens_per_s"] / parent.measured["tokens_per_s"]
        self.memory.add(MemoryEntry(
            mechanism=ev.candidate.mechanism, parameters=ev.candidate.parameters(), predicted_gain=gain,
            measured_gain=mgain, validated=bool(ev.verified), model=self.model_name, drafter=self.drafter_name,
            method=self.method, deployment=self.deployment.name,
            prediction={**ev.prediction_summary(), **({"measured": ev.measured} if ev.measured else {})},
            notes=(ev.error or ev.candidate.reason or "")[:500],
            pass_sources=sources, sandbox=dict(ev.sandbox or {})))

    def run(self, rounds: int = 2) -> SearchResult:
        if rounds < 0:
            raise UserError("--rounds must be >= 0")
        t0 = time.perf_counter()
        self.setup_stock()
        self._load_models()
        if self.memory is not None and self.stock_acceptance is not None and self.stock_acceptance.measured_k:
            self.memory.record_acceptance(self.model_name, self.drafter_name, self.method,
                                          self.stock_acceptance.measured_k, self.stock_acceptance,
                                          weights=_pair_weights(self.pair))
        self.reporter.message(f"acceptance: {self.stock_acceptance.describe(self.start.num_draft or None)}")
        base = self._predict_candidate(self.start)
        if base.prediction is None:
            raise SearchError(f"the starting configuration does not build: {base.error}")
        self.reporter.message(f"baseline {self.start.describe()}: checking by token forcing")
        self.check(base)
        if not base.verified:
            raise SearchError(f"the starting configuration fails verification: {base.error}")
        self.history[self.start.key()] = base
        best = base
        log: list[dict[str, Any]] = []
        for r in range(1, rounds + 1):
            ctx = self._context(r, best)
            report = ctx.gap_report
            self.reporter.message(f"round {r}: best {best.candidate.describe()} = {best.score:,.1f} tok/s; "
                                  f"largest gap: {report.top().name if report and report.top() else '-'}")
            proposed: list[Candidate] = []
            for p in self.proposers:
                try:
                    proposed += p.propose(ctx)
                except Exception as exc:
                    ctx.notes.append(f"proposer {p.name} failed: {_one_line(exc)}")
            fresh, seen = [], set()
            for c in proposed:
                k = c.key()
                if k in seen or k in self.history:
                    continue
                seen.add(k)
                fresh.append(c)
            evals = [self._predict_candidate(c) for c in fresh]
            for ev in evals:
                self.history[ev.candidate.key()] = ev
            queue = [e for e in evals if e.prediction is not None or e.candidate.sandbox]
            memory_first = [e for e in queue if e.candidate.origin.startswith("memory")]
            # most promising first; sandboxed (LLM-written) passes, with no in-process prediction, last
            rest = sorted((e for e in queue if not e.candidate.origin.startswith("memory")),
                          key=lambda e: (e.candidate.sandbox, -(e.score)))
            forced = [e for e in memory_first + rest if e.candidate.sandbox or e.candidate.check_always]
            best_pred = best.predicted_tokens_per_s or 0.0  # predictions compare with predictions
            to_check = [e for e in memory_first + rest
                        if e not in forced and (e.predicted_tokens_per_s or 0.0) > best_pred * (1 + MIN_GAIN)]
            for e in queue:
                if e not in to_check and e not in forced:
                    e.status = "not better (predicted)"
            to_check = to_check[: self.max_verify] + forced
            for e in queue:
                if e.status == "predicted" and e not in to_check:
                    e.status = "not checked (round budget)"
            self.reporter.start(f"round {r}: checking", len(to_check))
            round_best = best
            checked_order = []
            for e in to_check:
                checked_order.append({"mechanism": e.candidate.mechanism, "origin": e.candidate.origin})
                self.check(e)
                self.reporter.advance(f"{e.candidate.mechanism}: {e.status}")
                gain = MEASURED_MIN_GAIN if self.measure else MIN_GAIN
                if e.verified and e.score > best.score * (1 + gain):
                    # a sandboxed pass keeps the worker's (advisory) prediction: predicting here
                    # would run its code in this process
                    self._remember(e, best)  # a validated mechanism, gain over this round's start
                    if e.score > round_best.score * (1 + gain):
                        round_best = e
                elif e.verified:
                    e.status += ", not better"
                if e.verified is False:
                    self._remember(e, None)  # remembered as not validated, with the reason
            self.reporter.stop()
            improved = round_best is not best
            if improved:
                if round_best.acceptance is not None and self.memory is not None:
                    self.memory.record_acceptance(self.model_name, self.drafter_name, self.method,
                                                  round_best.candidate.num_draft, round_best.acceptance,
                                                  weights=_pair_weights(self.pair))
                best = round_best
                best.status = "best"
            log.append({"round": r, "gap_report": report.to_json() if report else None, "notes": ctx.notes,
                        "proposed": len(proposed), "new": len(fresh), "checked": len(to_check),
                        "checked_order": checked_order, "improved": improved,
                        "best": best.candidate.describe(), "best_tokens_per_s": best.score,
                        "candidates": [e.to_json() for e in evals]})
            self.reporter.message(f"round {r}: {len(fresh)} new candidates, {len(to_check)} checked, "
                                  + (f"new best {best.candidate.describe()} = {best.score:,.1f} tok/s" if improved
                                     else "no improvement"))
            if self.memory is not None:
                self.memory.save()
            if not fresh:
                break
        if self.memory is not None:
            self.memory.save()
        return SearchResult(self.model_name, self.pair.drafter.name if self.pair.drafter else None, self.method,
                            self.deployment.name, self.device, self.measure, base, best, log,
                            self.stock_acceptance, str(self.memory.path) if self.memory is not None else None,
                            time.perf_counter() - t0)


def search(model: str, drafter: str | None = None, *, deployment: Any = "cpu", rounds: int = 2, **kwargs) -> SearchResult:
    """Run a search (see :class:`Search` for the options)."""
    return Search(model, drafter, deployment=deployment, **kwargs).run(rounds)
