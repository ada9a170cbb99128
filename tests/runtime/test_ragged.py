"""specc.runtime.ragged: the packed layout of a padded block's rows (descriptor, token gather,
positions, cache lengths, output scatter) and which steps take it."""

import pytest
import torch

from specc.runtime.ragged import PackedRows, ragged_capable


def test_packed_rows_gather_and_scatter_in_slot_order():
    packed = PackedRows.of([2, 0, 3, 1], 4, "cpu")
    assert packed.row_slots.tolist() == [0, 2, 3] and packed.row_starts.tolist() == [0, 2, 5, 6]
    block = torch.arange(16).view(4, 4)
    assert packed.tokens(block).tolist() == [[0, 1, 8, 9, 10, 12]]
    lengths = torch.tensor([10, 20, 30, 40])
    assert packed.positions(lengths, 2).tolist() == [[12, 13, 32, 33, 34, 42]]
    assert packed.cache_len(lengths, 2).tolist() == [12, 32, 42]
    out = packed.unpack(packed.tokens(block)[..., None].float())
    want = torch.where(torch.arange(4)[None] < torch.tensor([2, 0, 3, 1])[:, None], block, 0)
    assert out.shape == (4, 4, 1) and torch.equal(out[..., 0], want.float())
    with pytest.raises(ValueError, match="0..4"):
        PackedRows.of([5], 4, "cpu")


def test_ragged_capability_is_declared_by_the_step():
    from specc.models.decoder import CausalLM
    from specc.models.hybrid import HybridLM

    assert CausalLM.ragged_rows and ragged_capable(CausalLM) and not ragged_capable(HybridLM)
    assert not ragged_capable(None)
