"""The launch-side state both bf12 kernels share: the escape table as CSR and the split-K
workspace."""

from __future__ import annotations

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
