"""Two-level prefix sums: the same sums as one scan, with no scan longer than a chunk."""

import pytest
import torch

from specc.sampling import scan


@pytest.mark.parametrize("length, layout", [(60, (60, 60)), (1024, (1024, 1024)), (4096, (1024, 4096)),
                                            (32000, (256, 32000)), (151936, (128, 151936)),
                                            (4097, (256, 4352))])
def test_chunk_layout(length, layout):
    assert scan.chunk_layout(length) == layout
    size, padded = layout
    assert padded % size == 0 and padded >= length and size <= 1024


@pytest.mark.parametrize("length", [7, 1024, 4096, 151936, 4097])
def test_cumsum_equals_one_scan(length):
    g = torch.Generator().manual_seed(length)
    x = torch.rand(3, 2, length, generator=g, dtype=torch.float64)
    out = scan.cumsum(x)
    assert out.shape == x.shape and out.dtype == torch.float64
    assert torch.allclose(out, x.cumsum(-1), rtol=1e-12, atol=0)
    whole = torch.randint(0, 1 << 30, (3, length), generator=g).double()  # exact sums: bit for bit
    assert torch.equal(scan.cumsum(whole), whole.cumsum(-1))
    if length <= 1024:  # one chunk: the very same scan
        assert torch.equal(out, x.cumsum(-1))


def test_chunks_view_and_padding():
    x = torch.arange(4097, dtype=torch.float64)
    blocks = scan.chunks(x)
    assert blocks.shape == (17, 256) and blocks.flatten()[:4097].equal(x) and blocks.flatten()[4097:].eq(0).all()
    y = torch.ones(2, 4096)
    assert scan.chunks(y).data_ptr() == y.data_ptr()  # a divisible row is a view, not a copy
