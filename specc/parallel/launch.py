"""Starting tensor-parallel ranks: the process group, the rank worker and :func:`run_tp`."""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from specc.parallel.jobs import TPJob, TPSpecJob, _run_job, _run_spec_job

# Environment every rank gets before the process group exists. NVLink SHARP (multicast) stays off
# on the lent H200 machines.
RANK_ENV = {"NCCL_NVLS_ENABLE": "0"}
MASTER_ADDR = "127.0.0.1"


def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port free on ``host`` right now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed(rank: int, world_size: int, *, backend: str, port: int, addr: str = MASTER_ADDR,
                     timeout_s: float = 300.0) -> None:
    """Create the default process group (sets MASTER_ADDR/PORT and :data:`RANK_ENV` first)."""
    import torch.distributed as dist

    os.environ.update(RANK_ENV)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _worker(rank: int, world: int, port: int, device_type: str, backend: str, jobs: list, result_path: str,
            threads: int) -> None:
    import torch.distributed as dist

    os.environ.update(RANK_ENV)  # before any NCCL communicator exists
    if threads > 0:
        torch.set_num_threads(threads)
    if device_type == "cuda":  # rank r on cuda:r (gloo may share GPUs: r mod the GPU count)
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    init_distributed(rank, world, backend=backend, port=port)
    try:
        results = [(_run_spec_job if isinstance(job, TPSpecJob) else _run_job)(job, rank, world, device, backend)
                   for job in jobs]
        if rank == 0:
            torch.save(results, result_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_tp(jobs: Sequence[TPJob | TPSpecJob], world_size: int = 2, *, device: str = "cpu", backend: str | None = None,
           port: int | None = None, threads: int | None = None, start_method: str | None = None) -> list:
    """Start ``world_size`` ranks that each run every job (:class:`TPJob`: token forcing and
    timing of the sharded target; :class:`TPSpecJob`: speculative decoding with it); returns
    rank 0's :class:`TPResult` / :class:`TPSpecResult` per job. CPU: gloo, ``threads`` intra-op threads per rank (default: the
    cores shared out). CUDA: NCCL, rank r on cuda:r, NCCL_NVLS_ENABLE=0.

    ``start_method``: "spawn" (a fresh interpreter per rank; required with CUDA) or "fork" (the
    ranks inherit this process's imports: seconds faster, the default for CPU on Linux)."""
    import torch.multiprocessing as mp

    device_type = torch.device(device).type
    if start_method is None:
        start_method = "fork" if device_type == "cpu" and "fork" in mp.get_all_start_methods() else "spawn"
    if start_method == "fork":
        if device_type == "cuda":
            raise ValueError("CUDA ranks must be spawned, not forked")
        import specc.ir  # noqa: F401  imported once here, inherited by the forked ranks
        import specc.models  # noqa: F401
        import specc.passes  # noqa: F401
    backend = backend or default_backend(device_type)
    if device_type == "cuda" and backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeError(f"{world_size} NCCL ranks need {world_size} GPUs, this machine has "
                           f"{torch.cuda.device_count()} (backend='gloo' can put several ranks on one GPU)")
    port = port or free_port()
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size) if device_type == "cpu" else 0
    os.environ.update(RANK_ENV)  # inherited by the ranks
    with tempfile.TemporaryDirectory(prefix="specc-tp-") as tmp:
        result_path = str(Path(tmp) / "results.pt")
        mp.start_processes(_worker, args=(world_size, port, device_type, backend, list(jobs), result_path, threads),
                           nprocs=world_size, join=True, start_method=start_method)
        return torch.load(result_path, weights_only=False)
