"""What the split-KV attention kernel does beyond the IR's bytes, for the cost model and its fit.

The IR prices attention by its logical traffic: the K/V cache read once, the new K/V written, q
and the output (``specc.ir.rules.attention_cost``). The kernel that runs it on CUDA
(``specc.codegen.kernels.attention``, flash-decoding) does more at many query rows x batch:

- with ``num_splits > 1`` every split writes an fp32 partial output (and its log-sum-exp) per
  query row and head, and a second kernel (the merge) reads them back:
  ``2 x B x Q x Hq x splits x D x 4`` bytes;
- the merge kernel runs one small program per (row, query, head), ``B x Q x Hq`` of them, each
  a few dependent loads of ``BLOCK_S`` split slots (the next power of two >= splits): it is
  latency-bound, so its time grows with programs x slots, not with the partial bytes (from 256
  query rows per KV head the last split program of each row block merges instead, the same
  work inside the split kernel) (the H200
  profile of a Qwen3-8B step, docs/benchmarks/linears-h200-run6.json: ~24 us per layer for
  8192 programs at both 3 and 4 splits, i.e. 4 slots each);
- the tensor-core work is done on whole row tiles: a row block of ``block_m`` rows (query x
  head-in-group) costs the same however many of them are real (``flops_scale``).

:func:`split_kv_traffic` reads the kernel's own launch plan (``launch_plan`` at the deployment's
SM count), so the price follows the kernel's heuristics as they change. The calibration fits the
time per merge slot (``merge_slot_s``) with the attention line (specc.search.calibrate.fit).
"""

from __future__ import annotations

import dataclasses

PARTIAL_ITEMSIZE = 4  # the split kernel's partial outputs are fp32
PRICED_KINDS = ("attention", "rope_attention")  # the kinds that run kernels.attention's split kernel


def heads_key(num_heads: int, num_kv_heads: int, head_dim: int) -> str:
    """The key of a head layout in ``Calibration.attention_by_heads`` ("Hq/Hkv/d")."""
    return f"{int(num_heads)}/{int(num_kv_heads)}/{int(head_dim)}"


@dataclasses.dataclass(frozen=True)
class AttentionTraffic:
    """The kernel-level terms of one attention call (see the module docstring)."""

    splits: int
    row_blocks: int
    extra_bytes: float  # fp32 partials written by the split kernel and read by the merge
    merge_rows: int  # (row, query, head) outputs merged from the splits (0: one split, no merge)
    merge_kernel: bool  # the merge runs as a second kernel (else fused in the split kernel)
    merge_slots: int  # split slots each merge program loads (the kernel's BLOCK_S)
    flops_scale: float  # padded row tiles / real rows (>= 1)

    @property
    def merge_work(self) -> int:
        """Merge programs x slots: what the calibrated ``merge_slot_s`` multiplies."""
        return self.merge_rows * self.merge_slots


class _PlanDevice:
    """What ``launch_plan`` asks of a device when ``sms`` is given: only its type."""

    type = "cpu"
    index = None


def split_kv_traffic(batch: int, num_q: int, num_heads: int, num_kv_heads: int, head_dim: int,
                     kv_len: int, sm_count: int) -> AttentionTraffic:
    """The split-KV kernel's extra traffic and merge work for ``batch`` rows of ``num_q`` queries
    over ``kv_len`` keys, planned as the kernel plans it on ``sm_count`` SMs."""
    from specc.codegen.kernels.attention import launch_plan  # imports triton: only when priced

    batch, num_q, kv_len = max(int(batch), 1), max(int(num_q), 1), max(int(kv_len), 1)
    plan = launch_plan(batch, num_q, num_heads, num_kv_heads, head_dim, kv_len, _PlanDevice(),
                       sms=max(int(sm_count), 1))
    splits, row_blocks, block_m = int(plan["num_splits"]), int(plan["row_blocks"]), int(plan["block_m"])
    rows = num_q * (num_heads // num_kv_heads)
    extra = 2.0 * batch * num_q * num_heads * splits * head_dim * PARTIAL_ITEMSIZE if splits > 1 else 0.0
    # the merge runs per (row, query, head) whether in its own kernel or, from 256 rows per KV
    # head up (``fused_merge``), in the last split program of each row block to finish
    merge_rows = batch * num_q * num_heads if splits > 1 else 0
    slots = max(2, 1 << (splits - 1).bit_length())
    return AttentionTraffic(splits, row_blocks, extra, merge_rows, merge_rows > 0 and not plan["fused_merge"], slots,
                            row_blocks * block_m / max(rows, 1))
