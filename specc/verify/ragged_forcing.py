"""Token forcing through a ragged verify step: stock's tokens, all prompts at once, packed.

Why: the ragged step (an artifact's ``target_ragged`` role, or a model definition called with
``row_slots`` / ``row_starts``) is a separate forward of the target; it is exact only if each row
of a packed block computes what the row computes alone. This check feeds stock's tokens the way a
batch with per-request draft lengths would: every prompt is a row in its own cache slot
(prefilled alone through the dense target step), and each step packs from every unfinished row a
chunk of its own length, cycling through 0 (the row sits the step out but stays in the
descriptor), 1, ..., ``block`` tokens, so rows of different lengths, empty rows and slots that
leave the block as their prompt ends all occur. The argmax after each fed token must be stock's
next token; a mismatch is a numerical tie only where stock's top-2 margin is below the
tolerance (as :func:`specc.verify.forcing.verify_system`).

The steps' decoding state is (re)allocated here for one row per prompt: call it on steps no loop
is using (a freshly loaded engine's, as ``specc compile`` does).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specc.runtime.state import DecodingState, slot_view
from specc.verify.forcing import ForcingReport, Mismatch, StockRun


def _unwrap(step):
    return getattr(step, "step", step)  # a CUDA-graph wrapper runs its step eagerly here


def _setup(target, ragged, rows: int, max_len: int) -> None:
    state = target.setup_caches(rows, max_len)
    if ragged is not target:
        if not isinstance(state, DecodingState):
            state = DecodingState.adopt(target, rows, max_len)
        state.bind(ragged)


@torch.inference_mode()
def force_ragged(target, ragged, runs: Sequence[StockRun], tolerance: float, block: int) -> ForcingReport:
    """Force every run's tokens through ``ragged`` (packed rows, chunks of 0..``block`` tokens),
    prefilling each prompt through ``target``; returns the positions checked, ties and failures."""
    target, ragged = _unwrap(target), _unwrap(ragged)
    report = ForcingReport(tolerance=tolerance, prompts=len(runs))
    if not runs:
        return report
    device = target.device
    block = max(1, int(block))
    max_len = max(len(r.prompt) + len(r.tokens) for r in runs) + block + 1
    _setup(target, ragged, len(runs), max_len)
    lengths = [len(r.prompt) for r in runs]
    fed = [0] * len(runs)  # stock tokens fed to each row so far
    got: list[list[int]] = []
    for slot, run in enumerate(runs):
        ids = torch.tensor([run.prompt], dtype=torch.long, device=device)
        with slot_view(target, slot):
            logits = target(ids, torch.arange(len(run.prompt), device=device)[None],
                            torch.zeros(1, dtype=torch.long, device=device))
        logits = logits[0] if isinstance(logits, tuple) else logits
        got.append([int(logits[0, -1].argmax())])
    step = 0
    while True:
        rows = [r for r, run in enumerate(runs) if fed[r] < len(run.tokens) - 1]
        if not rows:
            break
        chunks = []
        for i, r in enumerate(rows):
            n = (step + i) % (block + 1)
            chunks.append(runs[r].tokens[fed[r]:fed[r] + n][: len(runs[r].tokens) - 1 - fed[r]])
        if not any(chunks):  # every row sits this one out: the next step gives each some tokens
            step += 1
            continue
        ids = torch.tensor([[t for c in chunks for t in c]], dtype=torch.long, device=device)
        positions = torch.tensor([[lengths[r] + j for r, c in zip(rows, chunks) for j in range(len(c))]],
                                 dtype=torch.long, device=device)
        starts = [0]
        for c in chunks:
            starts.append(starts[-1] + len(c))
        as_t = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        logits = ragged(ids, positions, as_t([lengths[r] for r in rows]), row_slots=as_t(rows), row_starts=as_t(starts))
        logits = logits[0] if isinstance(logits, tuple) else logits
        argmax = logits[0].argmax(-1).tolist()
        for r, c, lo in zip(rows, chunks, starts):
            got[r] += argmax[lo:lo + len(c)]
            fed[r] += len(c)
            lengths[r] += len(c)
        step += 1
    for index, run in enumerate(runs):
        report.positions += len(run.tokens)
        for pos, (want, have) in enumerate(zip(run.tokens, got[index])):
            if want != have:
                m = Mismatch(index, pos, want, int(have), float(run.margins[pos]))
                (report.ties if m.margin < tolerance else report.failures).append(m)
    return report
