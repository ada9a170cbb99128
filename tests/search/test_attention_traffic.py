"""The split-KV attention kernel's terms the cost model prices beyond the IR's bytes."""

from __future__ import annotations

import torch

from specc.codegen.kernels.attention import launch_plan
from specc.search.attention_traffic import PARTIAL_ITEMSIZE, split_kv_traffic

QWEN3_8B_HEADS = (32, 8, 128)


def test_the_plan_is_the_kernels_at_the_profiled_steps():
    """B=16 Q=16 and B=32 Q=8 at context 1024 on 132 SMs: the grids the H200 profile shows
    (docs/benchmarks/linears-h200-run6.json: split grid [128, 4, 1] and [256, 3, 1], merge grid
    [8192]); 4 splits and 3 splits both load 4 slots per merge program. (Run 6 ran the bs1 plan
    rule at every batch: the batched rule came later.)"""
    from specc.codegen.kernels.attention import bs1_plan_rule

    with bs1_plan_rule():
        a = split_kv_traffic(16, 16, *QWEN3_8B_HEADS, 1040, 132)
        b = split_kv_traffic(32, 8, *QWEN3_8B_HEADS, 1032, 132)
    assert (a.splits, a.row_blocks, a.merge_rows, a.merge_slots) == (4, 1, 8192, 4)
    assert (b.splits, b.row_blocks, b.merge_rows, b.merge_slots) == (3, 1, 8192, 4)
    assert a.merge_work == b.merge_work == 8192 * 4
    # partials: written by the split kernel and read by the merge, fp32
    assert a.extra_bytes == 2 * 16 * 16 * 32 * 4 * 128 * PARTIAL_ITEMSIZE
    # B x Q = 256 rows x 4 heads-in-group fill whole 64-row tiles: no padding
    assert a.flops_scale == 1.0 and b.flops_scale == 1.0


def test_terms_follow_the_kernels_launch_plan():
    for batch, q, kv in ((1, 1, 513), (1, 4, 1028), (8, 3, 2051), (32, 64, 1088), (4, 5, 100)):
        plan = launch_plan(batch, q, *QWEN3_8B_HEADS, kv, torch.device("cpu"), sms=132)
        t = split_kv_traffic(batch, q, *QWEN3_8B_HEADS, kv, 132)
        assert (t.splits, t.row_blocks) == (plan["num_splits"], plan["row_blocks"])
        assert t.merge_rows == (batch * q * 32 if plan["num_splits"] > 1 else 0)
        assert t.merge_kernel == (plan["num_splits"] > 1 and not plan["fused_merge"])
        assert (t.extra_bytes > 0) == (plan["num_splits"] > 1)
        assert t.merge_slots >= max(2, t.splits) and t.merge_slots & (t.merge_slots - 1) == 0
        # padded rows: whole block_m tiles of Q x 4 heads-in-group
        assert t.flops_scale == plan["row_blocks"] * plan["block_m"] / (q * 4) >= 1.0


def test_fewer_sms_give_fewer_splits():
    """The plan is made for the deployment's SM count, not the machine the model runs on."""
    big, small = (split_kv_traffic(1, 1, *QWEN3_8B_HEADS, 4096, sms) for sms in (132, 16))
    assert small.splits < big.splits


def test_batched_verify_blocks_take_the_batched_plan():
    """The batched sweep's fastest plans (docs/benchmarks/attention-sweep-batched-h200-run8.json,
    capacity 1152): one split from B = 16 at Q = 16 and at every Q from B = 32, fused merges where
    it splits; a batched decode step (4 query rows per KV head) keeps the bs1 rule."""
    plans = {(b, q): split_kv_traffic(b, q, *QWEN3_8B_HEADS, 1040, 132) for b in (8, 16, 32) for q in (4, 8, 16)}
    assert {k: p.splits for k, p in plans.items()} == {
        (8, 4): 6, (8, 8): 3, (8, 16): 2, (16, 4): 3, (16, 8): 2, (16, 16): 1, (32, 4): 1, (32, 8): 1, (32, 16): 1}
    assert not any(p.merge_kernel for p in plans.values())
    bs1_rule = launch_plan(16, 1, *QWEN3_8B_HEADS, 1040, torch.device("cpu"), sms=132)
    assert bs1_rule["num_splits"] == 5 and not bs1_rule["fused_merge"]
