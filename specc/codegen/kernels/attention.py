"""Attention of Q new tokens over a static KV cache (decode / verify / parallel drafting).

Semantics are those of ``specc.models.ops.attention`` minus the cache write (done before, e.g.
by :func:`specc.codegen.kernels.rope.rope_and_cache`): the block's ``num_new`` (Qk >= Q) keys
occupy cache slots ``[cache_len[b], cache_len[b] + Qk)`` and its queries are the last Q of them.
Mask kinds (the visibility of cache slot j for query i of row b, with
``c = cache_len[b] + Qk - Q`` the slot of query 0):

* ``"causal"``: ``j <= c + i`` (decoding, chain verification, PARD drafting);
* ``"full"``: ``j < cache_len[b] + Qk`` (DFlash's non-causal block);
* ``"tree"``: slots ``j < c`` always, block slot ``c + t`` iff ``t <= i`` and
  ``tree_mask[(b,) i, t]`` (a ``[Q, Q]`` or ``[B, Q, Q]`` bool/int visibility of the new-token
  block, read as-is without a conversion; tree verification, nodes in topological order, so the
  key tiles after a row block's last query are skipped as for "causal"). The same visibility
  can come packed as bit words (``tree_words``, :mod:`specc.codegen.kernels.tree_mask`: one int32
  per 32 nodes per query row), which the kernel tests with shifts on registers instead of
  loading a byte tile; with words the block's keys form the last split's final tiles, aligned
  with the words (one tile for Q <= BLOCK_N). Generated tree steps pack once per step and pass
  both; :data:`TREE_MASK_FORMAT` (``SPECC_TREE_MASK``: "words", the default, or "bytes") picks
  which one the kernel reads, for measuring one against the other.

Kernel (flash-decoding). GQA is packed into the rows of the tiles: for one KV head the
``Q * G`` (query, head-in-group) pairs are the rows of the Q tile (row r = i * G + g), so every
K/V tile is loaded once per KV head and shared by its G query heads. The KV range of a row is cut
into ``num_splits`` equal parts *in the kernel* from the row's actual length (read from
``cache_len`` on the device: no host sync, CUDA-graph safe), so a single request at context
1k-4k still fills the GPU; each split keeps fp32 online-softmax statistics (running max and sum,
base-2 exponentials) and writes a normalised fp32 partial output and its log-sum-exp; a second
kernel merges the splits, or (``fused_merge``) the last split of each row block to finish merges
them in the split kernel (a per-row-block ticket, as linear's split-K; the counters reset
themselves, so CUDA graphs replay it). With one split the first kernel writes the output
directly. Causal row blocks stop at their last visible key.

The KV splits and the merge are a function of the batch size (:func:`launch_plan`), and both
change a query's summation order: the batch-invariant mode (:mod:`.batch_invariant`) plans them as
for batch 1. Everything else of a program's arithmetic depends on its own request only (its row
block of ``Q * G`` rows, its cache length).

Numerics: scores and softmax statistics in fp32 (no rounding of the scores, unlike the bf16
matmul of the eager reference), probabilities rounded to V's dtype for the PV dot (fp32 under
the interpreter or with fp32 V), fp32 accumulation. A row that sees no key returns zeros.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from specc.codegen.kernels._common import (
    FLOAT_DTYPES,
    INTERPRETED,
    WORKSPACES,
    check_same_device,
    check_tensor,
    next_pow2,
    num_sms,
    round_to,
    use_triton,
)
from specc.codegen.kernels.batch_invariant import enabled as batch_invariant_enabled
from specc.codegen.kernels.pdl import pdl_args, pdl_wait
from specc.codegen.kernels.tree_mask import num_words, unpack_tree_mask
from specc.models.ops import MASK_KINDS  # the one list of mask kinds

__all__ = ["attention", "attention_reference", "attention_visibility", "MASK_KINDS", "pick_splits",
           "launch_plan", "TREE_MASK_FORMATS", "TREE_MASK_FORMAT", "set_tree_mask_format"]

_MASK_IDS = {"causal": 0, "full": 1, "tree": 2}
assert set(_MASK_IDS) == set(MASK_KINDS)
_LOG2E = 1.4426950408889634

TREE_MASK_FORMATS = ("words", "bytes")
# which tree mask the kernel reads when a caller passes both (generated tree steps do): the bit
# words, or the byte mask (kept to measure one against the other; read at each launch, so a CUDA
# graph keeps the format it was captured with)
TREE_MASK_FORMAT = os.environ.get("SPECC_TREE_MASK", "words")
if TREE_MASK_FORMAT not in TREE_MASK_FORMATS:
    raise ValueError(f"SPECC_TREE_MASK must be one of {TREE_MASK_FORMATS}, got {TREE_MASK_FORMAT!r}")


def set_tree_mask_format(fmt: str) -> str:
    """Select the tree mask format the kernel reads ("words" or "bytes"); returns the previous one."""
    global TREE_MASK_FORMAT
    if fmt not in TREE_MASK_FORMATS:
        raise ValueError(f"tree mask format must be one of {TREE_MASK_FORMATS}, got {fmt!r}")
    prev, TREE_MASK_FORMAT = TREE_MASK_FORMAT, fmt
    return prev


@triton.jit
def _attn_tile(qd, m_i, l_i, acc, k_base, v_base, n0, end, q0, qi, mask_r, offs_d, mask_d,
               stride_ks, stride_vs, scale_log2, tree_row,
               MASK: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, num_words=1):
    """One key tile of the online softmax: keys n0 .. n0 + BLOCK_N (before ``end``) under mask
    kind MASK (1: no test beyond the bounds; 2: tree, byte mask rows at ``tree_row``; 3: tree, bit
    words at ``tree_row``, the tile starting at a block key ``n0 - q0`` that is a multiple of
    BLOCK_N; ``num_words`` words per row). Returns the updated (m_i, l_i, acc)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    kv_mask = mask_n[:, None] & mask_d[None, :]
    kt = tl.load(k_base + offs_n.to(tl.int64)[:, None] * stride_ks + offs_d[None, :],
                 mask=kv_mask, other=0.0)
    vt = tl.load(v_base + offs_n.to(tl.int64)[:, None] * stride_vs + offs_d[None, :],
                 mask=kv_mask, other=0.0)
    if DOT_F32:
        s = tl.dot(qd, tl.trans(kt.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(qd, tl.trans(kt.to(qd.dtype)))
    s = s * scale_log2
    vis = mask_n[None, :] & mask_r[:, None]
    if MASK == 0:
        vis = vis & (offs_n[None, :] <= (q0 + qi)[:, None])
    if MASK == 2:
        t = offs_n - q0
        in_blk = t >= 0
        tv = tl.load(tree_row[:, None] + t[None, :], mask=vis & in_blk[None, :], other=0)
        vis = vis & ((~in_blk)[None, :] | ((tv != 0) & (offs_n[None, :] <= (q0 + qi)[:, None])))
    if MASK == 3:
        # the tile's keys are block keys tb .. tb + BLOCK_N (tb >= 0): NW words per query row
        # (one for BLOCK_N <= 32), then a shift and an and per score (packing applied t <= i)
        tb = n0 - q0
        c = tl.arange(0, BLOCK_N)
        w_first = tb // 32
        NW: tl.constexpr = (BLOCK_N + 31) // 32
        word = tl.zeros(s.shape, dtype=tl.int32)
        for j in tl.static_range(NW):
            # (the word bound broadcast to the rows: a scalar mask term fails under the interpreter)
            wj = tl.load(tree_row + w_first + j, mask=mask_r & (qi * 0 + w_first + j < num_words),
                         other=0)
            if NW == 1:
                word = word + wj[:, None]
            else:
                word = tl.where(((tb % 32 + c) // 32 == j)[None, :], wj[:, None], word)
        bit = (word >> ((tb + c) % 32)[None, :]) & 1
        vis = vis & (bit != 0)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if DOT_F32:
        acc = tl.dot(p, vt.to(tl.float32), acc * alpha[:, None], input_precision="ieee")
    else:
        acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None])
    m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _attn_split_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, tree_ptr, o_ptr, part_ptr, lse_ptr, cnt_ptr,
    QN, QK, G, HKV, scale_log2,
    stride_qb, stride_qq, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oq,
    stride_tb, stride_ti, NUM_WORDS,
    D, NUM_SPLITS,
    MASK: tl.constexpr, DIRECT: tl.constexpr, FUSED_MERGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    DOT_F32: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl_wait(PDL)
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_r = rows < QN * G
    qi = rows // G
    h = hk * G + rows % G
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    q_offs = b.to(tl.int64) * stride_qb + qi[:, None] * stride_qq + h[:, None] * stride_qh \
        + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=mask_r[:, None] & mask_d[None, :], other=0.0)

    clen = tl.load(len_ptr + b).to(tl.int32)
    kv_end = clen + QK
    q0 = kv_end - QN  # cache slot of query 0
    last_q = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, QN * G - 1) // G
    if MASK == 3:
        # tree with bit words: splits of kv_end / NUM_SPLITS keys as for the other kinds (the
        # same balance), except that the block's keys all go to the last split, in tiles from q0
        # (aligned with the words; one tile for Q <= BLOCK_N), up to this row block's last query;
        # the other splits stop at q0
        split_len = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = pid_s * split_len
        end = q0 + last_q + 1
    else:
        split_len = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = pid_s * split_len
        end = tl.minimum(start + split_len, kv_end)
        if MASK != 1:  # causal and tree: no key after this row block's last query (a tree's
            # nodes are in topological order, so a node's ancestors sit at or before its own slot)
            end = tl.minimum(end, q0 + last_q + 1)

    k_base = k_ptr + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    if DOT_F32:
        qd = q.to(tl.float32)
    else:
        qd = q
    # key tiles wholly before the block (the committed cache) need no causal/tree test: they
    # run without it; the tiles from the block's first key on apply the mask kind
    if MASK == 1:
        mid = start
        c_end = end
        b_start = mid
    elif MASK == 3:
        mid = tl.minimum(start + split_len, q0)  # committed tiles, cut at q0 (the last split's
        # range ends past q0: it takes the committed keys left before the block)
        c_end = mid
        b_start = tl.where(pid_s == NUM_SPLITS - 1, q0, end)
    else:
        mid = tl.minimum(start + (tl.maximum(q0 - start, 0) // BLOCK_N) * BLOCK_N, end)
        c_end = end
        b_start = mid
    tree_row = tree_ptr + b.to(tl.int64) * stride_tb + qi * stride_ti
    for n0 in range(start, mid, BLOCK_N):
        m_i, l_i, acc = _attn_tile(qd, m_i, l_i, acc, k_base, v_base, n0, c_end, q0, qi, mask_r, offs_d,
                                   mask_d, stride_ks, stride_vs, scale_log2, tree_row,
                                   MASK=1, BLOCK_N=BLOCK_N, DOT_F32=DOT_F32)
    for n0 in range(b_start, end, BLOCK_N):
        m_i, l_i, acc = _attn_tile(qd, m_i, l_i, acc, k_base, v_base, n0, end, q0, qi, mask_r, offs_d,
                                   mask_d, stride_ks, stride_vs, scale_log2, tree_row,
                                   MASK=MASK, BLOCK_N=BLOCK_N, DOT_F32=DOT_F32, num_words=NUM_WORDS)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if DIRECT:
        o_offs = b.to(tl.int64) * stride_ob + qi[:, None] * stride_oq + h[:, None] * D \
            + offs_d[None, :]
        tl.store(o_ptr + o_offs, round_to(out, o_ptr.dtype.element_ty),
                 mask=mask_r[:, None] & mask_d[None, :])
    else:
        # partials [B, QN, Hq, NUM_SPLITS, D] fp32 and lse [B, QN, Hq, NUM_SPLITS] (base 2)
        hq = HKV * G
        prow = ((b * QN + qi) * hq + h).to(tl.int64) * NUM_SPLITS + pid_s
        tl.store(part_ptr + prow[:, None] * D + offs_d[None, :], out,
                 mask=mask_r[:, None] & mask_d[None, :])
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(lse_ptr + prow, lse, mask=mask_r)
        if FUSED_MERGE:
            # the last split of this row block to finish merges all splits (ticket on a
            # per-row-block counter, as in linear's split-K): no second launch
            tl.debug_barrier()
            tile = pid_bh * tl.num_programs(2) + pid_m
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if ticket == NUM_SPLITS - 1:
                row0 = prow - pid_s  # split 0 of each row
                offs_s = tl.arange(0, BLOCK_S)
                all_lse = tl.load(lse_ptr + row0[:, None] + offs_s[None, :],
                                  mask=mask_r[:, None] & (offs_s < NUM_SPLITS)[None, :],
                                  other=float("-inf"), cache_modifier=".cg")
                mx = tl.max(all_lse, axis=1)
                mx = tl.where(mx == float("-inf"), 0.0, mx)
                den = tl.sum(tl.exp2(all_lse - mx[:, None]), axis=1)
                merged = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
                pmask = mask_r[:, None] & mask_d[None, :]
                for s in range(0, NUM_SPLITS):
                    w = tl.exp2(tl.load(lse_ptr + row0 + s, mask=mask_r, other=float("-inf"),
                                        cache_modifier=".cg") - mx)
                    pt = tl.load(part_ptr + (row0 + s)[:, None] * D + offs_d[None, :], mask=pmask,
                                 other=0.0, cache_modifier=".cg")
                    merged += pt * w[:, None]
                merged = merged / tl.where(den > 0.0, den, 1.0)[:, None]
                o_offs = b.to(tl.int64) * stride_ob + qi[:, None] * stride_oq + h[:, None] * D \
                    + offs_d[None, :]
                tl.store(o_ptr + o_offs, round_to(merged, o_ptr.dtype.element_ty), mask=pmask)
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


@triton.jit
def _attn_merge_kernel(part_ptr, lse_ptr, o_ptr, QN, HQ, D, stride_ob, stride_oq, NUM_SPLITS,
                       BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)
    pid = tl.program_id(0)  # (b * QN + qi) * HQ + h
    h = pid % HQ
    bq = pid // HQ
    qi = bq % QN
    b = bq // QN
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    mask_d = offs_d < D
    base = pid.to(tl.int64) * NUM_SPLITS
    lse = tl.load(lse_ptr + base + offs_s, mask=mask_s, other=float("-inf"))
    mx = tl.max(lse, axis=0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx)
    den = tl.sum(w, axis=0)
    part = tl.load(part_ptr + (base + offs_s)[:, None] * D + offs_d[None, :],
                   mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(part * w[:, None], axis=0) / tl.where(den > 0.0, den, 1.0)
    o_offs = b.to(tl.int64) * stride_ob + qi * stride_oq + h * D + offs_d
    tl.store(o_ptr + o_offs, round_to(out, o_ptr.dtype.element_ty), mask=mask_d)


BATCHED_FROM = 8  # the batch from which the batched rule plans (the batched sweep's smallest B)
BATCHED_MIN_ROWS = 16  # ... at verify blocks of this many query rows per KV head up (Q >= 4 at G = 4)
BATCHED_ROWS_PER_SM = 48  # split programs x their query rows per SM (fitted, see pick_splits)


def batched_plan(batch: int, rows: int) -> bool:
    """Whether the batched rule plans this call (the swept range: batched verify blocks; a
    batched decode step keeps the bs1 rule, which it was not swept against)."""
    return batch >= BATCHED_FROM and rows >= BATCHED_MIN_ROWS


@contextlib.contextmanager
def bs1_plan_rule():
    """Plan every call with the bs1 rule while inside (the rule before the batched sweep): what
    benchmarks time beside the batched rule and what tests price measurements taken before it
    with. A CUDA graph captured inside keeps the plan it captured."""
    global BATCHED_FROM
    saved, BATCHED_FROM = BATCHED_FROM, 10 ** 9
    try:
        yield
    finally:
        BATCHED_FROM = saved


def pick_splits(batch: int, num_kv_heads: int, row_blocks: int, max_kv_len: int,
                device: torch.device, block_n: int = 64, rows: int = 1, sms: int | None = None) -> int:
    """KV splits: ~4 programs per SM, at least ``block_n`` keys per split, and the fp32 partial
    outputs (``rows`` query rows per KV head, written and merged once per split) at most about
    half the K/V bytes they save: ``splits <= kv_len / (4 * rows)``, unless that leaves fewer
    than ~3/4 of a program per SM (short caches and many rows: Q = 16 at 1k context).

    H200 sweep (``examples/sweep_attention.py``, bs 1, Hq 32, Hkv 8, D 128, docs/benchmarks/
    steps-h200.md): at cache capacity 4224 this picks the fastest or within 3% of it for Q = 1
    to 64; at 1152 the traffic bound alone picked 4 / 2 / 1 splits for Q = 16 / 32 / 64
    (13.3 / 16.5 / 22.5 us) where 12 / 8 / 4 were fastest (11.3 / 13.6 / 15.5 us); the SM floor
    gives 12 / 6 / 3. ``sms``: the SM count to plan for (default: the device's; the cost model
    passes a deployment's).

    Batched verify blocks (:func:`batched_plan`: ``BATCHED_FROM`` rows of batch, ``BATCHED_MIN_ROWS``
    query rows per KV head) plan differently: the programs nearly fill the SMs on their own and the
    partials cost more than the parallelism gains: one split once the programs reach the SM
    count, else ``round(48 * sms / (programs * rows))`` (the split programs' query rows about
    48 per SM). H200 batched sweep (B = 8 / 16 / 32 x Q = 4 / 8 / 16, capacity 1152, fused
    merge; docs/benchmarks/h200-run8.md): within 3% of the fastest plan at every point, where the
    bs1 rule was 1.18-2.47x slower (B = 16, Q = 16: 4 splits 56 us, 1 split 25 us per layer)."""
    programs = max(batch * num_kv_heads * row_blocks, 1)
    sms = num_sms(device) if sms is None else int(sms)
    cap = max(1, triton.cdiv(max_kv_len, block_n))
    if batched_plan(batch, rows):
        if programs >= sms:
            return 1
        return int(max(1, min(round(BATCHED_ROWS_PER_SM * sms / (programs * max(rows, 1))), cap, 128)))
    want = triton.cdiv(4 * sms, programs)
    traffic_cap = max(1, max_kv_len // (4 * max(rows, 1)), (3 * sms) // (4 * programs))
    return int(max(1, min(want, cap, traffic_cap, 128)))


def launch_plan(bsz: int, num_q: int, num_heads: int, num_kv_heads: int, head_dim: int,
                max_kv_len: int, device: torch.device, block_n: int | None = None,
                block_m: int | None = None, sms: int | None = None) -> dict:
    """Tile sizes and KV splits :func:`attention` uses (also for cost models and sweeps; ``sms``
    plans for that many SMs instead of the device's). The tiles follow the per-request query rows
    only; in the batch-invariant mode (:mod:`.batch_invariant`) the splits and the merge are
    planned as for batch 1 too, so a request's bits do not depend on its batch."""
    if batch_invariant_enabled():
        bsz = 1
    rows = num_q * (num_heads // num_kv_heads)
    if block_m is None:
        block_m = 16 if rows <= 16 else (32 if rows <= 32 else 64)
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"attention: block_m must be a power of two >= 16, got {block_m}")
    if block_n is None:
        block_n = 64 if head_dim <= 128 else 32
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"attention: block_n must be a power of two >= 16, got {block_n}")
    row_blocks = triton.cdiv(rows, block_m)
    return {"block_m": block_m, "block_n": block_n, "block_d": max(16, next_pow2(head_dim)),
            "row_blocks": row_blocks, "num_stages": 3 if block_m >= 64 else 2,
            # the last split merges in the kernel from 256 query rows per KV head up (Q = 64 with
            # G = 4: 12% faster on the H200 at both swept capacities; slower or equal below), and
            # always in batched plans (faster at 2-8 splits at every batched point swept)
            "fused_merge": rows >= 256 or batched_plan(bsz, rows),
            "num_splits": pick_splits(bsz, num_kv_heads, row_blocks, max_kv_len, device, block_n,
                                      rows, sms)}


def _check(q, cache_k, cache_v, cache_len, num_new, mask_kind, tree_mask, op, tree_words=None):
    check_tensor("q", q, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_k", cache_k, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_v", cache_v, op, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("cache_len", cache_len, op, ndim=1, dtypes=(torch.int64, torch.int32))
    bsz, num_q, hq, d = q.shape
    bmax, hkv, s, dk = cache_k.shape
    if tuple(cache_v.shape) != tuple(cache_k.shape):
        raise ValueError(f"{op}: cache_v shape {tuple(cache_v.shape)} != cache_k shape "
                         f"{tuple(cache_k.shape)}")
    if dk != d:
        raise ValueError(f"{op}: q head dim {d} != cache head dim {dk}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"{op}: {hq} query heads are not a multiple of {hkv} KV heads")
    if bsz > bmax:
        raise ValueError(f"{op}: batch {bsz} exceeds the cache's {bmax} rows")
    if cache_len.shape[0] != bsz:
        raise ValueError(f"{op}: cache_len has {cache_len.shape[0]} entries for batch {bsz}")
    if not isinstance(num_new, int) or num_new < num_q:
        raise ValueError(f"{op}: num_new must be an int >= Q={num_q}, got {num_new!r}")
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"{op}: unknown mask kind {mask_kind!r} (known: {MASK_KINDS})")
    if mask_kind == "tree":
        if tree_mask is None and tree_words is None:
            raise ValueError(f"{op}: mask kind 'tree' needs tree_mask [Q, Q] or [B, Q, Q]")
        width = num_words(num_q)
        if tree_words is not None and (
                tree_words.dtype != torch.int32 or tree_words.dim() not in (2, 3)
                or tuple(tree_words.shape[-2:]) != (num_q, width)
                or (tree_words.dim() == 3 and tree_words.shape[0] != bsz)):
            raise ValueError(f"{op}: tree_words must be int32 [Q, W] or [B, Q, W] with Q={num_q}, "
                             f"W={width}, B={bsz}; got {tree_words.dtype} {tuple(tree_words.shape)}")
        if tree_mask is not None and (
                tree_mask.dim() not in (2, 3) or tuple(tree_mask.shape[-2:]) != (num_q, num_q)
                or (tree_mask.dim() == 3 and tree_mask.shape[0] != bsz)):
            raise ValueError(f"{op}: tree_mask must be [Q, Q] or [B, Q, Q] with Q={num_q}, B={bsz}; "
                             f"got {tuple(tree_mask.shape)}")
    elif tree_mask is not None or tree_words is not None:
        raise ValueError(f"{op}: tree_mask / tree_words are only used with mask kind 'tree'")
    check_same_device(op, q=q, cache_k=cache_k, cache_v=cache_v, cache_len=cache_len,
                      tree_mask=tree_mask, tree_words=tree_words)


def attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              cache_len: torch.Tensor, num_new: int, mask_kind: str, scale: float,
              tree_mask: torch.Tensor | None = None, num_splits: int | None = None,
              max_kv_len: int | None = None, out: torch.Tensor | None = None,
              block_n: int | None = None, num_warps: int = 4,
              num_stages: int | None = None, block_m: int | None = None,
              fused_merge: bool | None = None,
              tree_words: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q ``[B, Q, Hq, D]`` over ``cache_k/v [Bmax, Hkv, S, D]`` (new keys written).

    cache_len: ``[B]`` int committed lengths (device tensor; never read on the host); num_new:
    Qk, the number of new keys in slots ``cache_len + [0, Qk)``; mask_kind: "causal" | "full" |
    "tree" (with ``tree_mask``). num_splits: KV splits per row (default from ``max_kv_len``, the
    longest expected ``cache_len + Qk``, default the cache capacity S). Returns ``[B, Q, Hq*D]``
    in q's dtype (into ``out`` if given, a contiguous tensor of that shape). block_n (keys per
    tile, default 64), block_m (query rows per tile), num_warps and num_stages are tuning knobs
    of the split kernel; fused_merge: the last split of each row block merges the splits (one
    launch) instead of a second merge kernel. Defaults: :func:`launch_plan`. tree_words: the tree
    visibility as :func:`~specc.codegen.kernels.tree_mask.pack_tree_mask` words (int32
    ``[(B,) Q, ceil(Q / 32)]``), instead of or with ``tree_mask``; with both,
    :data:`TREE_MASK_FORMAT` picks the one read.
    """
    op = "attention"
    _check(q, cache_k, cache_v, cache_len, num_new, mask_kind, tree_mask, op, tree_words)
    if tree_words is not None and (tree_mask is None or TREE_MASK_FORMAT == "words"):
        tree_mask = None
    elif tree_words is not None:
        tree_words = None
    bsz, num_q, hq, d = q.shape
    _, hkv, s_cap, _ = cache_k.shape
    if out is None:
        out = torch.empty(bsz, num_q, hq * d, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (bsz, num_q, hq * d) or not out.is_contiguous() or out.dtype != q.dtype:
        raise ValueError(f"{op}: out must be a contiguous {q.dtype} tensor of shape "
                         f"{(bsz, num_q, hq * d)}")
    if not use_triton(q):
        out.copy_(attention_reference(q, cache_k, cache_v, cache_len, num_new, mask_kind, scale,
                                      tree_mask, tree_words=tree_words))
        return out
    if bsz == 0 or num_q == 0:
        return out
    if q.stride(-1) != 1 or cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError(f"{op}: q and the caches need unit stride along the head dim")
    g = hq // hkv
    kv_hint = min(s_cap, max_kv_len) if max_kv_len is not None else s_cap
    plan = launch_plan(bsz, num_q, hq, hkv, d, kv_hint, q.device, block_n, block_m)
    block_m, block_n, block_d = plan["block_m"], plan["block_n"], plan["block_d"]
    row_blocks = plan["row_blocks"]
    if num_splits is None:
        num_splits = plan["num_splits"]
    num_splits = int(max(1, num_splits))
    if num_stages is None:
        num_stages = plan["num_stages"]
    fused_merge = plan["fused_merge"] if fused_merge is None else bool(fused_merge)
    mask_id = _MASK_IDS[mask_kind]
    if tree_words is not None:
        tm = tree_words.unsqueeze(0).expand(bsz, -1, -1) if tree_words.dim() == 2 else tree_words
        if tm.stride(2) != 1:
            tm = tm.contiguous()
        stride_tb, stride_ti = tm.stride(0), tm.stride(1)
        mask_id = 3
    elif tree_mask is not None:
        # bool -> uint8 is a view (same bytes): no conversion kernel per layer
        tm = tree_mask.view(torch.uint8) if tree_mask.dtype == torch.bool else tree_mask
        if tm.dim() == 2:
            tm = tm.unsqueeze(0).expand(bsz, -1, -1)
        stride_tb, stride_ti = tm.stride(0), tm.stride(1)
        if tm.stride(2) != 1:
            tm = tm.contiguous()
            stride_tb, stride_ti = tm.stride(0), tm.stride(1)
    else:
        tm, stride_tb, stride_ti = cache_len, 0, 0
    if num_splits > 1:
        part = torch.empty(bsz * num_q * hq * num_splits * d, dtype=torch.float32, device=q.device)
        lse = torch.empty(bsz * num_q * hq * num_splits, dtype=torch.float32, device=q.device)
    else:
        part = lse = out
    fused_merge = fused_merge and num_splits > 1
    cnt = WORKSPACES.get("attention.cnt", q.device, bsz * hkv * row_blocks, torch.int32) \
        if fused_merge else cache_len  # unused
    dot_f32 = INTERPRETED or q.dtype == torch.float32 or cache_v.dtype == torch.float32 \
        or q.dtype != cache_k.dtype
    grid = (bsz * hkv, num_splits, row_blocks)
    _attn_split_kernel[grid](
        q, cache_k, cache_v, cache_len, tm, out, part, lse, cnt,
        num_q, num_new, g, hkv, float(scale) * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        out.stride(0), out.stride(1),
        stride_tb, stride_ti, num_words(num_q),
        d, num_splits,
        MASK=mask_id, DIRECT=num_splits == 1, FUSED_MERGE=fused_merge,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        BLOCK_S=max(2, next_pow2(num_splits)), DOT_F32=dot_f32,
        num_warps=num_warps, num_stages=num_stages, **pdl_args(q, "attention"),
    )
    if num_splits > 1 and not fused_merge:
        _attn_merge_kernel[(bsz * num_q * hq,)](
            part, lse, out, num_q, hq, d, out.stride(0), out.stride(1), num_splits,
            BLOCK_S=max(2, next_pow2(num_splits)), BLOCK_D=block_d,
            num_warps=4, **pdl_args(part, "attention"),
        )
    return out


def attention_visibility(cache_len: torch.Tensor, num_queries: int, num_new_keys: int,
                         kv_len: int, mask_kind: str,
                         tree_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean visibility ``[B, 1, Q, kv_len]`` (``ops.attention_mask`` plus the tree kind)."""
    device = cache_len.device
    key_pos = torch.arange(kv_len, device=device)[None, None, :]
    end = (cache_len + num_new_keys)[:, None, None]
    visible = key_pos < end
    q0 = (cache_len + num_new_keys - num_queries)[:, None, None]
    query_pos = q0 + torch.arange(num_queries, device=device)[None, :, None]
    if mask_kind == "causal":
        visible = visible & (key_pos <= query_pos)
    elif mask_kind == "full":
        visible = visible.expand(-1, num_queries, -1)
    elif mask_kind == "tree":
        tm = tree_mask.bool()
        if tm.dim() == 2:
            tm = tm.unsqueeze(0).expand(cache_len.shape[0], -1, -1)
        t = key_pos - q0  # [B, 1, kv]
        in_blk = (t >= 0) & (t < num_queries)
        tv = torch.gather(tm, 2, t.clamp(0, num_queries - 1).expand(-1, num_queries, -1))
        visible = visible & (~in_blk | (tv & (key_pos <= query_pos)))
    else:
        raise ValueError(f"unknown mask kind {mask_kind!r} (known: {MASK_KINDS})")
    return visible[:, None]


def attention_reference(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                        cache_len: torch.Tensor, num_new: int, mask_kind: str, scale: float,
                        tree_mask: torch.Tensor | None = None,
                        tree_words: torch.Tensor | None = None) -> torch.Tensor:
    """Pure torch, fp32 math (syncs on cache_len). Same semantics as :func:`attention`."""
    _check(q, cache_k, cache_v, cache_len, num_new, mask_kind, tree_mask, "attention_reference",
           tree_words)
    if tree_mask is None and tree_words is not None:
        tree_mask = unpack_tree_mask(tree_words, q.shape[1])
    bsz, num_q, hq, d = q.shape
    hkv = cache_k.shape[1]
    kv_len = int((cache_len + num_new).max()) if bsz else 0
    keys = cache_k[:bsz, :, :kv_len].float()
    values = cache_v[:bsz, :, :kv_len].float()
    g = hq // hkv
    if g > 1:
        keys = keys.repeat_interleave(g, dim=1)
        values = values.repeat_interleave(g, dim=1)
    vis = attention_visibility(cache_len, num_q, num_new, kv_len, mask_kind, tree_mask)
    scores = torch.matmul(q.float().transpose(1, 2), keys.transpose(2, 3)) * scale
    scores = scores.masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    o = torch.matmul(probs, values)  # [B, Hq, Q, D]
    return o.transpose(1, 2).reshape(bsz, num_q, hq * d).to(q.dtype)
