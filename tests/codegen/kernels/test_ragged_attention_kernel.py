"""ragged_attention: the packed-rows Triton kernels against ``ops.ragged_attention`` (outputs and
cache contents), in fp32 and fp16, over row mixes with empty rows, one-token rows, long caches
split across programs, GQA ratios 1/2/4 and head dims 64/128."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import ragged_attention as RA
from specc.models import ops


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _setup(dev, counts, slots, lens, hq, hkv, d, cap, dtype, seed=0, num_slots=None):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(dev)  # noqa: E731
    total = sum(counts)
    num_slots = num_slots or max(slots) + 1
    q, k, v = mk(1, total, hq, d), mk(1, total, hkv, d), mk(1, total, hkv, d)
    cache_k, cache_v = mk(num_slots, hkv, cap, d), mk(num_slots, hkv, cap, d)
    starts = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), device=dev)
    return (q, k, v, cache_k, cache_v, torch.tensor(lens, device=dev), torch.tensor(slots, device=dev), starts)


# counts (tokens per row), slots, cache lengths, Hq, Hkv, D, cache capacity, splits
CASES = {
    "mixed-gqa2": ([3, 0, 1, 5], [2, 0, 3, 1], [4, 7, 0, 9], 4, 2, 64, 24, None),
    "one-token-rows-gqa1": ([1, 1, 1], [0, 2, 1], [10, 0, 31], 2, 2, 64, 40, 3),
    "long-cache-split-gqa4": ([4, 2], [1, 0], [200, 150], 8, 2, 128, 260, 5),
    "empty-first-and-last-gqa4": ([0, 6, 0], [0, 1, 2], [3, 40, 8], 4, 1, 64, 80, 2),
    "long-row-loops": ([40, 1], [0, 1], [20, 5], 4, 2, 64, 64, 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_ragged_fp32_vs_ops(dev, name):
    counts, slots, lens, hq, hkv, d, cap, splits = CASES[name]
    q, k, v, ck, cv, cl, rs, st = _setup(dev, counts, slots, lens, hq, hkv, d, cap, torch.float32)
    ref_k, ref_v = ck.double(), cv.double()
    ref = ops.ragged_attention(q.double(), k.double(), v.double(), ref_k, ref_v, cl, rs, st, d ** -0.5)
    before_k = ck.clone()
    out = RA.ragged_attention(q, k, v, ck, cv, cl, rs, st, d ** -0.5, num_splits=splits)
    assert out.shape == (1, sum(counts), hq * d) and out.dtype == torch.float32
    assert _rel(out, ref) < 2e-6
    # the same cache writes as the reference, and nothing else
    assert torch.equal(ck, ref_k.float()) and torch.equal(cv, ref_v.float())
    for r, n in enumerate(counts):
        if n == 0:
            assert torch.equal(ck[slots[r]], before_k[slots[r]])


@pytest.mark.parametrize("name", ["mixed-gqa2", "long-cache-split-gqa4"])
def test_ragged_fp16(dev, name):
    counts, slots, lens, hq, hkv, d, cap, splits = CASES[name]
    q, k, v, ck, cv, cl, rs, st = _setup(dev, counts, slots, lens, hq, hkv, d, cap, torch.float16, seed=1)
    ref_k, ref_v = ck.double(), cv.double()
    ref = ops.ragged_attention(q.double(), k.double(), v.double(), ref_k, ref_v, cl, rs, st, d ** -0.5)
    out = RA.ragged_attention(q, k, v, ck, cv, cl, rs, st, d ** -0.5, num_splits=splits)
    assert out.dtype == torch.float16
    # interpreter: fp32 math, one rounding to fp16; GPU: probabilities in 16 bits for the PV dot
    assert _rel(out, ref) < (1e-3 if dev == "cpu" else 1e-2)
    assert torch.equal(ck, ref_k.half()) and torch.equal(cv, ref_v.half())


def test_split_counts_and_untouched_slots(dev):
    """Any split count gives the same result; slots that are no row's stay as they were."""
    q, k, v, ck, cv, cl, rs, st = _setup(dev, [2, 3], [3, 1], [100, 60], 4, 2, 64, 128, torch.float32,
                                         seed=2, num_slots=5)
    before = ck.clone()
    outs = []
    for s in (1, 2, 7):
        kk, vv = ck.clone(), cv.clone()
        outs.append(RA.ragged_attention(q, k, v, kk, vv, cl, rs, st, 0.125, num_splits=s))
    for o in outs[1:]:
        assert _rel(o, outs[0]) < 1e-6
    RA.ragged_attention(q, k, v, ck, cv, cl, rs, st, 0.125)
    for slot in (0, 2, 4):
        assert torch.equal(ck[slot], before[slot])


def test_a_row_equals_dense_attention(dev):
    """One row of a packed block computes what the dense kernel computes for it alone."""
    from specc.codegen.kernels import attention as A

    q, k, v, ck, cv, cl, rs, st = _setup(dev, [1, 4], [0, 1], [30, 50], 8, 2, 64, 96, torch.float32, seed=3)
    dense_k, dense_v = ck[1:2].clone(), cv[1:2].clone()
    out = RA.ragged_attention(q, k, v, ck, cv, cl, rs, st, 0.125, num_splits=2)
    n = 4
    slots = cl[1] + torch.arange(n, device=dev)
    dense_k[0, :, slots] = k[0, 1:].transpose(0, 1)
    dense_v[0, :, slots] = v[0, 1:].transpose(0, 1)
    dense = A.attention(q[:, 1:], dense_k, dense_v, cl[1:], n, "causal", 0.125, num_splits=2)
    assert _rel(out[:, 1:], dense) < 1e-6


def test_errors(dev):
    q, k, v, ck, cv, cl, rs, st = _setup(dev, [2], [0], [3], 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="packed row"):
        RA.ragged_attention(q.expand(2, -1, -1, -1), k, v, ck, cv, cl, rs, st, 0.1)
    with pytest.raises(ValueError, match="row_starts"):
        RA.ragged_attention(q, k, v, ck, cv, cl, rs, st[:1], 0.1)
    with pytest.raises(ValueError, match="multiple"):
        RA.ragged_attention(q[:, :, :3], k, v, ck, cv, cl, rs, st, 0.1)
    with pytest.raises(ValueError, match="out must be"):
        RA.ragged_attention(q, k, v, ck, cv, cl, rs, st, 0.1, out=torch.empty(1, 2, 8, device=dev))


def test_launch_plan_uses_the_mean_row():
    cpu = torch.device("cpu")
    plan = RA.ragged_launch_plan(64, 8, 32, 8, 128, 4096, cpu)  # 8 rows of 8 tokens, G = 4
    assert plan["block_m"] == 32 and plan["row_blocks"] == 1 and plan["num_splits"] > 1
    assert RA.ragged_launch_plan(0, 0, 32, 8, 128, 4096, cpu)["row_blocks"] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("counts", [[1, 16, 0, 7, 3, 12, 1, 9], [16] * 8])
def test_ragged_bf16_gpu(counts):
    rows = len(counts)
    q, k, v, ck, cv, cl, rs, st = _setup("cuda", counts, list(range(rows))[::-1], [512 + 400 * i for i in range(rows)],
                                         32, 8, 128, 4096, torch.bfloat16)
    ref_k, ref_v = ck.double(), cv.double()
    ref = ops.ragged_attention(q.double(), k.double(), v.double(), ref_k, ref_v, cl, rs, st, 128 ** -0.5)
    out = RA.ragged_attention(q, k, v, ck, cv, cl, rs, st, 128 ** -0.5)
    assert _rel(out, ref) < 1e-2
    assert torch.equal(ck, ref_k.bfloat16())
