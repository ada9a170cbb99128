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

``choose_pipeline(pair, deployment, memory)`` is the cheap entry point for `specc compile`: no
compilation, only cost-model predictions of the default pipeline and remembered ones.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.cost_model import CostModel, SystemPrediction
from specc.search.proposers import K_CHOICES, ROLES, BuiltinProposer, Candidate, MemoryProposer, Proposer

MIN_GAIN = 1e-3  # a candidate must beat the best by this fraction (predicted) to be checked and kept
MEASURED_MIN_GAIN = 1e-2  # ... and by this fraction when measured (timing noise)
SANDBOX_TIMEOUT_S = 300


class SearchError(UserError):
    """The search cannot proceed (e.g. the starting configuration fails token forcing)."""


def default_pipeline() -> str:
    from specc.compiler import DEFAULT_PIPELINE

    return DEFAULT_PIPELINE


def default_num_draft(pair) -> int:
    """Drafts per step `specc compile` uses by default: 4 ar-draft, 8 pard, block_size - 1 dflash."""
    if pair.method == "dflash":
        from specc.models.dflash import DFlashSpec

        return DFlashSpec.from_hf(pair.drafter.raw).block_size - 1
    return {"pard": 8, "ar-draft": 4}.get(pair.method, 0)


def k_choices(pair, start: int) -> list[int]:
    if pair.method == "ar":
        return []
    ks = set(K_CHOICES.get(pair.method, ()))
    if pair.method == "dflash":
        ks = {k for k in ks if k <= default_num_draft(pair)} | {default_num_draft(pair)}
    ks.add(start)
    return sorted(k for k in ks if k >= 1)


# --------------------------------------------------------------------------- records


@dataclasses.dataclass
class Evaluated:
    """A candidate with what the search learnt about it."""

    candidate: Candidate
    prediction: SystemPrediction | None = None
    prediction_json: dict[str, Any] | None = None  # sandboxed candidates: the worker's prediction
    verified: bool | None = None
    forcing: dict[str, Any] | None = None
    acceptance: AcceptanceModel | None = None  # measured on the compiled system
    measured: dict[str, Any] | None = None
    status: str = "proposed"
    error: str | None = None
    lowering: dict[str, Any] | None = None

    @property
    def predicted_tokens_per_s(self) -> float | None:
        if self.prediction is not None:
            return self.prediction.tokens_per_s
        if self.prediction_json is not None:
            return float(self.prediction_json["tokens_per_s"])
        return None

    @property
    def score(self) -> float:
        """What decides: measured tokens/s when measured, else predicted."""
        if self.measured and self.measured.get("tokens_per_s"):
            return float(self.measured["tokens_per_s"])
        p = self.predicted_tokens_per_s
        return float(p) if p is not None else 0.0

    def prediction_summary(self) -> dict[str, Any]:
        if self.prediction is not None:
            p = self.prediction
            return {"tokens_per_s": p.tokens_per_s, "speedup": p.speedup, "step_s": p.step_time,
                    "ar_step_s": p.ar.time, "expected_tokens_per_step": p.expected_tokens}
        if self.prediction_json is not None:
            j = self.prediction_json
            return {k: j.get(k2) for k, k2 in (("tokens_per_s", "tokens_per_s"), ("speedup", "speedup"),
                                                ("step_s", "step_s"), ("ar_step_s", "ar_step_s"),
                                                ("expected_tokens_per_step", "expected_tokens_per_step"))}
        return {}

    def to_json(self, full: bool = False) -> dict[str, Any]:
        out = {"config": self.candidate.describe(), "parameters": self.candidate.parameters(),
               "mechanism": self.candidate.mechanism, "origin": self.candidate.origin, "reason": self.candidate.reason,
               "status": self.status, "verified": self.verified, "error": self.error,
               "predicted": self.prediction_summary(), "measured": self.measured}
        if self.acceptance is not None:
            out["acceptance"] = self.acceptance.to_json()
        if self.forcing is not None:
            out["forcing"] = {k: self.forcing.get(k) for k in ("passed", "prompts", "positions", "tolerance")}
            out["forcing"]["mismatches"] = len(self.forcing.get("failures", []))
            out["forcing"]["ties"] = len(self.forcing.get("ties", []))
        if full and self.prediction is not None:
            out["prediction"] = self.prediction.to_json()
        return out


@dataclasses.dataclass
class SearchContext:
    """What proposers see."""

    round: int
    method: str
    deployment: Any
    best: Evaluated
    gap_report: Any
    history: dict[str, Evaluated]
    memory: Any
    siblings: list
    passes: dict[str, Any]
    roles: tuple[str, ...]
    num_layers: dict[str, int]
    k_choices: list[int]
    model_name: str
    drafter_name: str
    ir_summary: Callable[[], str] = lambda: ""
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SearchResult:
    model: str
    drafter: str | None
    method: str
    deployment: str
    device: str
    measured: bool
    baseline: Evaluated
    best: Evaluated
    rounds: list[dict[str, Any]]
    acceptance: AcceptanceModel
    memory_path: str | None
    seconds: float

    def choice(self) -> "Choice":
        c = self.best.candidate
        return Choice(c.single_pipeline if c.single_pipeline is not None else c.pipeline("target"), c.num_draft,
                      self.best.prediction_summary())

    def summary_lines(self) -> list[str]:
        b, base = self.best, self.baseline
        lines = [f"search {self.model}" + (f" + {self.drafter}" if self.drafter else "") + f" ({self.method}) on "
                 f"{self.deployment}: {len(self.rounds)} rounds in {self.seconds:.1f} s"
                 + (" (measured on the GPU)" if self.measured else " (predicted by the cost model)"),
                 f"baseline: {base.candidate.describe()}: {base.score:,.1f} tok/s",
                 f"best:     {b.candidate.describe()}: {b.score:,.1f} tok/s "
                 f"({b.score / base.score if base.score else 0:.3f}x baseline"
                 + (f", {b.prediction.speedup:.2f}x over AR predicted" if b.prediction is not None else "") + ")"]
        if self.memory_path:
            lines.append(f"memory: {self.memory_path}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "drafter": self.drafter, "method": self.method, "deployment": self.deployment,
                "device": self.device, "measured": self.measured, "seconds": self.seconds,
                "baseline": self.baseline.to_json(), "best": self.best.to_json(full=True),
                "choice": dataclasses.asdict(self.choice()), "rounds": self.rounds,
                "acceptance": self.acceptance.to_json(), "memory": self.memory_path}


class Reporter:
    """Progress sink; the CLI passes a rich-based one."""

    def message(self, text: str) -> None:
        pass

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, text: str = "") -> None:
        pass

    def stop(self) -> None:
        pass


class _Recorder:
    """Wraps a system for verify_system and keeps the accepted lengths of its free decoding."""

    def __init__(self, system):
        self.system = system
        self.lengths: list[list[int]] = []

    def forced_argmax(self, prompt, tokens):
        return self.system.forced_argmax(prompt, tokens)

    def generate(self, prompt, max_new_tokens, eos_token_ids=()):
        result = self.system.generate(prompt, max_new_tokens, eos_token_ids)
        self.lengths.append(list(result.stats.accepted_lengths))
        return result


# --------------------------------------------------------------------------- the search


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
        self.roles: tuple[str, ...] = ("target",) if self.method == "ar" else ROLES
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
        if self.method == "ar":
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
        from specc.models.dflash import DFlashDrafter
        from specc.models.registry import load_model

        pair, dtype, device = self.pair, self.dtype, self.device
        target = load_model(pair.target.path, dtype, device, with_tokenizer=False).model
        models: dict[str, Any] = {"target": target}
        if pair.method == "dflash":
            draft = load_model(pair.drafter.path, dtype, device, with_tokenizer=False).model
            self.spec = draft.spec
            target.capture_layers = tuple(draft.spec.target_layer_ids)
            models["drafter"] = DFlashDrafter(draft, target.embed_tokens, target.lm_head)
        elif pair.method in ("pard", "ar-draft"):
            models["drafter"] = load_model(pair.drafter.path, dtype, device, with_tokenizer=False).model
        for m in models.values():
            m.setup_caches(1, 16)
        self._models = models
        return models

    def _meta_models(self) -> dict[str, Any]:
        if self._meta is not None:
            return self._meta
        from specc.ir import bind_dflash, meta_model

        dtype = self.deployment.dtype
        target = meta_model(self.pair.target.raw, dtype=dtype)
        out: dict[str, Any] = {"target": target.model}
        if self.pair.method == "dflash":
            draft = meta_model(self.pair.drafter.raw, dtype=dtype).model
            target.model.capture_layers = tuple(draft.spec.target_layer_ids)
            out["drafter"] = bind_dflash(target.model, draft)
        elif self.pair.drafter is not None:
            out["drafter"] = meta_model(self.pair.drafter.raw, dtype=dtype).model
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
        from specc.ir import trace

        models = self._meta_models() if meta else self._load_models()
        return trace(models[role], "verify" if role == "target" else "draft")

    def _run_passes(self, ir, pipeline: str, options: dict[str, Any], check: bool) -> dict:
        """Run a candidate's pipeline; with ``check`` the result must lint. Per-pass ``ensures``
        are not evaluated: pass options select subsets (pack_weights_12bit's ``pack_include``)
        that a pass's option-blind postcondition would reject; token forcing is the judge."""
        from specc.passes import PassManager

        report = PassManager(pipeline, check=False, options=options).run(ir) if pipeline else None
        if check:
            ir.lint()
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
        from specc.codegen.emit import emit_step
        from specc.codegen.lower import lower

        pipeline, options = cand.passes.get(role, ""), cand.options.get(role, {})
        key = (role, pipeline, json.dumps(options, sort_keys=True))
        if key in self._real:
            self._real.move_to_end(key)
            return self._real[key]
        ir = self._trace(role, meta=False)
        self._run_passes(ir, pipeline, options, check=True)
        gm, low = lower(ir.gm)
        extra = self.spec.block_size if role == "drafter" and self.spec is not None else 0
        emitted = emit_step(gm, "TargetStep" if role == "target" else "DraftStep", cache_extra_len=extra)
        entry = (ir, emitted, {"lowered": low.lowered, "eager": low.eager})
        self._real[key] = entry
        while len(self._real) > (2 * len(self.roles) if self.device == "cuda" else 8):
            self._real.popitem(last=False)
        return entry

    # ------------------------------------------------------------------ evaluation

    def acceptance_for(self, cand: Candidate) -> AcceptanceModel:
        if self.method == "ar":
            return AcceptanceModel.none()
        return self._acceptance.get(cand.key()) or self.stock_acceptance or AcceptanceModel.none()

    def predict(self, cand: Candidate, acceptance: AcceptanceModel | None = None) -> SystemPrediction:
        """The cost model's prediction of a candidate (meta-device IRs at the deployment's dtype)."""
        t_ir = self.meta_ir("target", cand)
        d_ir = self.meta_ir("drafter", cand) if "drafter" in self.roles else None
        return self.cost.predict(t_ir, d_ir, method=self.method, num_draft=cand.num_draft,
                                 acceptance=acceptance or self.acceptance_for(cand), context=self.context)

    def system(self, cand: Candidate):
        """The compiled system of a candidate (in memory), ready for token forcing."""
        from specc.runtime.compiled import instantiate
        from specc.runtime.drafters import ARDraft, DFlashDraft, PardDraft
        from specc.runtime.eager import EagerSpeculativeDecoder

        self._load_models()
        _, t_emitted, _ = self.real_ir("target", cand)
        t_step = instantiate(t_emitted)
        drafter = None
        if "drafter" in self.roles:
            _, d_emitted, _ = self.real_ir("drafter", cand)
            d_step = instantiate(d_emitted, self.spec)
            if self.method == "dflash":
                drafter = DFlashDraft(d_step)
            elif self.method == "pard":
                drafter = PardDraft(d_step, self.pair.drafter.raw["pard_token"])
            else:
                drafter = ARDraft(d_step)
        max_len = max(len(r.prompt) + len(r.tokens) for r in self.runs) + 2
        return EagerSpeculativeDecoder(t_step, drafter, cand.num_draft, max_len)

    def check(self, ev: Evaluated) -> Evaluated:
        """Compile + token forcing (+ re-measured acceptance, + GPU timing) of one candidate."""
        from specc.verify import verify_system

        cand = ev.candidate
        if cand.sandbox:
            return self._check_sandboxed(ev)
        try:
            system = self.system(cand)
            lowering = {r: self.real_ir(r, cand)[2] for r in self.roles}
        except Exception as exc:
            ev.verified, ev.status, ev.error = False, "rejected: build failed", _one_line(exc)
            return ev
        ev.lowering = lowering
        rec = _Recorder(system)
        try:
            report = verify_system(rec, self.runs, self.tolerance, self.pair.eos_token_ids)
        except Exception as exc:
            ev.verified, ev.status, ev.error = False, "rejected: crashed under token forcing", _one_line(exc)
            return ev
        ev.forcing = report.to_json()
        if not report.passed:
            ev.verified, ev.status, ev.error = False, "rejected: token forcing failed", report.summary()
            return ev
        ev.verified, ev.status = True, "verified"
        if cand.num_draft and self.method != "ar":
            acc = AcceptanceModel.from_accepted_lengths(
                rec.lengths, cand.num_draft, source=f"compiled system k={cand.num_draft}, free decoding of "
                                                    f"{len(rec.lengths)} calibration prompts")
            self._acceptance[cand.key()] = acc
            ev.acceptance = acc
        ev.prediction = self.predict(cand)
        if self.measure:
            try:
                ev.measured = self.measure_candidate(cand, ev.acceptance or self.acceptance_for(cand))
            except Exception as exc:  # pragma: no cover - GPU only
                ev.measured = {"error": _one_line(exc)}
        return ev

    def _check_sandboxed(self, ev: Evaluated) -> Evaluated:
        """Untrusted pass code: build, lint, token forcing and prediction in a subprocess."""
        cand = ev.candidate
        job = {"model": str(self.pair.target.path), "drafter": str(self.pair.drafter.path) if self.pair.drafter else None,
               "method": self.method, "deployment": _deployment_ref(self.deployment), "device": self.device,
               "dtype": str(self.dtype).replace("torch.", ""), "tolerance": self.tolerance, "context": self.context,
               "candidate": cand.parameters(),
               "runs": [dataclasses.asdict(r) for r in self.runs],
               "acceptance": self.acceptance_for(cand).to_json()}
        with tempfile.TemporaryDirectory(prefix="specc-sandbox-") as tmp:
            inp, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
            inp.write_text(json.dumps(job))
            env = dict(os.environ)
            root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            try:
                proc = subprocess.run([sys.executable, "-m", "specc.search.driver", "--worker", str(inp), str(out)],
                                      capture_output=True, text=True, timeout=self.sandbox_timeout, env=env)
            except subprocess.TimeoutExpired:
                ev.verified, ev.status, ev.error = False, "rejected: timed out", f"sandbox exceeded {self.sandbox_timeout:g} s"
                return ev
            if not out.is_file():
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
                ev.verified, ev.status, ev.error = False, "rejected: sandbox crashed", tail[0]
                return ev
            res = json.loads(out.read_text())
        ev.forcing = res.get("forcing")
        ev.lowering = res.get("lowering")
        if not res.get("ok"):
            ev.verified, ev.status, ev.error = False, "rejected: " + res.get("stage", "check failed"), res.get("error")
            return ev
        ev.verified, ev.status = True, "verified (sandbox)"
        ev.prediction_json = res["prediction"]
        if res.get("acceptance"):
            ev.acceptance = AcceptanceModel.from_json(res["acceptance"])
            self._acceptance[cand.key()] = ev.acceptance
        if self.measure:  # it passed lint and token forcing in the sandbox: time it here like the others
            try:
                ev.measured = self.measure_candidate(cand, ev.acceptance or self.acceptance_for(cand))
            except Exception as exc:  # pragma: no cover - GPU only
                ev.measured = {"error": _one_line(exc)}
        return ev

    # ------------------------------------------------------------------ measuring (GPU)

    def measure_candidate(self, cand: Candidate, acceptance: AcceptanceModel) -> dict[str, Any]:
        """Step times of the compiled candidate with CUDA graphs (median replay), at the deployment's
        batch size and the prediction's context, combined with ``acceptance`` into tokens/s."""
        import torch

        from specc.runtime.compiled import instantiate
        from specc.search.calibrate import Timer

        dep, dev = self.deployment, torch.device(self.device)
        b = dep.batch_size
        p = self.predict(cand, acceptance)
        c = p.context
        timer = Timer(self.device, reps=20)
        vocab = int(self.pair.target.raw["vocab_size"])

        def target_time(q: int) -> float:
            step = instantiate(self.real_ir("target", cand)[1])
            step.setup_caches(b, c + q + 8)
            ids = torch.randint(0, vocab, (b, q), device=dev)
            pos = torch.arange(c, c + q, device=dev)[None].expand(b, -1).contiguous()
            lens = torch.full((b,), c, dtype=torch.long, device=dev)
            return timer(lambda: step(ids, pos, lens))

        out: dict[str, Any] = {"ar_s": target_time(1), "batch_size": b, "context": c}
        if self.method == "ar" or not cand.num_draft:
            out.update(step_s=out["ar_s"], tokens_per_s=b / out["ar_s"], ar_tokens_per_s=b / out["ar_s"], speedup=1.0)
            return out
        k = cand.num_draft
        out["verify_s"] = target_time(k + 1)
        d_step = instantiate(self.real_ir("drafter", cand)[1], self.spec)
        draft_total = 0.0
        for pred, count in p.drafts:
            q, n = pred.values.get("Q", 1), pred.values.get("N", 0)
            d_step.setup_caches(b, c + q + n + 8)
            lens = torch.full((b,), c, dtype=torch.long, device=dev)
            ids = torch.randint(0, vocab, (b, q), device=dev)
            if self.method == "dflash":
                hidden = torch.randn(b, n, len(self.spec.target_layer_ids) * int(self.pair.target.raw["hidden_size"]),
                                     device=dev, dtype=self.dtype)
                pos = torch.arange(c, c + n + q, device=dev)[None].expand(b, -1).contiguous()
                t = timer(lambda: d_step(ids, hidden, pos, lens))
            else:
                pos = torch.arange(c, c + q, device=dev)[None].expand(b, -1).contiguous()
                t = timer(lambda: d_step(ids, pos, lens))
            draft_total += t * count
        out["draft_s"] = draft_total
        out["step_s"] = draft_total + out["verify_s"]
        e = acceptance.expected_tokens(k)
        out["expected_tokens_per_step"] = e
        out["tokens_per_s"] = b * e / out["step_s"]
        out["ar_tokens_per_s"] = b / out["ar_s"]
        out["speedup"] = out["tokens_per_s"] / out["ar_tokens_per_s"]
        return out

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
        from specc.search.memory import MemoryEntry

        gain = mgain = None
        if parent is not None and ev.verified:
            gain = ev.predicted_tokens_per_s / parent.predicted_tokens_per_s if parent.predicted_tokens_per_s else None
            if ev.measured and parent.measured and ev.measured.get("tokens_per_s") and parent.measured.get("tokens_per_s"):
                mgain = ev.measured["tokens_per_s"] / parent.measured["tokens_per_s"]
        self.memory.add(MemoryEntry(
            mechanism=ev.candidate.mechanism, parameters=ev.candidate.parameters(), predicted_gain=gain,
            measured_gain=mgain, validated=bool(ev.verified), model=self.model_name, drafter=self.drafter_name,
            method=self.method, deployment=self.deployment.name,
            prediction={**ev.prediction_summary(), **({"measured": ev.measured} if ev.measured else {})},
            notes=(ev.error or ev.candidate.reason or "")[:500]))

    def run(self, rounds: int = 2) -> SearchResult:
        if rounds < 0:
            raise UserError("--rounds must be >= 0")
        t0 = time.perf_counter()
        self.setup_stock()
        self._load_models()
        if self.memory is not None and self.stock_acceptance is not None and self.stock_acceptance.measured_k:
            self.memory.record_acceptance(self.model_name, self.drafter_name, self.method,
                                          self.stock_acceptance.measured_k, self.stock_acceptance)
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
                    if e.prediction is None:  # a sandboxed pass, now accepted: predict in-process
                        e.prediction = self.predict(e.candidate)
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
                                                  round_best.candidate.num_draft, round_best.acceptance)
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _deployment_ref(dep) -> str:
    from specc.search.deployments import BUILTIN

    if dep.name in BUILTIN and BUILTIN[dep.name] == dep:
        return dep.name
    if dep.source and Path(dep.source).is_file():
        return dep.source
    return dep.name


# --------------------------------------------------------------------------- choose_pipeline


class MetaPair:
    """A target (+ drafter) built from config.json on the meta device, traced per pipeline.

    ``irs(pipeline, options)`` -> (target verify IR, drafter draft IR or None) after the passes;
    cached per pipeline. No weights: this is how real sizes (Qwen3-8B) are predicted on a laptop.
    """

    def __init__(self, target_config, drafter_config=None, method: str = "ar", dtype: str | None = None):
        from specc.ir import bind_dflash, meta_model

        self.method = method
        self.target = meta_model(target_config, dtype=dtype)
        self.drafter = None
        if drafter_config is not None and method != "ar":
            d = meta_model(drafter_config, dtype=dtype)
            if d.kind == "dflash":
                self.target.model.capture_layers = tuple(d.model.spec.target_layer_ids)
                self.drafter = bind_dflash(self.target.model, d.model)
            else:
                self.drafter = d.model
        self._cache: dict[tuple, tuple] = {}

    def irs(self, pipeline: str = "", options: dict[str, Any] | None = None):
        from specc.ir import trace
        from specc.passes import PassManager

        key = (pipeline, json.dumps(options or {}, sort_keys=True))
        if key not in self._cache:
            t_ir = trace(self.target.model, "verify")
            if pipeline:
                PassManager(pipeline, check=False, options=options or {}).run(t_ir)
            d_ir = None
            if self.drafter is not None:
                d_ir = trace(self.drafter, "draft")
                if pipeline:
                    PassManager(pipeline, check=False, options=options or {}).run(d_ir)
            self._cache[key] = (t_ir, d_ir)
        return self._cache[key]



@dataclasses.dataclass
class Choice:
    """What `specc compile` should use: a pass pipeline (both roles), drafts per step, and the
    prediction that chose them (tokens/s, speedup, step times, the candidates considered)."""

    pipeline: str
    num_draft: int
    prediction: dict[str, Any]


def choose_pipeline(pair, deployment, memory=None, *, num_draft: int | None = None,
                    acceptance: AcceptanceModel | None = None, context: int | None = None) -> Choice:
    """Pick the pipeline and drafts per step for ``pair`` (a ``specc.pairing.Pair``) on
    ``deployment`` (a name, file or Deployment) by predicted tokens/s. Cheap: no compilation,
    no weights; the IRs are traced from config.json on the meta device.

    Candidates: the default pipeline, and every validated single-pipeline configuration in the
    memory (``memory``: a Memory, a path, None for the default location, False for none) of
    this family on this deployment, then on the family's other deployments. Acceptance:
    ``acceptance`` if given, else the memory's record for this pair, else unknown (E = 1 is
    assumed and step times decide; drafts per step then stay at the default unless the memory
    validated another k for this drafter). With a known acceptance and no ``num_draft``, drafts
    per step are swept too.
    """
    from specc.passes import available_passes
    from specc.search.deployments import get_deployment
    from specc.search.memory import Memory, family_of
    from specc.search.proposers import _pipeline_usable

    dep = get_deployment(deployment) if isinstance(deployment, str) else deployment
    method = pair.method
    model_name, drafter_name = pair.target.name, (pair.drafter.name if pair.drafter else "")
    mem = None
    if memory is not False:
        mem = memory if isinstance(memory, Memory) else Memory.open(family_of(pair.target.raw), dep.name, memory)
    k_default = 0 if method == "ar" else (num_draft or default_num_draft(pair))
    options: list[tuple[str, int, str]] = [(default_pipeline(), k_default, "default pipeline")]
    registered = available_passes()
    acc_source = "given"
    if mem is not None:
        for m in [mem] + mem.siblings():
            for e in m.validated(model_name, drafter_name, method):
                cand = Candidate.from_parameters(e.parameters)
                pipe = cand.single_pipeline
                if pipe is None or not _pipeline_usable(pipe, registered):
                    continue
                same = e.drafter == drafter_name and e.method == method
                k = 0 if method == "ar" else (num_draft or (cand.num_draft if same and cand.num_draft else k_default))
                options.append((pipe, k, f"memory ({e.deployment or m.deployment}): {e.mechanism}"))
        if acceptance is None and method != "ar":
            acceptance = mem.find_acceptance(model_name, drafter_name, method)
            for m in mem.siblings() if acceptance is None else []:
                acceptance = m.find_acceptance(model_name, drafter_name, method)
                if acceptance is not None:
                    break
            acc_source = "memory" if acceptance is not None else "unknown"
    if acceptance is None:
        acceptance = AcceptanceModel.none() if method == "ar" else AcceptanceModel([], source="unknown: E = 1 assumed")
        acc_source = "unknown" if method != "ar" else "ar"
    if acc_source in ("given", "memory") and num_draft is None and method != "ar":
        ks = k_choices(pair, k_default)
        options = [(p, k, s) for p, _, s in options for k in ks] + options
    metas = MetaPair(pair.target.raw, pair.drafter.raw if pair.drafter else None, method, dep.dtype)
    cost = CostModel(dep)
    considered = []
    best: tuple[float, str, int, str, SystemPrediction] | None = None
    seen = set()
    for pipe, k, source in options:
        if (pipe, k) in seen:
            continue
        seen.add((pipe, k))
        try:
            t_ir, d_ir = metas.irs(pipe)
        except Exception as exc:
            considered.append({"pipeline": pipe, "num_draft": k, "source": source, "error": _one_line(exc)})
            continue
        pred = cost.predict(t_ir, d_ir, method=method, num_draft=k, acceptance=acceptance, context=context)
        considered.append({"pipeline": pipe, "num_draft": k, "source": source, "tokens_per_s": pred.tokens_per_s,
                           "step_s": pred.step_time})
        if best is None or pred.tokens_per_s > best[0] * (1 + 1e-9):
            best = (pred.tokens_per_s, pipe, k, source, pred)
    if best is None:
        raise UserError(f"no pipeline could be predicted for {model_name} on {dep.name}")
    _, pipe, k, source, pred = best
    prediction = {"tokens_per_s": pred.tokens_per_s, "speedup": pred.speedup, "step_s": pred.step_time,
                  "ar_step_s": pred.ar.time, "ar_tokens_per_s": pred.ar_tokens_per_s,
                  "expected_tokens_per_step": pred.expected_tokens, "deployment": dep.name,
                  "batch_size": pred.batch_size, "context": pred.context, "source": source,
                  "acceptance": acceptance.to_json(), "acceptance_source": acc_source,
                  "gap_report": pred.gap_report().to_json(), "candidates": considered,
                  "memory": str(mem.path) if mem is not None else None}
    return Choice(pipe, k, prediction)


# --------------------------------------------------------------------------- sandbox worker


def _worker(inp: str, out: str) -> int:
    """Evaluate one candidate (possibly with untrusted pass code) and write the verdict as JSON."""
    from specc.verify import StockRun

    job = json.loads(Path(inp).read_text())
    result: dict[str, Any] = {"ok": False}
    try:
        s = Search(job["model"], job["drafter"], method=job["method"], deployment=job["deployment"], memory=False,
                   device=job["device"], dtype=job["dtype"], tolerance=job["tolerance"], context=job.get("context"),
                   runs=[StockRun(**r) for r in job["runs"]],
                   stock_acceptance=AcceptanceModel.from_json(job["acceptance"]), measure=False)
        cand = Candidate.from_parameters(job["candidate"])
        result["stage"] = "passes failed or broke lint"
        for role in s.roles:
            s.real_ir(role, cand)
        result["stage"] = "token forcing failed"
        ev = s.check(Evaluated(cand))
        result.update(forcing=ev.forcing, lowering=ev.lowering, error=ev.error)
        if ev.verified:
            result.update(ok=True, stage="verified", prediction=ev.prediction.to_json(),
                          acceptance=ev.acceptance.to_json() if ev.acceptance else None)
        else:
            result["stage"] = ev.status.replace("rejected: ", "")
    except Exception as exc:
        result["error"] = _one_line(exc)
    Path(out).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover - the sandbox entry point
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3]))
    print("usage: python -m specc.search.driver --worker JOB.json RESULT.json", file=sys.stderr)
    sys.exit(2)
