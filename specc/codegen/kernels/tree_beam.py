"""The beam of a best-first draft tree in one kernel launch (``specc.runtime.trees.build_tree``).

``build_tree`` keeps, depth by depth, the ``W`` best prefixes: at depth d the candidates are
(prefix i of depth d - 1) + (rank j at position d), scored ``beam[i] + logp_d[j]``, and the beam
of depth d is their top ``W``. In torch that is ~6 small kernels per depth (an add, a top-k,
index arithmetic, gathers): at 15 drafted positions ~90 launches, most of a tree step's
on-device overhead at batch 1 even inside a CUDA graph (~2-3 us per tiny kernel).

Here one program per batch row runs every depth. Two facts keep it small:

* the beam and each position's ranks are sorted (descending), so a candidate (i, j) has at
  least (i + 1)(j + 1) - 1 candidates scoring at least as high; with (i + 1)(j + 1) > W it
  cannot enter the top W (ties aside). Only the pairs with (i + 1)(j + 1) <= W are scored:
  about W (ln W + 0.6) of them (256 slots for W = 32, 512 for 64) instead of W * K;
* the top W of those is one bitonic ``tl.sort`` of 64-bit keys (a monotone integer image of
  the fp32 score in the high half, the candidate's slot inverted in the low half, so equal
  scores keep the lower slot first, i.e. the lower beam index, then the lower rank).

Exact against :func:`tree_beam_reference` (the torch loop) on inputs without ties; with tied
scores both return a valid top W, possibly a different one (the tree then differs, never the
verified output: tree verification is lossless for any tree).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import next_pow2, use_triton
from specc.codegen.kernels.pdl import pdl_args, pdl_wait

__all__ = ["tree_beam", "tree_beam_reference", "candidate_pairs"]


@functools.lru_cache(maxsize=32)
def _pairs_cpu(width: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(i, j) with (i + 1)(j + 1) <= width, i < width, j < ranks, padded with -1 to a power of 2."""
    pairs = [(i, j) for i in range(width) for j in range(ranks) if (i + 1) * (j + 1) <= width]
    size = next_pow2(max(len(pairs), width, 2))
    ii = torch.full((size,), -1, dtype=torch.int32)
    jj = torch.full((size,), -1, dtype=torch.int32)
    ii[: len(pairs)] = torch.tensor([p[0] for p in pairs], dtype=torch.int32)
    jj[: len(pairs)] = torch.tensor([p[1] for p in pairs], dtype=torch.int32)
    return ii, jj


_PAIRS_ON: dict = {}


def candidate_pairs(width: int, ranks: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The scored (beam index, rank) pairs, on ``device`` (cached: no copy per step)."""
    key = (width, ranks, str(device))
    if key not in _PAIRS_ON:
        ii, jj = _pairs_cpu(width, ranks)
        _PAIRS_ON[key] = (ii.to(device), jj.to(device))
    return _PAIRS_ON[key]


@triton.jit
def _sortable(x):
    """fp32 -> int32 with the same order (negative floats have their magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _unsortable(key):
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tree_beam_kernel(lp_ptr, tok_ptr, pi_ptr, pj_ptr, score_ptr, out_tok_ptr, parent_ptr,
                      beam_ptr, sort_ptr, D, K, W,
                      stride_lb, stride_ld, stride_tb, stride_td,
                      BW: tl.constexpr, CP: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    offs_w = tl.arange(0, BW)
    mask_w = offs_w < W
    out_row = b * D * W
    # depth 0: the top W ranks of position 0 (already sorted)
    s0 = tl.load(lp_ptr + b * stride_lb + offs_w, mask=mask_w & (offs_w < K), other=float("-inf"))
    t0 = tl.load(tok_ptr + b * stride_tb + offs_w, mask=mask_w & (offs_w < K), other=0)
    tl.store(score_ptr + out_row + offs_w, s0, mask=mask_w)
    tl.store(out_tok_ptr + out_row + offs_w, t0, mask=mask_w)
    tl.store(parent_ptr + out_row + offs_w, tl.full((BW,), -1, tl.int64), mask=mask_w)
    tl.store(beam_ptr + b * BW + offs_w, s0)
    offs_c = tl.arange(0, CP)
    pi = tl.load(pi_ptr + offs_c)
    pj = tl.load(pj_ptr + offs_c)
    valid = (pi >= 0) & (pj < K)
    low = tl.full((CP,), 2**31 - 1, tl.int64)
    for d in range(1, D):
        tl.debug_barrier()  # the previous depth's beam is in beam_ptr
        bs = tl.load(beam_ptr + b * BW + pi, mask=valid, other=float("-inf"))
        lp = tl.load(lp_ptr + b * stride_lb + d * stride_ld + pj, mask=valid, other=float("-inf"))
        cand = tl.where(valid, bs + lp, float("-inf"))
        key = (_sortable(cand).to(tl.int64) << 32) | (low - offs_c.to(tl.int64))
        ranked = tl.sort(key, descending=True)
        tl.store(sort_ptr + b * CP + offs_c, ranked)
        tl.debug_barrier()
        top = tl.load(sort_ptr + b * CP + offs_w)
        slot = (tl.full((BW,), 2**31 - 1, tl.int64) - (top & 0xFFFFFFFF)).to(tl.int32)
        score = _unsortable((top >> 32).to(tl.int32))
        i = tl.load(pi_ptr + slot)
        j = tl.load(pj_ptr + slot)
        tok = tl.load(tok_ptr + b * stride_tb + d * stride_td + j)
        base = out_row + d * W
        tl.store(score_ptr + base + offs_w, score, mask=mask_w)
        tl.store(out_tok_ptr + base + offs_w, tok, mask=mask_w)
        tl.store(parent_ptr + base + offs_w, i.to(tl.int64), mask=mask_w)
        tl.debug_barrier()  # every lane has read the old beam
        tl.store(beam_ptr + b * BW + offs_w, score)


def tree_beam_reference(top_lp: torch.Tensor, top_tok: torch.Tensor, width: int):
    """The torch loop: ``top_lp`` / ``top_tok`` [B, D, K] (each position's ranks, sorted
    descending), beam width ``width`` <= K. Returns (score, token, parent_in_beam), each
    [B, D, width]: the beam at every depth (parent -1 at depth 0)."""
    k = top_lp.shape[2]
    beam_score, beam_tok = top_lp[:, 0, :width], top_tok[:, 0, :width]
    scores, toks, parents = [beam_score], [beam_tok], [torch.full_like(beam_tok, -1)]
    for d in range(1, top_lp.shape[1]):
        cand = beam_score[:, :, None] + top_lp[:, d, None, :]
        beam_score, flat = cand.flatten(1).topk(width, dim=-1)
        scores.append(beam_score)
        toks.append(top_tok[:, d].gather(1, flat % k))
        parents.append(flat // k)
    return torch.stack(scores, 1), torch.stack(toks, 1), torch.stack(parents, 1)


def tree_beam(top_lp: torch.Tensor, top_tok: torch.Tensor, width: int, opt_in: bool = True):
    """:func:`tree_beam_reference` in one launch (Triton on the GPU; the torch loop elsewhere).
    ``top_lp`` fp32, ``top_tok`` int64, both [B, D, K], K >= width. Under the Triton interpreter on
    CPU the kernel runs only with ``SPECC_KERNELS=triton`` (``opt_in``, as generated steps do: the
    interpreter is slow) or ``opt_in=False`` (the kernel's own tests)."""
    bsz, depth, k = top_lp.shape
    if width < 1 or width > k:
        raise ValueError(f"tree_beam: need 1 <= width <= K (width {width}, K {k})")
    if not use_triton(top_lp, opt_in=opt_in):
        return tree_beam_reference(top_lp, top_tok, width)
    top_lp = top_lp.float().contiguous()
    top_tok = top_tok.to(torch.int64).contiguous()
    dev = top_lp.device
    pi, pj = candidate_pairs(width, k, dev)
    bw, cp = next_pow2(max(width, 2)), pi.numel()
    score = torch.empty(bsz, depth, width, dtype=torch.float32, device=dev)
    tok = torch.empty(bsz, depth, width, dtype=torch.int64, device=dev)
    parent = torch.empty(bsz, depth, width, dtype=torch.int64, device=dev)
    beam = torch.empty(bsz, bw, dtype=torch.float32, device=dev)
    scratch = torch.empty(bsz, cp, dtype=torch.int64, device=dev)
    _tree_beam_kernel[(bsz,)](top_lp, top_tok, pi, pj, score, tok, parent, beam, scratch,
                              depth, k, width, top_lp.stride(0), top_lp.stride(1),
                              top_tok.stride(0), top_tok.stride(1), BW=bw, CP=cp,
                              num_warps=4 if cp <= 1024 else 8, **pdl_args(top_lp, "tree_beam"))
    return score, tok, parent
