"""attention: flash-decoding Triton kernel over a static KV cache against the references."""

from __future__ import annotations

import pytest
import torch
from helpers import ancestor_mask

from specc.codegen.kernels import attention as A
from specc.models import ops


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _setup(dev, bsz, num_q, num_k, hq, hkv, d, s, lens, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(dev)  # noqa: E731
    q, k, v = mk(bsz, num_q, hq, d), mk(bsz, num_k, hkv, d), mk(bsz, num_k, hkv, d)
    cache_k, cache_v = mk(bsz + 1, hkv, s, d), mk(bsz + 1, hkv, s, d)
    cache_len = torch.tensor(lens, device=dev)
    return q, k, v, cache_k, cache_v, cache_len


def _write(cache_k, cache_v, k, v, cache_len):
    num_k = k.shape[1]
    slots = cache_len[:, None] + torch.arange(num_k, device=k.device)[None, :]
    rows = torch.arange(k.shape[0], device=k.device)[:, None].expand(-1, num_k)
    cache_k[rows, :, slots] = k
    cache_v[rows, :, slots] = v


CASES = [
    # bsz, Q, Qk, Hq, Hkv, D, S, lens, kind, splits
    (2, 1, 1, 4, 2, 16, 40, [5, 30], "causal", 1),
    (2, 3, 3, 4, 2, 16, 40, [0, 29], "causal", 3),
    (2, 3, 5, 6, 2, 24, 50, [7, 30], "full", 4),
    (1, 5, 5, 8, 2, 16, 300, [250], "causal", None),
    (3, 2, 2, 3, 3, 32, 20, [1, 17, 9], "full", 2),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[8]}-q{c[1]}-s{c[9]}" for c in CASES])
def test_attention_fp32_vs_ops(dev, case):
    bsz, num_q, num_k, hq, hkv, d, s, lens, kind, splits = case
    q, k, v, ck, cv, cl = _setup(dev, bsz, num_q, num_k, hq, hkv, d, s, lens, torch.float32)
    # ops.attention writes the cache itself; the kernel expects it written already
    ref = ops.attention(q.double(), k.double(), v.double(), ck.double(), cv.double(), cl, kind,
                        d ** -0.5)
    _write(ck, cv, k, v, cl)
    out = A.attention(q, ck, cv, cl, num_k, kind, d ** -0.5, num_splits=splits)
    assert out.shape == (bsz, num_q, hq * d) and out.dtype == torch.float32
    assert _rel(out, ref) < 2e-6
    assert _rel(A.attention_reference(q, ck, cv, cl, num_k, kind, d ** -0.5), ref) < 2e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_half(dev, dtype):
    q, k, v, ck, cv, cl = _setup(dev, 2, 4, 4, 4, 2, 16, 64, [10, 50], dtype, seed=1)
    _write(ck, cv, k, v, cl)
    out = A.attention(q, ck, cv, cl, 4, "causal", 0.25, num_splits=3)
    ref = A.attention_reference(q, ck, cv, cl, 4, "causal", 0.25)
    assert out.dtype == dtype
    # interpreter: fp32 math, one rounding; GPU: probabilities in 16 bits for the PV dot
    assert _rel(out, ref) < (1e-6 if dev == "cpu" else 1e-2)


@pytest.mark.parametrize("batched", [False, True])
def test_attention_tree_mask(dev, batched):
    bsz, num_q, hq, hkv, d = 2, 5, 4, 2, 16
    q, k, v, ck, cv, cl = _setup(dev, bsz, num_q, num_q, hq, hkv, d, 48, [3, 40], torch.float32, 2)
    _write(ck, cv, k, v, cl)
    # a tree: 0 -> {1, 2}, 1 -> 3, 2 -> 4 (each node sees its ancestors and itself)
    tm = ancestor_mask([-1, 0, 0, 1, 2]).to(dev)
    tree = tm.expand(bsz, -1, -1).clone() if batched else tm
    out = A.attention(q, ck, cv, cl, num_q, "tree", d ** -0.5, tree_mask=tree, num_splits=2)
    ref = A.attention_reference(q, ck, cv, cl, num_q, "tree", d ** -0.5, tree_mask=tree)
    assert _rel(out, ref) < 2e-6
    # a chain-shaped tree is the causal mask
    causal = torch.tril(torch.ones(num_q, num_q, dtype=torch.bool, device=dev))
    out_c = A.attention(q, ck, cv, cl, num_q, "tree", d ** -0.5, tree_mask=causal, num_splits=2)
    ref_c = A.attention(q, ck, cv, cl, num_q, "causal", d ** -0.5, num_splits=2)
    assert _rel(out_c, ref_c) < 1e-6
    # node 3 (path 0-1-3) must not see node 2 or 4: changing their keys leaves it unchanged
    ck2 = ck.clone()
    for b in range(bsz):
        ck2[b, :, int(cl[b]) + 2] += 5.0
        ck2[b, :, int(cl[b]) + 4] += 5.0
    out2 = A.attention(q, ck2, cv, cl, num_q, "tree", d ** -0.5, tree_mask=tree, num_splits=2)
    assert torch.allclose(out2[:, 3], out[:, 3], atol=1e-6)
    assert not torch.allclose(out2[:, 4], out[:, 4], atol=1e-3)


def test_split_counts_agree(dev):
    q, k, v, ck, cv, cl = _setup(dev, 1, 2, 2, 4, 1, 16, 200, [150], torch.float32, 3)
    _write(ck, cv, k, v, cl)
    outs = [A.attention(q, ck, cv, cl, 2, "causal", 0.25, num_splits=s) for s in (1, 2, 7)]
    for o in outs[1:]:
        assert _rel(o, outs[0]) < 1e-6


@pytest.mark.parametrize("kind", ["causal", "full", "tree"])
@pytest.mark.parametrize("block_m", [16, 32])
def test_fused_merge_equals_merge_kernel(dev, kind, block_m):
    """The last split merging in the split kernel gives the merge kernel's result (same
    splits, any row blocking), leaves its counters at zero and is reusable."""
    num_q = 6
    q, k, v, ck, cv, cl = _setup(dev, 2, num_q, num_q, 8, 2, 16, 300, [250, 37], torch.float32, 5)
    _write(ck, cv, k, v, cl)
    tree = torch.tril(torch.ones(num_q, num_q, dtype=torch.bool, device=dev))
    tree[4, 2] = False
    kw = dict(tree_mask=tree if kind == "tree" else None, num_splits=5, block_m=block_m)
    ref = A.attention(q, ck, cv, cl, num_q, kind, 0.25, **kw)
    for _ in range(2):
        fused = A.attention(q, ck, cv, cl, num_q, kind, 0.25, fused_merge=True, **kw)
        assert _rel(fused, ref) < 1e-6
    from specc.codegen.kernels._common import WORKSPACES

    assert not WORKSPACES.get("attention.cnt", ck.device, 1, torch.int32).any()
    with pytest.raises(ValueError, match="block_m"):
        A.attention(q, ck, cv, cl, num_q, kind, 0.25, tree_mask=kw["tree_mask"], block_m=24)


def test_out_buffer_and_errors(dev):
    q, k, v, ck, cv, cl = _setup(dev, 1, 2, 2, 4, 2, 16, 16, [3], torch.float32)
    out = torch.empty(1, 2, 64, device=dev)
    assert A.attention(q, ck, cv, cl, 2, "full", 0.25, out=out) is out
    with pytest.raises(ValueError, match="mask kind"):
        A.attention(q, ck, cv, cl, 2, "sliding", 0.25)
    with pytest.raises(ValueError, match="tree_mask"):
        A.attention(q, ck, cv, cl, 2, "tree", 0.25)
    with pytest.raises(ValueError, match="multiple"):
        A.attention(q[:, :, :3], ck, cv, cl, 2, "causal", 0.25)
    with pytest.raises(ValueError, match="num_new"):
        A.attention(q, ck, cv, cl, 1, "causal", 0.25)
    with pytest.raises(ValueError, match="cache_len"):
        A.attention(q, ck, cv, cl.repeat(2), 2, "causal", 0.25)


def test_pick_splits_and_plan():
    dev = torch.device("cpu")  # 132 SMs assumed off the GPU
    assert A.pick_splits(1, 8, 1, 4096, dev, rows=4) == 64
    assert A.pick_splits(32, 8, 1, 4096, dev, rows=4) == 3
    assert A.pick_splits(1, 8, 1, 100, dev, rows=4) == 2
    # Qwen3-8B at bs 1, context 4096: the split counts the H200 sweep found fastest
    plans = {q: A.launch_plan(1, q, 32, 8, 128, 4096 + q, dev) for q in (1, 16, 64)}
    assert [plans[q]["num_splits"] for q in (1, 16, 64)] == [65, 16, 4]
    assert [plans[q]["block_m"] for q in (1, 16, 64)] == [16, 64, 64]
    assert [plans[q]["num_stages"] for q in (1, 16, 64)] == [2, 3, 3]
    assert [plans[q]["fused_merge"] for q in (1, 16, 64)] == [False, False, True]
    # a short cache (context 1024 in 1152 slots): at least ~3/4 of a program per SM
    short = {q: A.launch_plan(1, q, 32, 8, 128, 1152, dev)["num_splits"] for q in (1, 4, 16, 32, 64)}
    assert short == {1: 18, 4: 18, 16: 12, 32: 6, 64: 3}


@pytest.mark.gpu
@pytest.mark.parametrize("num_q,kind", [(1, "causal"), (16, "causal"), (16, "full"), (64, "causal")])
def test_attention_bf16_gpu(num_q, kind):
    bsz, hq, hkv, d, s = 2, 32, 8, 128, 2048
    q, k, v, ck, cv, cl = _setup("cuda", bsz, num_q, num_q, hq, hkv, d, s, [1000, 1900],
                                 torch.bfloat16)
    _write(ck, cv, k, v, cl)
    out = A.attention(q, ck, cv, cl, num_q, kind, d ** -0.5)
    ref = A.attention_reference(q, ck, cv, cl, num_q, kind, d ** -0.5)
    assert _rel(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("bsz,num_q", [(8, 4), (8, 16), (16, 8), (16, 16), (32, 4)])
def test_attention_bf16_gpu_batched_plan(bsz, num_q):
    """Batched verify blocks take the batched plan (few splits, merged in the split kernel):
    equal to the reference as the bs1 rule's plan is, at the batched sweep's shapes."""
    hq, hkv, d, s = 32, 8, 128, 1152
    lens = [1024 - 7 * i for i in range(bsz)]
    q, k, v, ck, cv, cl = _setup("cuda", bsz, num_q, num_q, hq, hkv, d, s, lens, torch.bfloat16)
    _write(ck, cv, k, v, cl)
    plan = A.launch_plan(bsz, num_q, hq, hkv, d, s, torch.device("cuda"))
    assert A.batched_plan(bsz, num_q * hq // hkv) and plan["fused_merge"]
    out = A.attention(q, ck, cv, cl, num_q, "causal", d ** -0.5)
    ref = A.attention_reference(q, ck, cv, cl, num_q, "causal", d ** -0.5)
    assert _rel(out, ref) < 1e-2
