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
    # products summed in fp32 and rounded once to the weight's dtype, as F.conv1d does (HF's
    # causal_conv1d_fn); rounding every product first adds K roundings per output in bf16
    out = (taps.float() * weight.t().float()[None, None]).sum(dim=2).to(weight.dtype)
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


# --------------------------------------------------------------------------- step ops
#
# The GDN layer's step as the IR sees it: a few leaf ops, two of which own the layer's state
# buffers (``[Bmax, 2 + max_block, ...]``, ``specc.models.state.SnapshotLayout``) the way
# attention owns its KV cache: they read the live entry (0; zeros for a row whose cache_len is
# 0), and write entry 1 (the state before the step), entries 2 + i (after block node i, up to
# the buffer's capacity) and, for a chain, entry 0 (after the whole block). ``parents`` is None
# for a chain (the traced chain steps specialise it away) or [B, Q] for a tree.


@torch.fx.wrap
def tree_parents(tree_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """parents [B, Q] of the draft tree whose ancestor mask is ``tree_mask`` ([B, Q, Q] or
    [Q, Q]); ``like`` [B, ...] gives the batch size."""
    parents = parents_from_mask(tree_mask)
    return parents.expand(like.shape[0], -1) if parents.shape[0] != like.shape[0] else parents


@torch.fx.wrap
def gdn_gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """The write strength and decay of every token and value head from the b / a projections:
    (g = -exp(A_log) * softplus(a + dt_bias) fp32 [B, Q, Hv], beta = sigmoid(b) [B, Q, Hv])."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias), torch.sigmoid(b)


def _live(buffer: torch.Tensor, cache_len: torch.Tensor, bsz: int) -> torch.Tensor:
    """Entry 0 of the first ``bsz`` rows; zeros for rows starting a sequence (cache_len 0)."""
    fresh = (cache_len[:bsz] == 0).view(bsz, *([1] * (buffer.dim() - 2)))
    return torch.where(fresh, torch.zeros((), dtype=buffer.dtype, device=buffer.device), buffer[:bsz, 0])


@torch.fx.wrap
def conv_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, cache_len: torch.Tensor,
              parents: torch.Tensor | None = None) -> torch.Tensor:
    """The GDN layer's depthwise causal conv + SiLU over a block, with its window state.

    x [B, Q, C] (pre-conv projections), conv_state [Bmax, 2 + max_block, C, K - 1], weight
    [C, 1, K], parents [B, Q] or None (chain). Returns the conv output [B, Q, C]; writes the
    window entries (see the section comment)."""
    bsz, q = x.shape[0], x.shape[1]
    slots = conv_state.shape[1] - 2
    window = _live(conv_state, cache_len, bsz)
    chain = parents is None
    if chain:
        parents = chain_parents(bsz, q, x.device)
    out, windows = causal_conv(x, window, weight[:, 0], parents)
    conv_state[:bsz, 1] = window
    n = min(q, slots)
    conv_state[:bsz, 2:2 + n] = windows[:, :n].to(conv_state.dtype)
    if chain:
        conv_state[:bsz, 0] = windows[:, -1].to(conv_state.dtype)
    return out


@torch.fx.wrap
def delta_rule_step(mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                    cache_len: torch.Tensor, key_heads: int, parents: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule over a block, with the layer's recurrent state.

    mixed [B, Q, 2 Hk dk + Hv dv] (the conv output: q | k | v), g, beta [B, Q, Hv], state
    [Bmax, 2 + max_block, Hv, dk, dv] fp32, key_heads Hk, parents [B, Q] or None (chain).
    Returns the per-head outputs [B, Q, Hv * dv] in ``mixed``'s dtype; writes the state
    entries (see the section comment). A chain longer than the buffer's per-node capacity
    (prefill) runs the chunked form and keeps only its final state; a tree must fit."""
    bsz, q = mixed.shape[0], mixed.shape[1]
    slots = state.shape[1] - 2
    hv, dk, dv = state.shape[2], state.shape[3], state.shape[4]
    chain = parents is None
    if not chain and q > slots:
        raise RuntimeError(f"a tree of {q} nodes exceeds the GDN state's {slots} per-node entries: "
                           f"setup_caches(..., max_block={q})")
    kd = key_heads * dk
    query = mixed[..., :kd].reshape(bsz, q, key_heads, dk)
    key = mixed[..., kd:2 * kd].reshape(bsz, q, key_heads, dk)
    value = mixed[..., 2 * kd:].reshape(bsz, q, hv, dv)
    start = _live(state, cache_len, bsz)
    state[:bsz, 1] = start
    if chain and q > slots:
        out, final = gated_delta_chunked(query, key, value, g, beta, start)
    else:
        if chain:
            parents = chain_parents(bsz, q, mixed.device)
        out, states = gated_delta_recurrent(query, key, value, g, beta, start, parents)
        state[:bsz, 2:2 + q] = states
        final = states[:, -1]
    if chain:
        state[:bsz, 0] = final
    return out.reshape(bsz, q, hv * dv)


@torch.fx.wrap
def gated_head_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`gated_rms_norm` per value head of flat x, gate [B, Q, Hv * dv] (weight [dv])."""
    dv = weight.shape[0]
    shape = x.shape
    heads = x.reshape(*shape[:-1], shape[-1] // dv, dv)
    return gated_rms_norm(heads, gate.reshape(heads.shape), weight, eps).reshape(shape)
