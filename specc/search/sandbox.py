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

Confinement (:func:`run_confined`): a scrubbed environment (PATH, HOME and TMPDIR in a private
temporary directory, PYTHONPATH to specc; no API keys or tokens), ``resource`` limits (address
space, CPU seconds, file size, processes), that private directory as working directory, stdin
closed, a new session (killed as a group afterwards) and, where the OS allows, a new network
namespace (``unshare(CLONE_NEWNET)``; checked from the parent through ``/proc/<pid>/ns/net``).
Where it is not available the record says ``"network": "not isolated (<reason>)"``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000

#: resource limits of a confined process (soft = hard); address space is generous: torch maps a lot
LIMITS = {"as_bytes": 16 << 30, "cpu_s": 600, "fsize_bytes": 4 << 30, "nproc_extra": 512}

_KEEP_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")


def specc_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def scrubbed_env(home: Path) -> dict[str, str]:
    """Only what Python needs: PATH, a private HOME/TMPDIR, PYTHONPATH to specc (and, when the
    parent runs in a virtual environment, nothing else: sys.executable finds its own packages)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home),
           "PYTHONPATH": specc_root(), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TRITON_CACHE_DIR": str(home / "triton")}
    for k in _KEEP_ENV:
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):
        os.unshare(flags)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _user_processes() -> int:
    uid, n = os.getuid(), 0
    try:
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    if os.stat(f"/proc/{p}").st_uid == uid:
                        n += len(os.listdir(f"/proc/{p}/task"))
                except OSError:
                    continue
    except OSError:
        return 4096
    return n


def _preexec(limits: dict[str, int], nproc: int):
    def setup():  # runs in the child between fork and exec
        os.setsid()
        for res, value in ((resource.RLIMIT_AS, limits["as_bytes"]), (resource.RLIMIT_CPU, limits["cpu_s"]),
                           (resource.RLIMIT_FSIZE, limits["fsize_bytes"]), (resource.RLIMIT_NPROC, nproc),
                           (resource.RLIMIT_CORE, 0)):
            try:
                soft, hard = resource.getrlimit(res)
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(res, (value, value))
            except (ValueError, OSError):
                pass
        try:
            _unshare(CLONE_NEWNET)
        except OSError:
            try:
                _unshare(CLONE_NEWUSER | CLONE_NEWNET)
            except OSError:
                pass  # the parent sees it in /proc/<pid>/ns/net and records why
    return setup


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _kill_netns(ns: str | None) -> None:
    if not ns:
        return
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid() and _netns(p) == ns:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _network_reason() -> str:
    if not sys.platform.startswith("linux"):
        return f"no network namespaces on {sys.platform}"
    try:
        pid = os.fork()
    except OSError as exc:
        return f"cannot probe: {exc.strerror}"
    if pid == 0:  # pragma: no cover - the probe child
        code = 0
        try:
            _unshare(CLONE_NEWNET)
        except OSError as exc:
            code = exc.errno or 1
            try:
                _unshare(CLONE_NEWUSER | CLONE_NEWNET)
                code = 0
            except OSError:
                pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return f"unshare(CLONE_NEWNET) refused: {os.strerror(code)}" if code else "unshare refused"


def run_confined(args: list[str], workdir: Path, timeout: float, limits: dict[str, int] | None = None):
    """Run ``python -m specc.search.sandbox ARGS`` confined (see the module docstring).

    Returns ``(returncode or None on timeout, stderr tail, network)``; ``network`` is "isolated" or
    "not isolated (reason)"."""
    limits = dict(LIMITS, **(limits or {}))
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    nproc = _user_processes() + limits["nproc_extra"]
    err_path = workdir / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "specc.search.sandbox", *args], cwd=str(workdir),
                                env=scrubbed_env(home), stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                preexec_fn=_preexec(limits, nproc), close_fds=True)
        child_ns, own_ns = _netns(proc.pid), _netns("self")
        if child_ns is not None and own_ns is not None and child_ns != own_ns:
            network = "isolated"
        elif child_ns is None or own_ns is None:
            network = "not isolated (cannot read /proc/<pid>/ns/net)"
        else:
            network = f"not isolated ({_network_reason()})"
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # and whatever it left running
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if network == "isolated":  # anything left in its private network namespace is its offspring
                _kill_netns(child_ns)
    lines = err_path.read_text(errors="replace").strip().splitlines()
    return rc, (lines[-1] if lines else ""), network


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
