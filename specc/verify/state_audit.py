"""Where a target's recurrent state first departs from a reference: per forced block, per buffer.

Why: token forcing says *that* a system's argmax differs from stock's. In a hybrid target (gated
DeltaNet layers) a wrong value usually starts as a wrong recurrent state or conv window in one
layer at one verify block and is carried from there into every later block, so the first place
two systems' states differ says where to look (a kernel, a commit, the CUDA-graph protocol).

:func:`block_states` forces tokens through a loop (``DeviceSpeculativeDecoder.forced_argmax``)
and records, after the prefill and after every committed verify block, each snapshot-kind state
buffer's live entry (``recurrent`` and ``conv``: ``specc.runtime.state.SnapshotState``; the
other kinds are left out) and the block's logits, in fp32. Buffer names are made comparable
across a model definition (``layers.0.linear_attn.recurrent_state``) and a compiled step
(``layers_0_linear_attn_recurrent_state``). :func:`compare_blocks` gives, per block and buffer,
the largest absolute difference relative to the reference's largest magnitude, and the first
(block, buffer) over a tolerance; :func:`divergence_line` says it in one line.
"""

from __future__ import annotations

import torch

from specc.runtime.state import STATE_KINDS, SnapshotState

__all__ = ["block_states", "compare_blocks", "divergence_line"]

LOGITS = "logits"


def _canonical(name: str) -> str:
    return name.replace(".", "_")


def block_states(loop, prompt, tokens) -> list[dict[str, torch.Tensor]]:
    """Force ``tokens`` after ``prompt`` through ``loop`` (a ``DeviceSpeculativeDecoder``);
    one record per block (index 0: the prefill): ``{"logits": [Q, V], buffer: live entry}``,
    fp32 copies on the loop's device."""
    records: list[dict[str, torch.Tensor]] = []

    def keep(logits):
        state = loop.state
        rec = {LOGITS: logits[0].float().clone()}
        for spec in state.specs:
            if isinstance(STATE_KINDS.get(spec.kind), SnapshotState):
                rec[_canonical(spec.name)] = state.buffers[spec.name][0, 0].float().clone()
        records.append(rec)

    loop.forced_argmax(prompt, tokens, on_block=keep)
    return records


def compare_blocks(got: list[dict], ref: list[dict], tolerance: float) -> dict:
    """Per block, per buffer both records hold (state buffers in their order, then the logits):
    max |got - ref| / max |ref| (0 when both are zero). ``first``: the first (block, buffer)
    above ``tolerance``, or None."""
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} blocks against {len(ref)}: force the same tokens through both")
    blocks, first = [], None
    for index, (a, b) in enumerate(zip(got, ref)):
        names = [n for n in b if n in a and n != LOGITS] + [LOGITS]
        row = {}
        for name in names:
            x, y = a[name].to(b[name].device), b[name]
            if x.shape != y.shape:
                raise ValueError(f"block {index}: {name} is {tuple(x.shape)} against {tuple(y.shape)}")
            scale = float(y.abs().max()) if y.numel() else 0.0
            diff = float((x - y).abs().max()) if y.numel() else 0.0
            row[name] = diff / scale if scale > 0 else diff
            if first is None and row[name] > tolerance:
                first = {"block": index, "buffer": name, "relative": row[name]}
        blocks.append(row)
    return {"tolerance": tolerance, "blocks": blocks, "first": first}


def divergence_line(label: str, comparison: dict) -> str:
    """One line: where ``label``'s comparison first goes over its tolerance (block 0 is the
    prefill), and its largest relative difference per block."""
    worst = ", ".join(f"{max(row.values()):.2g}" for row in comparison["blocks"])
    first = comparison["first"]
    where = ("no divergence" if first is None else
             f"first divergence at block {first['block']} in {first['buffer']} ({first['relative']:.3g})")
    return f"{label}: {where} above {comparison['tolerance']:g}; largest per block: {worst}"
