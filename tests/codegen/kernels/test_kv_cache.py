"""kv_compact against the reference, including overlapping source/destination slots."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import kv_cache as C


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_compact(dev, dtype):
    torch.manual_seed(0)
    ck = torch.randn(3, 2, 20, 24).to(dtype).to(dev)
    cv = torch.randn(3, 2, 20, 24).to(dtype).to(dev)
    # row 0: accepted tree path at block slots 10 + [0, 2, 5] -> 10 + [0, 1, 2] (overlapping)
    # row 1: a shifted chain 5..8 -> 4..7 (every destination but one is also a source)
    # row 2: invalid slots are skipped
    src = torch.tensor([[10, 12, 15, 0], [5, 6, 7, 8], [3, -1, 25, 4]], device=dev)
    dst = torch.tensor([[10, 11, 12, 0], [4, 5, 6, 7], [9, 9, 1, 30]], device=dev)
    count = torch.tensor([3, 4, 4], device=dev)
    ck_r, cv_r = ck.clone(), cv.clone()
    C.kv_compact(ck, cv, src, dst, count, opt_in=False)
    C.kv_compact_reference(ck_r, cv_r, src, dst, count)
    assert torch.equal(ck, ck_r) and torch.equal(cv, cv_r)


def test_kv_compact_semantics(dev):
    ck = torch.arange(2 * 1 * 8 * 16, dtype=torch.float32, device=dev).view(2, 1, 8, 16)
    cv = -ck.clone()
    before_k, before_v = ck.clone(), cv.clone()
    src = torch.tensor([[2, 4, 6]], device=dev)
    dst = torch.tensor([[1, 2, 3]], device=dev)
    C.kv_compact(ck, cv, src, dst, opt_in=False)  # only row 0 (B = 1 < Bmax = 2)
    for s, d in ((2, 1), (4, 2), (6, 3)):
        assert torch.equal(ck[0, :, d], before_k[0, :, s])
        assert torch.equal(cv[0, :, d], before_v[0, :, s])
    assert torch.equal(ck[1], before_k[1]) and torch.equal(ck[0, :, 4:], before_k[0, :, 4:])


def test_kv_compact_errors(dev):
    ck = torch.zeros(1, 1, 4, 16, device=dev)
    with pytest.raises(ValueError, match="differ"):
        C.kv_compact(ck, ck.clone(), torch.zeros(1, 2, dtype=torch.long, device=dev),
                     torch.zeros(1, 3, dtype=torch.long, device=dev), opt_in=False)
    with pytest.raises(ValueError, match="rows"):
        C.kv_compact(ck, ck.clone(), torch.zeros(2, 2, dtype=torch.long, device=dev),
                     torch.zeros(2, 2, dtype=torch.long, device=dev), opt_in=False)


@pytest.mark.gpu
def test_kv_compact_bf16_gpu():
    ck = torch.randn(8, 8, 4096, 128, device="cuda").bfloat16()
    cv = torch.randn(8, 8, 4096, 128, device="cuda").bfloat16()
    src = torch.randint(1000, 1064, (8, 16), device="cuda").sort(dim=1).values
    dst = 1000 + torch.arange(16, device="cuda").expand(8, -1).contiguous()
    ck_r, cv_r = ck.clone(), cv.clone()
    C.kv_compact(ck, cv, src, dst, opt_in=False)
    C.kv_compact_reference(ck_r, cv_r, src, dst)
    assert torch.equal(ck, ck_r) and torch.equal(cv, cv_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_compact_layers_one_launch_equals_per_layer(dev, dtype):
    """Every layer's pair compacted in one launch (the address tables) equals the reference per
    layer, overlapping slots and skipped pairs included; a second call reuses the tables."""
    torch.manual_seed(1)
    caches = [(torch.randn(2, 2, 12, 16).to(dtype).to(dev), torch.randn(2, 2, 12, 16).to(dtype).to(dev))
              for _ in range(3)]
    want = [(k.clone(), v.clone()) for k, v in caches]
    src = torch.tensor([[4, 6, 9], [2, -1, 3]], device=dev)
    dst = torch.tensor([[4, 5, 6], [1, 2, 2]], device=dev)
    count = torch.tensor([3, 2], device=dev)
    C.kv_compact_layers(caches, src, dst, count, opt_in=False)
    for k, v in want:
        C.kv_compact_reference(k, v, src, dst, count)
    for (k, v), (wk, wv) in zip(caches, want):
        assert torch.equal(k, wk) and torch.equal(v, wv)
    tables = dict(C._TABLES)
    C.kv_compact_layers(caches, src, dst, torch.zeros_like(count), opt_in=False)  # nothing accepted: no move
    for (k, v), (wk, wv) in zip(caches, want):
        assert torch.equal(k, wk) and torch.equal(v, wv)
    assert C._TABLES == tables


def test_kv_compact_layers_mixed_layouts_fall_back(dev):
    """Layers of different shapes: one ``kv_compact`` per pair, the same result."""
    caches = [(torch.randn(1, 2, 10, 16, device=dev), torch.randn(1, 2, 10, 16, device=dev)),
              (torch.randn(1, 1, 10, 32, device=dev), torch.randn(1, 1, 10, 32, device=dev))]
    want = [(k.clone(), v.clone()) for k, v in caches]
    src, dst, count = (torch.tensor([[5, 7]], device=dev), torch.tensor([[5, 6]], device=dev),
                       torch.tensor([2], device=dev))
    C.kv_compact_layers(caches, src, dst, count, opt_in=False)
    for k, v in want:
        C.kv_compact_reference(k, v, src, dst, count)
    assert all(torch.equal(a, b) for pair, ref in zip(caches, want) for a, b in zip(pair, ref))


@pytest.mark.gpu
def test_kv_compact_layers_bf16_gpu_in_cuda_graph():
    """36 layers of Qwen3-8B-shaped bf16 caches compacted by one launch, eagerly and replayed from
    a CUDA graph (the tree commit's path: the graph reads the cached address table), equal the
    reference per layer."""
    torch.manual_seed(0)
    caches = [(torch.randn(2, 8, 1152, 128, device="cuda").bfloat16(),
               torch.randn(2, 8, 1152, 128, device="cuda").bfloat16()) for _ in range(36)]
    src = torch.tensor([[1000, 1003, 1007, -1], [1000, 1001, 1002, 1005]], device="cuda")
    dst = torch.tensor([[1000, 1001, 1002, 1003], [1000, 1001, 1002, 1003]], device="cuda")
    count = torch.tensor([3, 4], device="cuda")
    want = [(k.clone(), v.clone()) for k, v in caches]
    for k, v in want:
        C.kv_compact_reference(k, v, src, dst, count)
    C.kv_compact_layers(caches, src, dst, count)  # eager first call builds the table
    assert all(torch.equal(a, b) for pair, ref in zip(caches, want) for a, b in zip(pair, ref))
    fresh = [(torch.randn_like(k), torch.randn_like(v)) for k, v in caches]
    for (k, v), (fk, fv) in zip(caches, fresh):
        k.copy_(fk), v.copy_(fv)
    want = [(k.clone(), v.clone()) for k, v in fresh]
    for k, v in want:
        C.kv_compact_reference(k, v, src, dst, count)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        C.kv_compact_layers(caches, src, dst, count)
    for (k, v), (fk, fv) in zip(caches, fresh):  # capture may have run the copy: restore the inputs
        k.copy_(fk), v.copy_(fv)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for pair, ref in zip(caches, want) for a, b in zip(pair, ref))
