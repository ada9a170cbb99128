"""Confining a subprocess of specc (the sandbox worker and the parent's verifier, sandbox.py).

``run_confined(args, workdir, timeout)`` runs ``python -m specc.search.sandbox ARGS`` with a
scrubbed environment (PATH, HOME and TMPDIR in a private temporary directory, PYTHONPATH to specc;
no API keys or tokens), ``resource`` limits (address space, CPU seconds, file size, processes),
that private directory as working directory, stdin closed, a new session (killed as a group
afterwards) and, where the OS allows, a new network namespace (``unshare(CLONE_NEWNET)``; checked
from the parent through ``/proc/<pid>/ns/net``). Where it is not available the record says
``"network": "not isolated (<reason>)"``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

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
