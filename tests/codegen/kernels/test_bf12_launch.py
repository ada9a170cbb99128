"""The launch-side state both bf12 kernels share: the escape table as CSR, the split-K
workspace, the rows buckets and the config checks."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels.bf12_launch import escape_meta, split_k_workspace
from specc.formats import pack_bf16_12bit


def test_escape_meta_is_a_csr_of_the_table_with_standins():
    w = (torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    w[1, 3] = 0.0
    w[1, 39] = 3.0e4  # far above the window
    w[4, 0] = -1e-30
    for version in (1, 2):
        p = pack_bf16_12bit(w, version=version)
        meta = escape_meta(p)
        assert meta is escape_meta(p)  # cached on the Packed12
        rows = p.esc_idx.long() // 40
        assert meta["rowptr"].tolist() == [int((rows < r).sum()) for r in range(6)]
        assert torch.equal(meta["erow"].long() * 40 + meta["ecol"].long(), p.esc_idx.long())
        assert torch.equal(meta["etrue"], p.esc_val.view(torch.bfloat16).float())
        # the stand-in is what the planes decode to at an escape: 2**(base - 127)
        want = torch.exp2(p.base[meta["erow"].long()].float() - 127)
        assert torch.equal(meta["efake"], want)
        assert {(1, 3), (1, 39), (4, 0)} <= set(zip(meta["erow"].tolist(), meta["ecol"].tolist()))


def test_split_k_workspace_grows_and_is_reused():
    ws, cnt = split_k_workspace(torch.device("cpu"), 10, 3)
    assert ws.dtype == torch.float32 and cnt.dtype == torch.int32
    assert not ws.any() and not cnt.any()
    again = split_k_workspace(torch.device("cpu"), 100, 5)
    assert again[0] is ws and again[1] is cnt
    bigger, _ = split_k_workspace(torch.device("cpu"), ws.numel() + 1, 1)
    assert bigger.numel() > ws.numel()
    # the outgrown pair stays allocated: a CUDA graph captured with it replays its address
    from specc.codegen.kernels import bf12_launch

    assert any(old is ws and c is cnt for old, c in bf12_launch._RETIRED)


@pytest.mark.parametrize("bad,match", [({"kind": "wmma"}, "kind must be"), ({"block_n": 24}, "block_n must be a power of two"),
                                       ({"kind": "dot", "block_m": 8, "block_n": 16}, "needs block_m, block_n >= 16"),
                                       ({"block_m": 8}, "supports block_m in"), ({"split_k": 0}, "split_k and num_stages")])
def test_both_layouts_refuse_the_same_bad_configs(bad, match):
    from specc.codegen.kernels.linear_bf12 import Bf12Config
    from specc.codegen.kernels.linear_bf12_v2 import Bf12v2Config

    for cls in (Bf12Config, Bf12v2Config):
        with pytest.raises(ValueError, match=f"{cls.__name__}.*{match}"):
            cls(**bad)
    Bf12Config(block_j=4), Bf12v2Config(block_k=64)  # good ones pass
    with pytest.raises(ValueError, match="block_j must be a power of two"):
        Bf12Config(block_j=3)
    with pytest.raises(ValueError, match="one code group"):
        Bf12v2Config(block_k=16)


def test_rows_buckets():
    from specc.codegen.kernels.bf12_launch import m_bucket

    assert [m_bucket(m) for m in (1, 2, 3, 5, 16, 17, 64, 65, 4096)] == [1, 2, 4, 8, 16, 32, 64, 64, 64]
