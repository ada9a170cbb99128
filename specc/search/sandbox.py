"""The sandbox worker: evaluates one candidate (possibly with untrusted pass code) in a subprocess.

    python -m specc.search.sandbox --worker JOB.json RESULT.json

The parent (``Search._check_sandboxed``) writes the job, runs this module with a time limit and
reads the verdict back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from specc.search.acceptance import AcceptanceModel
from specc.search.defaults import one_line as _one_line
from specc.search.driver import Search
from specc.search.evaluated import Evaluated
from specc.search.proposers import Candidate


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
    print("usage: python -m specc.search.sandbox --worker JOB.json RESULT.json", file=sys.stderr)
    sys.exit(2)
