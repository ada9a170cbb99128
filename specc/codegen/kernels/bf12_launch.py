"""Launch-side pieces shared by the Triton bf12 kernels (both layouts): the escape table in the
form the in-kernel sparse fix-up reads, the split-K workspace with its ticket counters, the rows
buckets their config tables are keyed by, and the checks every launch config passes."""

from __future__ import annotations

import torch

from specc.codegen.kernels._common import bucket_of
from specc.formats.bf12 import Packed12

__all__ = ["M_BUCKETS", "check_config", "escape_meta", "m_bucket", "split_k_workspace"]

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def m_bucket(m: int) -> int:
    """The config bucket of a batch of M rows: the smallest of M_BUCKETS >= M (64 above)."""
    return bucket_of(m, M_BUCKETS)


def check_config(cfg, powers_of_two: tuple[str, ...]) -> None:
    """The constraints every bf12 launch config shares (``cfg`` a frozen dataclass with ``kind``,
    ``block_m``, ``block_n``, ``split_k``, ``num_stages``): ``kind`` "fma" (``block_m`` 1, 2
    or 4) or "dot" (``block_m``, ``block_n`` >= 16), the named fields powers of two, split-K and
    stages at least 1. Raises ValueError naming the config class."""
    name = type(cfg).__name__
    if cfg.kind not in ("fma", "dot"):
        raise ValueError(f"{name}.kind must be 'fma' or 'dot', got {cfg.kind!r}")
    for field in powers_of_two:
        v = getattr(cfg, field)
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name}.{field} must be a power of two, got {v}")
    if cfg.kind == "dot" and min(cfg.block_m, cfg.block_n) < 16:
        raise ValueError(f"{name}(kind='dot') needs block_m, block_n >= 16")
    if cfg.kind == "fma" and cfg.block_m > 4:
        raise ValueError(f"{name}(kind='fma') supports block_m in (1, 2, 4)")
    if cfg.split_k < 1 or cfg.num_stages < 1:
        raise ValueError(f"{name}.split_k and num_stages must be >= 1")


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
# Workspaces a larger one replaced: kept alive, because a CUDA graph captured while one was
# current replays with its address (freed, the allocator could hand the memory to other tensors)
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def split_k_workspace(device: torch.device, n_out: int, n_tiles: int, owner: str = "triton"):
    """The per-device fp32 split-K workspace (>= n_out floats) and ticket counters (>= n_tiles,
    zero between calls), grown on demand, one pair per ``owner``: the Triton bf12 kernels add
    into a zeroed workspace and leave it zeroed, the tensor-core kernel
    (:mod:`.linear_bf12_mma`) writes its partials and leaves them, so the two never share one.
    A pair that is outgrown stays allocated (graphs captured with it keep working)."""
    key = (str(device), owner)
    ws, cnt = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < n_out or cnt.numel() < n_tiles:
        if ws is not None:
            _RETIRED.append((ws, cnt))
        ws = torch.zeros(max(n_out, 1 << 16), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(n_tiles, 1 << 12), dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, cnt)
    return ws, cnt
