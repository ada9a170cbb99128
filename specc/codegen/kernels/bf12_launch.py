"""Launch-side state shared by the bf12 kernels (both layouts): the escape table in the form
the in-kernel sparse fix-up reads, and the split-K workspace with its ticket counters."""

from __future__ import annotations

import torch

from specc.formats.bf12 import Packed12

__all__ = ["escape_meta", "split_k_workspace"]


def escape_meta(packed: Packed12) -> dict:
    """The escape table as the kernels read it (CSR row pointers, rows, columns, true values and
    stand-in values in fp32) and the bases, derived once per Packed12 and device, cached on it."""
    key = ("bf12_escapes", str(packed.sm.device))
    meta = packed._cache.get(key)
    if meta is not None:
        return meta
    n, k = packed.rows, packed.cols
    dev = packed.sm.device
    idx = packed.esc_idx.to(torch.int64)
    rows = idx // k
    cols = idx - rows * k
    if packed.base_mode == "row":
        base_e = packed.base.to(torch.int32)[rows]
    else:
        base_e = packed.base.to(torch.int32).expand(rows.shape[0])
    meta = {
        "base": packed.base,
        "stride_base": 1 if packed.base_mode == "row" else 0,
        "num_esc": int(idx.numel()),
        "rowptr": torch.searchsorted(rows, torch.arange(n + 1, device=dev)).to(torch.int32),
        "erow": rows.to(torch.int32),
        "ecol": cols.to(torch.int32),
        "etrue": packed.esc_val.view(torch.bfloat16).to(torch.float32),
        "efake": (base_e << 23).view(torch.float32).contiguous(),
    }
    packed._cache[key] = meta
    return meta


_WORKSPACES: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}


def split_k_workspace(device: torch.device, n_out: int, n_tiles: int, owner: str = "triton"):
    """The per-device fp32 split-K workspace (>= n_out floats) and ticket counters (>= n_tiles,
    zero between calls), grown on demand, one pair per ``owner``: the Triton bf12 kernels add
    into a zeroed workspace and leave it zeroed, the tensor-core kernel
    (:mod:`.linear_bf12_mma`) writes its partials and leaves them, so the two never share one."""
    key = (str(device), owner)
    ws, cnt = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < n_out or cnt.numel() < n_tiles:
        ws = torch.zeros(max(n_out, 1 << 16), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(n_tiles, 1 << 12), dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, cnt)
    return ws, cnt
