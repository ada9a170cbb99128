"""Greedy decoding on the GPU: vocabulary argmax and chain acceptance, with no host sync.

:func:`argmax` is ``torch.argmax(logits, -1)`` (ties go to the lowest index; a NaN counts as the
maximum and the first NaN wins, as in torch) as a two-stage reduction: stage 1 reduces chunks of
the vocabulary (``[rows, chunks]`` programs fill the GPU even for one row of V = 151936), stage
2 reduces each row's chunk winners in chunk order.

:func:`greedy_accept` takes drafts ``[B, K]`` and the target's greedy tokens ``[B, K + 1]``
(``argmax`` of the verify logits) and returns the accepted length ``a`` (longest prefix where
``drafts[b, j] == target[b, j]``, capped by ``draft_len[b]`` when given) and the next token
``target[b, a]``; the committed tokens ``target[b, :a + 1]`` are written into an output buffer
``out_tokens[b, out_pos[b] + j]`` (dropped past its end) and ``out_pos`` is advanced by
``a + 1`` in place. :func:`greedy_verify` does both from the logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import (
    FLOAT_DTYPES,
    check_same_device,
    check_tensor,
    next_pow2,
    use_triton,
)
from specc.codegen.kernels.pdl import pdl_args, pdl_wait

__all__ = [
    "argmax",
    "argmax_reference",
    "greedy_accept",
    "greedy_accept_reference",
    "greedy_verify",
    "greedy_verify_reference",
]

_BIG = tl.constexpr(2**31 - 1)


@triton.jit
def _argmax_chunk_kernel(x_ptr, val_ptr, idx_ptr, V, stride_x, NUM_CHUNKS, CHUNK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    v = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    isnan = v != v
    first_nan = tl.min(tl.where(isnan & mask, offs, _BIG), axis=0)
    vmax = tl.max(tl.where(isnan | (~mask), float("-inf"), v), axis=0)
    first = tl.min(tl.where((v == vmax) & mask, offs, _BIG), axis=0)
    has_nan = first_nan < _BIG
    out_i = tl.where(has_nan, first_nan, first)
    out_v = tl.where(has_nan, float("nan"), vmax)
    slot = row.to(tl.int64) * NUM_CHUNKS + c
    tl.store(val_ptr + slot, out_v)
    tl.store(idx_ptr + slot, out_i)


@triton.jit
def _argmax_final_kernel(val_ptr, idx_ptr, out_ptr, NUM_CHUNKS, BLOCK_C: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < NUM_CHUNKS
    base = row.to(tl.int64) * NUM_CHUNKS
    v = tl.load(val_ptr + base + offs, mask=mask, other=float("-inf"))
    i = tl.load(idx_ptr + base + offs, mask=mask, other=_BIG)
    isnan = v != v
    first_nan = tl.min(tl.where(isnan & mask, i, _BIG), axis=0)
    vmax = tl.max(tl.where(isnan | (~mask), float("-inf"), v), axis=0)
    first = tl.min(tl.where((v == vmax) & mask, i, _BIG), axis=0)
    res = tl.where(first_nan < _BIG, first_nan, first)
    tl.store(out_ptr + row, res.to(tl.int64))


@triton.jit
def _accept_kernel(d_ptr, t_ptr, dl_ptr, a_ptr, n_ptr, o_ptr, p_ptr, K, L,
                   stride_d, stride_t, stride_o,
                   HAS_DL: tl.constexpr, HAS_OUT: tl.constexpr, ADVANCE: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    kb = K
    if HAS_DL:
        kb = tl.minimum(tl.maximum(tl.load(dl_ptr + b).to(tl.int32), 0), K)
    d = tl.load(d_ptr + b * stride_d + j, mask=j < K, other=0).to(tl.int64)
    t = tl.load(t_ptr + b * stride_t + j, mask=j < K + 1, other=0).to(tl.int64)
    miss = (d != t) | (j >= kb)
    a = tl.min(tl.where(miss, j, BLOCK), axis=0)
    a = tl.minimum(a, kb)
    nxt = tl.sum(tl.where(j == a, t, 0), axis=0)
    tl.store(a_ptr + b, a.to(tl.int64))
    tl.store(n_ptr + b, nxt)
    if HAS_OUT:
        pos = tl.load(p_ptr + b)
        dst = pos + j
        tl.store(o_ptr + b * stride_o + dst, t.to(o_ptr.dtype.element_ty),
                 mask=(j <= a) & (dst < L) & (dst >= 0))
        if ADVANCE:
            tl.store(p_ptr + b, pos + a + 1)


def argmax(logits: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)`` for ``[..., V]`` float logits; int64 ``[...]``."""
    op = "argmax"
    check_tensor("logits", logits, op, dtypes=FLOAT_DTYPES)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"{op}: logits must be [..., V] with V > 0, got {tuple(logits.shape)}")
    if not use_triton(logits):
        return argmax_reference(logits)
    v = logits.shape[-1]
    x2 = logits.reshape(-1, v)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out.reshape(logits.shape[:-1])
    if chunk is None:
        chunk = 4096 if v > 16384 else max(16, min(4096, next_pow2(triton.cdiv(v, 4))))
    chunk = next_pow2(max(16, chunk))
    nc = triton.cdiv(v, chunk)
    vals = torch.empty(rows * nc, dtype=torch.float32, device=logits.device)
    idxs = torch.empty(rows * nc, dtype=torch.int32, device=logits.device)
    _argmax_chunk_kernel[(rows, nc)](x2, vals, idxs, v, x2.stride(0), nc, CHUNK=chunk,
                                     num_warps=8 if chunk >= 4096 else 4, **pdl_args(x2, "argmax"))
    _argmax_final_kernel[(rows,)](vals, idxs, out, nc, BLOCK_C=max(2, next_pow2(nc)), num_warps=4,
                                  **pdl_args(vals, "argmax"))
    return out.reshape(logits.shape[:-1])


def argmax_reference(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


def _check_accept(drafts, target, draft_len, out_tokens, out_pos, op):
    check_tensor("drafts", drafts, op, ndim=2, dtypes=(torch.int64, torch.int32))
    check_tensor("target", target, op, ndim=2, dtypes=(torch.int64, torch.int32))
    bsz, k = drafts.shape
    if tuple(target.shape) != (bsz, k + 1):
        raise ValueError(f"{op}: target must be [B, K + 1] = {(bsz, k + 1)} for drafts "
                         f"{tuple(drafts.shape)}; got {tuple(target.shape)}")
    if draft_len is not None:
        check_tensor("draft_len", draft_len, op, ndim=1, dtypes=(torch.int64, torch.int32))
        if draft_len.shape[0] != bsz:
            raise ValueError(f"{op}: draft_len must be [B={bsz}]")
    if (out_tokens is None) != (out_pos is None):
        raise ValueError(f"{op}: out_tokens and out_pos go together")
    if out_tokens is not None:
        check_tensor("out_tokens", out_tokens, op, ndim=2, dtypes=(torch.int64, torch.int32))
        check_tensor("out_pos", out_pos, op, ndim=1, dtypes=(torch.int64, torch.int32))
        if out_tokens.shape[0] != bsz or out_pos.shape[0] != bsz:
            raise ValueError(f"{op}: out_tokens [B, L] and out_pos [B] need B={bsz}")
        if out_tokens.stride(-1) != 1:
            raise ValueError(f"{op}: out_tokens needs unit stride along L")
    check_same_device(op, drafts=drafts, target=target, draft_len=draft_len,
                      out_tokens=out_tokens, out_pos=out_pos)


def greedy_accept(drafts: torch.Tensor, target: torch.Tensor,
                  draft_len: torch.Tensor | None = None, out_tokens: torch.Tensor | None = None,
                  out_pos: torch.Tensor | None = None, advance: bool = True, opt_in: bool = False):
    """Chain acceptance. drafts ``[B, K]``, target ``[B, K + 1]`` int -> ``(accept_len [B],
    next_token [B])`` int64; optionally writes ``target[b, :a+1]`` to
    ``out_tokens[b, out_pos[b]:]`` and (``advance``) adds ``a + 1`` to ``out_pos`` in place.
    ``opt_in``: under the Triton interpreter on CPU, run the kernel only with
    ``SPECC_KERNELS=triton`` (the runtime's verifier passes True: the interpreter is slow)."""
    op = "greedy_accept"
    _check_accept(drafts, target, draft_len, out_tokens, out_pos, op)
    if not use_triton(drafts, opt_in=opt_in):
        return greedy_accept_reference(drafts, target, draft_len, out_tokens, out_pos, advance)
    bsz, k = drafts.shape
    acc = torch.empty(bsz, dtype=torch.int64, device=drafts.device)
    nxt = torch.empty(bsz, dtype=torch.int64, device=drafts.device)
    if bsz == 0:
        return acc, nxt
    if drafts.stride(-1) != 1:
        drafts = drafts.contiguous()
    if target.stride(-1) != 1:
        target = target.contiguous()
    has_out = out_tokens is not None
    _accept_kernel[(bsz,)](
        drafts, target, draft_len if draft_len is not None else acc, acc, nxt,
        out_tokens if has_out else acc, out_pos if has_out else acc,
        k, out_tokens.shape[1] if has_out else 0,
        drafts.stride(0), target.stride(0), out_tokens.stride(0) if has_out else 0,
        HAS_DL=draft_len is not None, HAS_OUT=has_out, ADVANCE=bool(advance),
        BLOCK=max(2, next_pow2(k + 1)), num_warps=1, **pdl_args(drafts, "accept"),
    )
    return acc, nxt


def greedy_accept_reference(drafts, target, draft_len=None, out_tokens=None, out_pos=None,
                            advance: bool = True):
    bsz, k = drafts.shape
    kb = torch.full((bsz,), k, dtype=torch.int64, device=drafts.device)
    if draft_len is not None:
        kb = draft_len.to(torch.int64).clamp(0, k)
    j = torch.arange(k, device=drafts.device)[None, :]
    miss = (drafts.to(torch.int64) != target[:, :k].to(torch.int64)) | (j >= kb[:, None])
    a = torch.where(miss, j, k).min(dim=1).values if k else torch.zeros(bsz, dtype=torch.int64,
                                                                        device=drafts.device)
    a = torch.minimum(a, kb)
    nxt = target.to(torch.int64).gather(1, a[:, None])[:, 0]
    if out_tokens is not None:
        length = out_tokens.shape[1]
        for b in range(bsz):  # reference: host loop is fine
            p, ab = int(out_pos[b]), int(a[b])
            for jj in range(ab + 1):
                if 0 <= p + jj < length:
                    out_tokens[b, p + jj] = target[b, jj]
            if advance:
                out_pos[b] = p + ab + 1
    return a, nxt


def greedy_verify(logits: torch.Tensor, drafts: torch.Tensor,
                  draft_len: torch.Tensor | None = None, out_tokens: torch.Tensor | None = None,
                  out_pos: torch.Tensor | None = None, advance: bool = True):
    """logits ``[B, K + 1, V]``, drafts ``[B, K]`` -> ``(accept_len, next_token, target)``
    with ``target = argmax(logits)`` ``[B, K + 1]``; see :func:`greedy_accept`."""
    if logits.dim() != 3:
        raise ValueError(f"greedy_verify: logits must be [B, K + 1, V], got {tuple(logits.shape)}")
    target = argmax(logits)
    a, nxt = greedy_accept(drafts, target, draft_len, out_tokens, out_pos, advance)
    return a, nxt, target


def greedy_verify_reference(logits, drafts, draft_len=None, out_tokens=None, out_pos=None,
                            advance: bool = True):
    target = argmax_reference(logits)
    a, nxt = greedy_accept_reference(drafts, target, draft_len, out_tokens, out_pos, advance)
    return a, nxt, target
