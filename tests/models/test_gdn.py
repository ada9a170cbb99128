"""The pure-torch gated DeltaNet reference: the chunked form equals the recurrence, a tree node's
state and conv window follow its ancestor path, parents come back from the ancestor mask."""

import pytest
import torch

from specc.models import gdn
from specc.runtime.trees import DraftTree

B, HK, HV, DK, DV = 2, 2, 4, 8, 6


def _inputs(q_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, q_len, HK, DK, generator=g)
    k = torch.randn(B, q_len, HK, DK, generator=g)
    v = torch.randn(B, q_len, HV, DV, generator=g)
    decay = -torch.rand(B, q_len, HV, generator=g) * 2.0
    beta = torch.rand(B, q_len, HV, generator=g)
    state = torch.randn(B, HV, DK, DV, generator=g) * 0.3
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("q_len, chunk", [(1, 64), (7, 64), (23, 8), (16, 4)])
def test_chunked_equals_recurrent(q_len, chunk):
    q, k, v, decay, beta, state = _inputs(q_len)
    out_r, states = gdn.gated_delta_recurrent(q, k, v, decay, beta, state, gdn.chain_parents(B, q_len, "cpu"))
    out_c, final = gdn.gated_delta_chunked(q, k, v, decay, beta, state, chunk=chunk)
    torch.testing.assert_close(out_c, out_r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final, states[:, -1], rtol=1e-4, atol=1e-5)


def _tree():
    # node: 0 root; 1, 2 children of 0; 3 child of 1; 4 child of 2; 5 child of 3; 6 child of 4
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, 4], [-1, 0, 1, 0, 2, 3, 3]])
    return parents


def _path(parents_row, node):
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents_row[node])
    return path[::-1]


def test_tree_states_follow_the_ancestor_path():
    """The state after a tree node equals the chain recurrence over its root path."""
    parents = _tree()
    q, k, v, decay, beta, state = _inputs(parents.shape[1], seed=1)
    out, states = gdn.gated_delta_recurrent(q, k, v, decay, beta, state, parents)
    for b in range(B):
        for node in range(parents.shape[1]):
            path = _path(parents[b], node)
            sel = lambda t: t[b:b + 1, path]  # noqa: E731
            o, s = gdn.gated_delta_recurrent(sel(q), sel(k), sel(v), sel(decay), sel(beta), state[b:b + 1],
                                             gdn.chain_parents(1, len(path), "cpu"))
            torch.testing.assert_close(states[b, node], s[0, -1])
            torch.testing.assert_close(out[b, node], o[0, -1])


def test_tree_conv_reads_ancestors_and_the_committed_window():
    parents = _tree()
    g = torch.Generator().manual_seed(2)
    channels, kernel = 5, 4
    x = torch.randn(B, parents.shape[1], channels, generator=g)
    window = torch.randn(B, channels, kernel - 1, generator=g)
    weight = torch.randn(channels, kernel, generator=g)
    out, windows = gdn.causal_conv(x, window, weight, parents)
    for b in range(B):
        for node in range(parents.shape[1]):
            path = _path(parents[b], node)
            o, w = gdn.causal_conv(x[b:b + 1, path], window[b:b + 1], weight, gdn.chain_parents(1, len(path), "cpu"))
            torch.testing.assert_close(out[b, node], o[0, -1])
            torch.testing.assert_close(windows[b, node], w[0, -1])
    # a chain equals torch's depthwise conv1d over [window; x]
    chain_out, _ = gdn.causal_conv(x, window, weight, gdn.chain_parents(B, x.shape[1], "cpu"))
    ext = torch.cat([window, x.transpose(1, 2)], dim=-1)
    ref = torch.nn.functional.conv1d(ext, weight[:, None], groups=channels)
    torch.testing.assert_close(chain_out, torch.nn.functional.silu(ref).transpose(1, 2))


def test_bf16_conv_rounds_once_as_conv1d():
    """In bf16 the conv's products are summed in fp32 and rounded once, as torch's conv1d (HF's
    causal_conv1d_fn, the reference) does; rounding each product to bf16 first (an earlier
    version) disagreed with it at about a third of the outputs, at Qwen3.5's real shapes too."""
    g = torch.Generator().manual_seed(4)
    channels, kernel, length = 256, 4, 9
    x = torch.randn(1, length, channels, generator=g).bfloat16()
    window = torch.randn(1, channels, kernel - 1, generator=g).bfloat16()
    weight = (torch.randn(channels, kernel, generator=g) * 0.3).bfloat16()
    out, _ = gdn.causal_conv(x, window, weight, gdn.chain_parents(1, length, "cpu"))
    ext = torch.cat([window, x.transpose(1, 2)], dim=-1)
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(ext, weight[:, None], groups=channels)).transpose(1, 2)
    assert out.dtype == torch.bfloat16
    assert (out != ref).float().mean().item() < 0.005  # fp32 summation order only


def test_parents_from_ancestor_mask():
    parents = _tree()
    depths = torch.zeros_like(parents)
    for b in range(B):
        for node in range(parents.shape[1]):
            depths[b, node] = len(_path(parents[b], node)) - 1
    tree = DraftTree(torch.zeros_like(parents), parents, depths, torch.zeros(parents.shape))
    assert torch.equal(gdn.parents_from_mask(tree.ancestor_mask()), parents)
