"""Gated DeltaNet (GDN) in pure torch: the reference semantics of a hybrid target's linear layers.

A GDN head keeps a matrix state S [dk, dv] (fp32). For each token, with L2-normed q, k, decay
g <= 0 and write strength beta in (0, 1):

    S <- exp(g) * S;    S <- S + k^T (beta * (v - k S));    o = (q / sqrt(dk)) S

The q, k, v inputs come from a depthwise causal convolution (kernel K, SiLU) over the layer's
projected inputs, so a layer also keeps the last K - 1 pre-convolution columns (the conv window).

Speculative decoding needs the state after every prefix of a verified block (the accepted
prefix is only known afterwards), and in a tree the state of each node's parent. So every
function here takes ``parents`` [B, Q] (node i continues from node ``parents[b, i]``; -1: from
the committed state; a chain is parents = i - 1) and returns the state after every node:

- :func:`conv_indices` / :func:`causal_conv` run the convolution over each node's ancestor path
  (not the flat token order), reading the committed window where the path runs out;
- :func:`gated_delta_recurrent` is the token-by-token recurrence (decode, verify, trees): it
  yields every per-node state, which is what a commit selects from;
- :func:`gated_delta_chunked` is the chunked (WY / UT-transform) form of the same recurrence for
  long chains (prefill): the same outputs and final state up to fp32 rounding, in O(Q / C)
  sequential steps of matrix products instead of Q.

Functions are ``torch.fx.wrap``-ped leaves like ``specc.models.ops``: one meaningful node each.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F


def chain_parents(batch: int, length: int, device) -> torch.Tensor:
    """parents [B, Q] of a chain: node i continues from node i - 1 (node 0 from the state)."""
    return (torch.arange(length, device=device) - 1)[None].expand(batch, length)


def parents_from_mask(tree_mask: torch.Tensor) -> torch.Tensor:
    """A draft tree's parents [B, N] from its ancestor mask [B, N, N] (or [N, N]): nodes are
    ordered parents first, so a node's parent is its ancestor with the largest index."""
    mask = tree_mask if tree_mask.dim() == 3 else tree_mask[None]
    n = mask.shape[-1]
    idx = torch.arange(n, device=mask.device)
    below = idx[None, :] < idx[:, None]  # j < i
    cand = torch.where(mask.bool() & below[None], idx[None, None, :], torch.full_like(idx, -1)[None, None, :])
    return cand.max(dim=-1).values


@torch.fx.wrap
def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (the normalisation the GDN kernels use)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


@torch.fx.wrap
def rms_norm_offset(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: the weight is stored as w - 1 (scale 1 + w), applied in fp32."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).type_as(x)


@torch.fx.wrap
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the GDN output per value head, then times SiLU(gate) (the output gate z)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * xf.to(dtype)
    return (out * F.silu(gate.float())).to(dtype)


def conv_indices(parents: torch.Tensor, kernel: int) -> torch.Tensor:
    """[B, Q, K] indices into [window (K - 1 columns); block (Q columns)] of the K inputs each
    node's convolution reads: its K - 1 predecessors along its ancestor path, then itself."""
    bsz, q = parents.shape
    w = kernel - 1
    dev = parents.device
    # predecessor of every extended column: window column c -> c - 1, node i -> its parent
    # (the last window column when the parent is the committed state)
    window_prev = (torch.arange(w, device=dev) - 1).clamp(min=0)[None].expand(bsz, w)
    node_prev = torch.where(parents < 0, torch.full_like(parents, w - 1), parents + w)
    prev = torch.cat([window_prev, node_prev], dim=1)  # [B, W + Q]
    cols = [(torch.arange(q, device=dev) + w)[None].expand(bsz, q)]
    for _ in range(w):
        cols.append(prev.gather(1, cols[-1]))
    return torch.stack(cols[::-1], dim=-1)  # oldest first: weight tap 0 .. K - 1


@torch.fx.wrap
def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, parents: torch.Tensor):
    """Depthwise causal convolution + SiLU along ancestor paths.

    x [B, Q, C] (pre-conv inputs of the block), window [B, C, K - 1] (the committed last K - 1
    inputs), weight [C, K], parents [B, Q]. Returns (out [B, Q, C], windows [B, Q, C, K - 1]:
    the conv window after each node, i.e. the last K - 1 inputs of its path)."""
    kernel = weight.shape[-1]
    ext = torch.cat([window.transpose(1, 2).to(x.dtype), x], dim=1)  # [B, W + Q, C]
    idx = conv_indices(parents, kernel)  # [B, Q, K]
    bsz, q, _ = idx.shape
    taps = ext.gather(1, idx.reshape(bsz, q * kernel, 1).expand(-1, -1, ext.shape[-1]))
    taps = taps.reshape(bsz, q, kernel, -1)  # [B, Q, K, C]
    out = (taps.to(weight.dtype) * weight.t()[None, None]).sum(dim=2)
    return F.silu(out).to(x.dtype), taps[:, :, 1:].permute(0, 1, 3, 2)


def _heads_fp32(q, k, v, g, beta):
    """Repeat q/k heads over their value heads, fp32, L2-normed q/k, q scaled by 1/sqrt(dk)."""
    hk, hv = k.shape[2], v.shape[2]
    if hk != hv:
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k = l2norm(q.float()), l2norm(k.float())
    return q * q.shape[-1] ** -0.5, k, v.float(), g.float(), beta.float()


@torch.fx.wrap
def gated_delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, state: torch.Tensor, parents: torch.Tensor):
    """The gated delta rule token by token, each node continuing from its parent's state.

    q, k [B, Q, Hk, dk]; v [B, Q, Hv, dv]; g, beta [B, Q, Hv]; state [B, Hv, dk, dv] (the
    committed state); parents [B, Q]. Returns (out [B, Q, Hv, dv] in v's dtype, states
    [B, Q, Hv, dk, dv] fp32: the state after each node)."""
    dtype = v.dtype
    q, k, v, g, beta = _heads_fp32(q, k, v, g, beta)
    bsz, n = parents.shape
    rows = torch.arange(bsz, device=parents.device)
    start = state.float()
    states = start.new_empty(bsz, n, *start.shape[1:])
    outs = []
    for i in range(n):
        par = parents[:, i]
        prev = torch.where((par < 0)[:, None, None, None], start, states[rows, par.clamp(min=0)]) if i else start
        s = prev * g[:, i].exp()[..., None, None]
        kt = k[:, i]
        delta = (v[:, i] - (s * kt[..., None]).sum(dim=-2)) * beta[:, i][..., None]
        s = s + kt[..., None] * delta[..., None, :]
        outs.append((s * q[:, i][..., None]).sum(dim=-2))
        states[:, i] = s
    return torch.stack(outs, dim=1).to(dtype), states


@torch.fx.wrap
def gated_delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, state: torch.Tensor, chunk: int = 64):
    """The gated delta rule over a chain in chunks of ``chunk`` tokens (WY representation).

    Within a chunk with cumulative decay G_t = sum_{s<=t} g_s, the delta rule's writes
    u = beta * (v - k S) solve a unit lower-triangular system
    (I + tril(beta_t k_t k_s^T exp(G_t - G_s), -1)) U = beta * (v - exp(G) k S0),
    so the chunk's outputs are o = exp(G) q S0 + tril(q k^T exp(G_t - G_s)) U and the state after
    it exp(G_C) S0 + sum_t exp(G_C - G_t) k_t^T U_t. Same arguments as
    :func:`gated_delta_recurrent` minus the tree; returns (out [B, Q, Hv, dv], final state)."""
    dtype = v.dtype
    q, k, v, g, beta = _heads_fp32(q, k, v, g, beta)
    # [B, H, T, d]
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)
    total = q.shape[2]
    s = state.float()
    outs = []
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)
        qc, kc, vc, gc, bc = q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], g[:, :, lo:hi], beta[:, :, lo:hi]
        c = hi - lo
        cum = gc.cumsum(dim=-1)  # G_t
        decay = (cum[..., :, None] - cum[..., None, :])  # G_t - G_s
        strict = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        kk = (kc @ kc.transpose(-1, -2)) * decay.masked_fill(~strict, float("-inf")).exp()
        system = torch.eye(c, device=q.device) + bc[..., :, None] * kk
        rhs = bc[..., None] * (vc - (kc * cum.exp()[..., None]) @ s)
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        qk = (qc @ kc.transpose(-1, -2)) * decay.masked_fill(~lower, float("-inf")).exp()
        outs.append((qc * cum.exp()[..., None]) @ s + qk @ u)
        last = cum[..., -1:]
        s = s * last.exp()[..., None] + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ u
    out = torch.cat(outs, dim=2).transpose(1, 2)
    return out.to(dtype), s
