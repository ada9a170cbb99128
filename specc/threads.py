"""CPU thread count: the one place specc chooses how many intra-op threads torch uses on CPU.

torch's own default is one thread per logical core. On a small shared machine that is the worst
choice: with 2 cores and another process busy, two threads stall on each other at every op and a
CPU decode ran ~10x slower than with one thread. specc's default is

    SPECC_THREADS if set, else min(physical cores available, 4, cores left idle by other processes)

(never below 1); "cores left idle" is the physical core count minus the 1-minute load average,
rounded. The CLI applies it for CPU work (`--threads N` overrides, on every subcommand);
``specc.load`` applies it when the engine runs on CPU (``threads=`` overrides; ``threads=0``
leaves torch's setting alone). Small decode steps gain little past 4 threads.
"""

from __future__ import annotations

import os

ENV = "SPECC_THREADS"
MAX_DEFAULT = 4


def physical_cores() -> int:
    """Physical cores this process may run on (hyperthread siblings counted once)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))
    try:
        cores, cpu, phys = set(), None, "0"
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    cpu, phys = int(value), "0"
                elif key == "physical id":
                    phys = value
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, value))
        if cores:
            return min(len(cores), len(allowed))
    except (OSError, ValueError):
        pass
    return max(1, len(allowed))


def _from_env() -> int | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        from specc.errors import UserError

        raise UserError(f"{ENV} must be a positive integer (got {raw!r})") from None
    if n < 1:
        from specc.errors import UserError

        raise UserError(f"{ENV} must be >= 1 (got {n})")
    return n


def default_threads() -> int:
    """SPECC_THREADS, else min(physical cores, 4, idle physical cores), at least 1."""
    env = _from_env()
    if env is not None:
        return env
    cores = physical_cores()
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    idle = int(cores - busy + 0.5)
    return max(1, min(cores, MAX_DEFAULT, idle))


def configure_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count: ``threads`` if given (>= 1), else :func:`default_threads`.
    Returns the count in use."""
    import torch

    if threads is not None and threads < 1:
        from specc.errors import UserError

        raise UserError(f"--threads must be >= 1 (got {threads})")
    n = threads if threads is not None else default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
