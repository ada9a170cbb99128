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


def test_token_buckets_round_up_with_bounded_padding():
    from specc.runtime.ragged import bucket_slack, token_bucket

    assert [token_bucket(t) for t in (1, 2, 3, 5, 8, 9, 64, 65, 257)] == [1, 2, 4, 8, 8, 16, 64, 96, 384]
    assert all(token_bucket(t) >= t for t in range(1, 1100))
    assert bucket_slack(8) == 3 and bucket_slack(64) == 7 and bucket_slack(1024) == 127
    with pytest.raises(ValueError):
        token_bucket(0)


def test_bucketed_packing_keeps_every_slot_a_row_and_pads_the_last_row():
    counts = [2, 0, 3, 0]  # 5 tokens -> bucket 8: 3 padding tokens on slot 3's row
    packed = PackedRows.of(counts, 4, "cpu", bucket=True)
    plain = PackedRows.of(counts, 4, "cpu")
    assert packed.row_slots.tolist() == [0, 1, 2, 3] and packed.row_starts.tolist() == [0, 2, 2, 5, 8]
    assert packed.num_tokens == 8 and packed.num_real == 5
    block = torch.arange(16).view(4, 4)
    assert packed.tokens(block)[0, :5].tolist() == plain.tokens(block)[0].tolist()
    lengths = torch.tensor([10, 20, 30, 40])
    # the padding continues slot 3's row after its (here no) tokens: positions 42.. with offset 2
    assert packed.positions(lengths, 2).tolist() == [[12, 13, 32, 33, 34, 42, 43, 44]]
    assert packed.cache_len(lengths, 2).tolist() == [12, 22, 32, 42]
    outputs = torch.arange(8.0)[None, :, None]
    assert torch.equal(packed.unpack(outputs), plain.unpack(outputs[:, :5]))  # padding outputs dropped
    exact = PackedRows.of([4, 4], 4, "cpu", bucket=True)  # 8 tokens: a bucket already, no padding
    assert exact.num_tokens == 8 and exact.row_starts.tolist() == [0, 4, 8]
