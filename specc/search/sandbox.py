"""The sandbox for untrusted (e.g. LLM-written) pass code, and the parent's own verifier.

Two entry points, each run in its own confined subprocess (:func:`run_confined`):

    python -m specc.search.sandbox --worker JOB.json OUTDIR   # untrusted: runs the candidate's passes
    python -m specc.search.sandbox --verify JOB.json RESULT   # trusted: never imports pass code

The **worker** imports the candidate's pass code, builds each role (trace, passes, lint, lower,
emit) and writes only what emission produced into its private directory: ``<role>.py`` (the step
module's source), ``<role>.json`` (class name, cache specs, inputs) and ``<role>.safetensors``
(weights), plus an advisory cost-model prediction. It returns no verdict: nothing it writes is
believed except as data.

The parent (``Search._check_sandboxed``) copies those files out, refuses any module whose source
references anything beyond the kernel ABI (:mod:`specc.search.emitted_check`), and runs the
**verifier**: a fresh process of specc's own code that executes the emitted modules only (as an
artifact's are executed, :func:`specc.runtime.compiled.exec_step_module`) and token-forces them
against the stock runs the parent holds. Its report is the verdict.

Confinement (:func:`specc.search.confine.run_confined`): a scrubbed environment (PATH, HOME and TMPDIR in a private
temporary directory, PYTHONPATH to specc; no API keys or tokens), ``resource`` limits (address
space, CPU seconds, file size, processes), that private directory as working directory, stdin
closed, a new session (killed as a group afterwards) and, where the OS allows, a new network
namespace (``unshare(CLONE_NEWNET)``; checked from the parent through ``/proc/<pid>/ns/net``).
Where it is not available the record says ``"network": "not isolated (<reason>)"``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


# ---------------------------------------------------------------------- the untrusted worker


def _worker(inp: str, outdir: str) -> int:
    """Build the candidate's steps (runs its pass code) and write what emission produced."""
    from safetensors.torch import save_file

    from specc.search.acceptance import AcceptanceModel
    from specc.search.driver import Search
    from specc.search.proposers import Candidate
    from specc.verify import StockRun

    job = json.loads(Path(inp).read_text())
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    s = Search(job["model"], job["drafter"], method=job["method"], deployment=job["deployment"], memory=False,
               device=job["device"], dtype=job["dtype"], tolerance=job["tolerance"], context=job.get("context"),
               runs=[StockRun(**r) for r in job["runs"]],
               stock_acceptance=AcceptanceModel.from_json(job["acceptance"]), measure=False)
    cand = Candidate.from_parameters(job["candidate"])
    info: dict[str, Any] = {}
    for role in s.roles:
        _, emitted, lowering = s.real_ir(role, cand)
        (out / f"{role}.py").write_text(emitted.source)
        save_file({k: v.detach().contiguous().cpu() for k, v in emitted.weights.items()}, str(out / f"{role}.safetensors"))
        (out / f"{role}.json").write_text(json.dumps({"class_name": emitted.class_name, "caches": emitted.caches,
                                                      "inputs": emitted.inputs}, default=str))
        info.setdefault("lowering", {})[role] = lowering
    try:
        info["prediction"] = s.predict(cand).to_json()
    except Exception as exc:  # advisory only
        info["prediction_error"] = f"{type(exc).__name__}: {exc}"
    (out / "info.json").write_text(json.dumps(info, default=str))
    return 0


# ---------------------------------------------------------------------- the parent's verifier


def load_emitted(directory: Path, role: str, unique: str, device: str, dtype: str):
    """A step from emitted files: exec the module's bytes (no pass code), bind its weights."""
    from safetensors.torch import load_file

    from specc.runtime.compiled import exec_step_module

    meta = json.loads((directory / f"{role}.json").read_text())
    source = (directory / f"{role}.py").read_bytes()
    cls = exec_step_module(source, f"{role}.py", meta["class_name"], unique)
    weights = load_file(str(directory / f"{role}.safetensors"), device=device)
    return cls, weights, meta["caches"]


def _verify(inp: str, out: str) -> int:
    """Token-force emitted modules against the stock runs of the job; write the report."""
    from specc.models.dflash import DFlashSpec
    from specc.pairing import resolve_pair
    from specc.runtime.eager import EagerSpeculativeDecoder
    from specc.search.evaluated import _Recorder
    from specc.verify import StockRun, verify_system

    job = json.loads(Path(inp).read_text())
    directory = Path(job["emitted"])
    spec = DFlashSpec(**{**job["spec"], "target_layer_ids": tuple(job["spec"]["target_layer_ids"])}) \
        if job.get("spec") else None
    cls, weights, caches = load_emitted(directory, "target", "verify_t", job["device"], job["dtype"])
    t_step = cls()
    t_step.bind(weights, caches, spec)
    drafter = None
    if job["drafter_role"]:
        pair = resolve_pair(job["model"], job["drafter"], job["method"])
        dcls, dweights, dcaches = load_emitted(directory, "drafter", "verify_d", job["device"], job["dtype"])
        d_step = dcls()
        d_step.bind(dweights, dcaches, spec)
        drafter = pair.impl.drafter_for(d_step, pair)
    runs = [StockRun(**r) for r in job["runs"]]
    max_len = max(len(r.prompt) + len(r.tokens) for r in runs) + 2
    rec = _Recorder(EagerSpeculativeDecoder(t_step, drafter, job["num_draft"], max_len))
    report = verify_system(rec, runs, job["tolerance"], tuple(job["eos"]))
    Path(out).write_text(json.dumps({"passed": bool(report.passed), "summary": report.summary(),
                                     "forcing": report.to_json(), "lengths": rec.lengths}, default=str))
    return 0


def main(argv: list[str]) -> int:  # pragma: no cover - the subprocess entry point
    if len(argv) == 3 and argv[0] == "--worker":
        return _worker(argv[1], argv[2])
    if len(argv) == 3 and argv[0] == "--verify":
        return _verify(argv[1], argv[2])
    print("usage: python -m specc.search.sandbox --worker JOB.json OUTDIR | --verify JOB.json RESULT.json",
          file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
