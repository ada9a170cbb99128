"""Host values to device tensors without a device sync.

Why: ``torch.tensor(values, device="cuda")`` and ``cpu_tensor.to("cuda")`` are blocking copies:
PyTorch queues the copy from pageable memory and then waits for the stream to drain
(``cudaMemcpyAsync`` + ``cudaStreamSynchronize``). In the middle of a speculative step that is a
host sync: the host waits for everything queued so far (a drafter graph, a verify) before it
can queue the next work, so the GPU idles through the host's glue. A copy from pinned memory
with ``non_blocking=True`` is queued on the stream like a kernel; PyTorch's caching host
allocator keeps the pinned block until the copy has run.
"""

from __future__ import annotations

import torch

__all__ = ["upload"]


def upload(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``values`` (a list of numbers, or nested lists) as a tensor on ``device``, queued on the
    current stream without waiting for it (pinned + non-blocking on CUDA)."""
    device = torch.device(device)
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda").to(device, non_blocking=True)
