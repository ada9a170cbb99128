"""embedding: row gather against F.embedding."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import embedding as E


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h", [16, 1100])
def test_embedding(dev, dtype, h):
    torch.manual_seed(0)
    w = torch.randn(50, h).to(dtype).to(dev)
    ids = torch.randint(0, 50, (3, 5), device=dev)
    out = E.embedding(ids, w)
    assert out.shape == (3, 5, h) and out.dtype == dtype
    assert torch.equal(out, E.embedding_reference(ids, w))
    assert torch.equal(E.embedding(ids.int(), w), out)


def test_embedding_out_of_range_gives_zeros(dev):
    w = torch.randn(10, 16, device=dev)
    out = E.embedding(torch.tensor([1, 10, -1], device=dev), w)
    assert torch.equal(out[0], w[1]) and (out[1:] == 0).all()


def test_embedding_errors(dev):
    with pytest.raises(TypeError):
        E.embedding(torch.zeros(3, device=dev), torch.randn(10, 16, device=dev))
    with pytest.raises(ValueError, match="2-D"):
        E.embedding(torch.zeros(3, dtype=torch.long, device=dev), torch.randn(10, device=dev))


@pytest.mark.gpu
def test_embedding_bf16_gpu():
    w = torch.randn(151936, 4096, device="cuda").bfloat16()
    ids = torch.randint(0, 151936, (32, 16), device="cuda")
    assert torch.equal(E.embedding(ids, w), E.embedding_reference(ids, w))
