"""Checking a search candidate: compile it in memory and token-force it against stock.

Functions of a :class:`specc.search.driver.Search` (``self``), bound as its methods there.
Untrusted (sandboxed) pass code is checked in a subprocess: ``python -m specc.search.sandbox``.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from specc.search.acceptance import AcceptanceModel
from specc.search.defaults import one_line as _one_line
from specc.search.evaluated import Evaluated, _Recorder
from specc.search.proposers import Candidate


def system(self, cand: Candidate):
    """The compiled system of a candidate (in memory), ready for token forcing."""
    from specc.runtime.compiled import instantiate
    from specc.runtime.eager import EagerSpeculativeDecoder

    self._load_models()
    _, t_emitted, _ = self.real_ir("target", cand)
    t_step = instantiate(t_emitted)
    drafter = None
    if "drafter" in self.roles:
        _, d_emitted, _ = self.real_ir("drafter", cand)
        d_step = instantiate(d_emitted, self.spec)
        drafter = self.pair.impl.drafter_for(d_step, self.pair)
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
    if cand.num_draft and self.pair.impl.uses_drafter:
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
    """Untrusted pass code: the passes run in a confined worker that only emits step modules; this
    process refuses modules beyond the kernel ABI and token-forces them in a confined verifier of
    its own that never imports the candidate's code. Nothing the worker says is a verdict."""
    import shutil

    from specc.search.emitted_check import EmittedCodeError, check_emitted_source
    from specc.search.confine import run_confined

    cand = ev.candidate
    job = {"model": str(self.pair.target.path), "drafter": str(self.pair.drafter.path) if self.pair.drafter else None,
           "method": self.method, "deployment": _deployment_ref(self.deployment), "device": self.device,
           "dtype": str(self.dtype).replace("torch.", ""), "tolerance": self.tolerance, "context": self.context,
           "candidate": cand.parameters(),
           "runs": [dataclasses.asdict(r) for r in self.runs],
           "acceptance": self.acceptance_for(cand).to_json()}
    with tempfile.TemporaryDirectory(prefix="specc-sandbox-") as wtmp:
        wdir = Path(wtmp)
        (wdir / "job.json").write_text(json.dumps(job))
        rc, tail, network = run_confined(["--worker", "job.json", "out"], wdir, self.sandbox_timeout)
        ev.sandbox = {"network": network}
        if rc is None:
            ev.verified, ev.status, ev.error = False, "rejected: timed out", f"sandbox exceeded {self.sandbox_timeout:g} s"
            return ev
        # copy out only the expected files, as data, into a directory made after the worker is gone;
        # the worker's own claims are never read as a verdict
        with tempfile.TemporaryDirectory(prefix="specc-verify-") as vtmp:
            vdir = Path(vtmp)
            emitted = vdir / "emitted"
            emitted.mkdir()
            try:
                for role in self.roles:
                    for ext in ("py", "json", "safetensors"):
                        src = wdir / "out" / f"{role}.{ext}"
                        if src.is_symlink() or not src.is_file():
                            raise FileNotFoundError(f"{role}.{ext}")
                        shutil.copyfile(src, emitted / f"{role}.{ext}")
                info_path = wdir / "out" / "info.json"
                info = json.loads(info_path.read_text()) if info_path.is_file() and not info_path.is_symlink() else {}
            except (OSError, ValueError) as exc:
                ev.verified, ev.status = False, "rejected: passes failed or broke lint"
                ev.error = tail or f"the sandbox produced no emitted step ({_one_line(exc)})"
                return ev
            try:
                for role in self.roles:
                    meta = json.loads((emitted / f"{role}.json").read_text())
                    if not isinstance(meta, dict) or not isinstance(meta.get("class_name"), str) \
                            or not meta["class_name"].isidentifier() or not isinstance(meta.get("caches"), dict):
                        raise EmittedCodeError(f"{role}.json: not an emitted step description")
                    check_emitted_source((emitted / f"{role}.py").read_text(), meta["class_name"], f"{role}.py")
            except (EmittedCodeError, ValueError, OSError) as exc:
                ev.verified, ev.status, ev.error = False, "rejected: emitted code beyond the kernel ABI", _one_line(exc)
                return ev
            vjob = {"emitted": str(emitted), "model": job["model"], "drafter": job["drafter"], "method": self.method,
                    "drafter_role": "drafter" in self.roles, "device": self.device, "dtype": job["dtype"],
                    "num_draft": cand.num_draft, "tolerance": self.tolerance, "runs": job["runs"],
                    "eos": list(self.pair.eos_token_ids or ()),
                    "spec": dataclasses.asdict(self.spec) if self.spec is not None else None}
            (vdir / "job.json").write_text(json.dumps(vjob))
            rc, vtail, _ = run_confined(["--verify", "job.json", "result.json"], vdir, self.sandbox_timeout)
            result_path = vdir / "result.json"
            if rc is None:
                ev.verified, ev.status, ev.error = False, "rejected: timed out", f"token forcing exceeded {self.sandbox_timeout:g} s"
                return ev
            if rc != 0 or not result_path.is_file():
                ev.verified, ev.status, ev.error = False, "rejected: crashed under token forcing", vtail or "no output"
                return ev
            res = json.loads(result_path.read_text())
    ev.lowering = info.get("lowering") if isinstance(info.get("lowering"), dict) else None
    ev.forcing = res["forcing"]
    if not res["passed"]:
        ev.verified, ev.status, ev.error = False, "rejected: token forcing failed", res["summary"]
        return ev
    from specc.search.memory import pass_sources

    now = pass_sources(cand.passes.values())
    changed = [ref for ref, pinned in cand.sources.items() if now.get(ref, pinned) != pinned]
    if changed:  # e.g. the worker rewrote its own pass file: what passed is not what was proposed
        ev.verified, ev.status = False, "rejected: pass source changed while it was checked"
        ev.error = f"{changed[0]}: the source differs from the one proposed"
        return ev
    ev.verified, ev.status = True, "verified (sandbox)"
    pred = info.get("prediction")
    # advisory: the cost model ran next to the untrusted pass; it ranks, it does not verify
    ev.prediction_json = pred if isinstance(pred, dict) and _finite(pred.get("tokens_per_s")) else {"tokens_per_s": 0.0}
    if cand.num_draft and self.pair.impl.uses_drafter and res.get("lengths"):
        acc = AcceptanceModel.from_accepted_lengths(
            res["lengths"], cand.num_draft, source=f"compiled system k={cand.num_draft} (sandboxed pass), free "
                                                   f"decoding of {len(res['lengths'])} calibration prompts")
        self._acceptance[cand.key()] = acc
        ev.acceptance = acc
    # no GPU timing in this process: that would run the candidate's pass code here
    return ev


def _finite(x) -> bool:
    import math

    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _deployment_ref(dep) -> str:
    from specc.search.deployments import BUILTIN

    if dep.name in BUILTIN and BUILTIN[dep.name] == dep:
        return dep.name
    if dep.source and Path(dep.source).is_file():
        return dep.source
    return dep.name
