"""argmax and greedy acceptance against torch."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import greedy as G


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v,chunk", [(1000, 64), (37, None), (300, 16)])
def test_argmax(dev, dtype, v, chunk):
    torch.manual_seed(v)
    x = torch.randn(2, 3, v).to(dtype).to(dev)
    out = G.argmax(x, chunk=chunk)
    assert out.dtype == torch.int64 and out.shape == (2, 3)
    assert torch.equal(out, torch.argmax(x, dim=-1))


def test_argmax_ties_and_specials(dev):
    v = 200
    x = torch.zeros(6, v, device=dev)
    x[0, [150, 17, 90]] = 5.0  # tie across chunks: lowest index
    x[1, [33, 34]] = 2.0  # tie inside a chunk
    x[2] = float("-inf")  # all -inf: index 0
    x[3, [120, 40]] = float("nan")  # NaN wins, the first one
    x[3, 10] = float("inf")
    x[4, 199] = float("inf")
    x[5] = -1.0  # constant row
    out = G.argmax(x, chunk=32)
    assert out.tolist() == [17, 33, 0, 40, 199, 0]
    assert out.tolist() == torch.argmax(x.cpu(), dim=-1).tolist()


def test_greedy_accept(dev):
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 9, 9]], device=dev)
    drafts = torch.tensor([[5, 6, 7], [5, 0, 7], [0, 2, 3], [9, 9, 9]], device=dev)
    a, nxt = G.greedy_accept(drafts, target)
    assert a.tolist() == [3, 1, 0, 3] and nxt.tolist() == [8, 6, 1, 9]
    # ragged draft lengths
    dl = torch.tensor([2, 3, 3, 0], device=dev)
    a, nxt = G.greedy_accept(drafts, target, draft_len=dl)
    assert a.tolist() == [2, 1, 0, 0] and nxt.tolist() == [7, 6, 1, 9]
    # committed tokens into an output buffer at per-row positions; positions advance
    out = torch.full((4, 6), -1, dtype=torch.int64, device=dev)
    pos = torch.tensor([0, 2, 5, 4], device=dev)
    a, nxt = G.greedy_accept(drafts, target, out_tokens=out, out_pos=pos)
    assert out.tolist() == [[5, 6, 7, 8, -1, -1], [-1, -1, 5, 6, -1, -1],
                            [-1, -1, -1, -1, -1, 1], [-1, -1, -1, -1, 9, 9]]
    assert pos.tolist() == [4, 4, 6, 8]
    # the reference agrees
    out_r = torch.full((4, 6), -1, dtype=torch.int64, device=dev)
    pos_r = torch.tensor([0, 2, 5, 4], device=dev)
    a_r, n_r = G.greedy_accept_reference(drafts, target, None, out_r, pos_r)
    assert torch.equal(a_r, a) and torch.equal(n_r, nxt)
    assert torch.equal(out_r, out) and torch.equal(pos_r, pos)


def test_greedy_verify_random(dev):
    torch.manual_seed(0)
    bsz, k, v = 5, 4, 50
    logits = torch.randn(bsz, k + 1, v, device=dev)
    target = logits.argmax(-1)
    drafts = target[:, :k].clone()
    for b in range(bsz):  # mismatch at position b (b == k: all accepted)
        if b < k:
            drafts[b, b] = (drafts[b, b] + 1) % v
    a, nxt, tgt = G.greedy_verify(logits, drafts)
    assert torch.equal(tgt, target)
    assert a.tolist() == [0, 1, 2, 3, 4]
    assert nxt.tolist() == [int(target[b, b]) for b in range(bsz)]
    a_r, n_r, _ = G.greedy_verify_reference(logits, drafts)
    assert torch.equal(a, a_r) and torch.equal(nxt, n_r)


def test_k_zero_and_errors(dev):
    a, nxt = G.greedy_accept(torch.zeros(2, 0, dtype=torch.long, device=dev),
                             torch.tensor([[3], [4]], device=dev))
    assert a.tolist() == [0, 0] and nxt.tolist() == [3, 4]
    with pytest.raises(ValueError, match="K \\+ 1"):
        G.greedy_accept(torch.zeros(2, 3, dtype=torch.long, device=dev),
                        torch.zeros(2, 3, dtype=torch.long, device=dev))
    with pytest.raises(ValueError, match="go together"):
        G.greedy_accept(torch.zeros(2, 3, dtype=torch.long, device=dev),
                        torch.zeros(2, 4, dtype=torch.long, device=dev),
                        out_tokens=torch.zeros(2, 5, dtype=torch.long, device=dev))


@pytest.mark.gpu
def test_argmax_bf16_gpu_vocab():
    x = torch.randn(17, 151936, device="cuda").bfloat16()
    x[3, [7, 150000]] = 100.0  # tie across far chunks
    assert torch.equal(G.argmax(x), torch.argmax(x, dim=-1))
