"""Checking a search candidate: compile it in memory and token-force it against stock.

Functions of a :class:`specc.search.driver.Search` (``self``), bound as its methods there.
Untrusted (sandboxed) pass code is checked in a subprocess: ``python -m specc.search.sandbox``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
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
            proc = subprocess.run([sys.executable, "-m", "specc.search.sandbox", "--worker", str(inp), str(out)],
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


def _deployment_ref(dep) -> str:
    from specc.search.deployments import BUILTIN

    if dep.name in BUILTIN and BUILTIN[dep.name] == dep:
        return dep.name
    if dep.source and Path(dep.source).is_file():
        return dep.source
    return dep.name
