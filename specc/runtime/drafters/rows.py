"""Row and position helpers the drafting strategies share: batch positions and cache lengths,
per-row token windows, a drafter step's call (graphed or alone in its slot), and the bookkeeping
of rows that draft in one batched forward or alone."""

from __future__ import annotations

import torch

from specc.runtime.state import slot_view
from specc.runtime.uploads import upload


_COUNTS: dict[torch.device, torch.Tensor] = {}


def counting(end: int, device) -> torch.Tensor:
    """0, 1, 2, ... (at least ``end`` of them, long) on ``device``, made once per device and
    regrown by doubling. Batch-1 positions and cache lengths are views of it (``positions``,
    ``length``): no tensor op per drafting step, whose host work before the drafter's launch the
    GPU waits through at batch 1. Made outside inference mode, so the views serve any caller;
    steps only read their inputs."""
    device = torch.device(device)
    table = _COUNTS.get(device)
    if table is None or table.shape[0] < end:
        with torch.inference_mode(False):
            table = torch.arange(max(end, 2 * (0 if table is None else table.shape[0]), 4096), device=device)
        _COUNTS[device] = table
    return table


def positions(start: int, n: int, device) -> torch.Tensor:
    """[[start, .., start + n - 1]]: a view of ``counting``."""
    return counting(start + n, device)[start:start + n][None]


def length(start: int, device) -> torch.Tensor:
    """[start]: a view of ``counting``."""
    return counting(start + 1, device)[start:start + 1]


def row_positions(starts: list[int], n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, n] (row b: starts[b] ..) and cache_len [B] (= starts) for a batch."""
    if len(starts) == 1:
        return positions(starts[0], n, device), length(starts[0], device)
    return row_positions_at(upload(starts, device), n)


def row_positions_at(cache_len: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``row_positions`` for cache lengths already on the device: one op."""
    return cache_len[:, None] + positions(0, n, cache_len.device), cache_len


def window(seq: torch.Tensor, starts: list[int], m: int) -> torch.Tensor:
    """Row b's tokens seq[b, starts[b] : starts[b] + m] -> [B, m]."""
    if len(set(starts)) == 1:
        return seq[:, starts[0]:starts[0] + m]
    if min(starts) < 0:
        raise RuntimeError(f"a drafting window starts before its sequence (starts {starts})")
    return seq.gather(1, upload(starts, seq.device)[:, None] + positions(0, m, seq.device))


def run_step(step, first: bool, *args):
    """Call a drafter step; its first call after ``reset`` (over the whole prompt, a shape that
    occurs once) bypasses CUDA-graph capture when the step is graphed (``GraphedStep.eager``)."""
    fn = getattr(step, "eager", None) if first else None
    return (fn or step)(*args)


def run_solo(step, slot: int, *args):
    """One row's forward in its own slot (batch-1 views of its cache rows), never graphed."""
    with slot_view(step, slot):
        return run_step(step, True, *args)


def move_entries(values: list, src: list[int], dst: list[int], free) -> None:
    """``values[dst[i]] = values[src[i]]``, then ``values[src[i]] = free`` (slot moves)."""
    moved = [values[a] for a in src]
    for a in src:
        values[a] = free
    for b, value in zip(dst, moved):
        values[b] = value


def rows_of(tensor: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """``tensor`` [B, ...] cut to its first ``rows`` rows or padded with zero rows (free slots)."""
    if tensor is None or tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows]
    return torch.cat([tensor, tensor.new_zeros((rows - tensor.shape[0],) + tuple(tensor.shape[1:]))])


def merge_rows(out: torch.Tensor, rows: dict[int, torch.Tensor]) -> torch.Tensor:
    """``out`` with row b replaced by ``rows[b]`` (out of place: ``out`` may be a graph's buffer)."""
    if not rows:
        return out
    index = upload(list(rows), out.device)
    return out.index_put((index,), torch.cat(list(rows.values()), dim=0))


def split_rows(lags: list[int], history: list[int], active: list[bool] | None,
               max_lag: int) -> tuple[int, list[int]]:
    """(m, solo rows): the rows that join one batched forward feed ``m`` trailing entries each
    (the largest lag among them); a row drafts alone when it lags by more than ``max_lag`` (it
    has just joined: its first draft reads its whole prompt) unless every active row is in the
    same position (a batch that started together), or when it has fewer than ``m - lag``
    entries before its new ones to re-feed. Inactive rows never draft alone."""
    act = [b for b in range(len(lags)) if active is None or active[b]]
    if not act:
        return 1, []
    if len({lags[b] for b in act}) == 1:  # every row alike (e.g. a batch that started together)
        return lags[act[0]], []
    solo = [b for b in act if lags[b] > max_lag]
    rest = [b for b in act if lags[b] <= max_lag]
    while rest:
        m = max(lags[b] for b in rest)
        short = [b for b in rest if history[b] < m - lags[b]]
        if not short:
            return m, solo
        solo += short
        rest = [b for b in rest if b not in short]
    return 1, solo

