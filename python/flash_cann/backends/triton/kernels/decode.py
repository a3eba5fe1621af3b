"""The decoding kernel over a KV cache with GQA: a tile's rows are the (query head,
position) pairs of one kv head's group, so each K/V block is read once per group
instead of once per query head. The loop over key blocks is the forward's.

Split-KV (flash-decoding): when batch x kv heads x row blocks cannot fill the GPU (a
long context at batch 1), each (sequence, kv head) also splits its keys into ``splits``
contiguous ranges of whole key blocks, one program each; a program writes its range's
normalised out and lse (fp32, no sink) to a workspace, and attn_decode_combine merges
the ranges lse-weighted in a fixed order, the sink joining once there. Every output
element has one writer and one summation order: bitwise repeatable."""

from __future__ import annotations

import triton
import triton.language as tl

from .forward import fwd_key_blocks, softmax_start
from .tiles import (LN2, assert_tiles, heads_view, packed_tile, sequence, tile_index,
                    tiles_of_program)


@triton.jit
def decode_key_range(len_q, len_k, diagonal, window_left, window_right, BLOCK_N: tl.constexpr,
                     LEFT_BOUNDED: tl.constexpr, CAUSAL: tl.constexpr):
    """[start, end) of the keys some row of a decode tile sees: from the first position's
    left window bound (rounded down to a key block) to the last position's right bound.
    The one place a decode tile's key range is decided; the splits divide this range."""
    start = len_k * 0
    if LEFT_BOUNDED:
        start = tl.maximum(diagonal - window_left, 0) // BLOCK_N * BLOCK_N
    end = tl.minimum(len_k, len_q + diagonal + window_right) if CAUSAL else len_k
    return start, end


@triton.jit
def split_key_range(start, end, split, splits, BLOCK_N: tl.constexpr):
    """Split ``split``'s part of the keys [start, end) (start a key block's first key):
    ``splits`` runs of the same number of whole key blocks, the last ones shorter or
    empty (lo >= hi). Splits outside a window's band are empty: the range is the band's."""
    blocks = tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)
    span = tl.cdiv(blocks, splits) * BLOCK_N
    lo = start + split * span
    return lo, tl.minimum(end, lo + span)


@triton.jit
def _decode_tile(Q, K, V, Out, Lse, block, h_kv, b, split, splits,
                 stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                 stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                 stride_os, stride_od, heads_q, group, seqlen_q, seqlen_k, qk_scale,
                 window_left, window_right, softcap, Alibi, alibi_stride_b, SeqUsedK,
                 BlockTable, block_table_stride, page_size, CacheBatchIdx, Sinks, CuSeqQ,
                 LeftPad, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                 PAGED: tl.constexpr, BATCH_IDX: tl.constexpr, SINKS: tl.constexpr,
                 VARLEN: tl.constexpr, LEFTPAD: tl.constexpr):
    """Decoding over a KV cache with GQA: the rows of a tile are the (query
    head of kv head h_kv's group, position) pairs of sequence b, group-major, so each K/V
    block is read once for the whole group rather than once per query head. A few rows
    per head, so every key block is masked per row (causal and windows by position).
    VARLEN: q, out and lse are packed (TND), sequence b's rows from cu_seqlens_q.
    ``split`` of ``splits``: this program's part of the keys (split_key_range); Out and
    Lse already point at its part of the workspace when splits > 1."""
    q_start, len_q, k_start, len_k = sequence(b, seqlen_q, seqlen_k, CuSeqQ, None, SeqUsedK,
                                              LeftPad, VARLEN, True, LEFTPAD)
    q_b = b * 0 if VARLEN else b  # q's batch index: packed rows are rows of batch 0
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < group * len_q
    heads = h_kv * group + rows // tl.maximum(len_q, 1)
    positions = rows % tl.maximum(len_q, 1)
    q_rows = q_start + positions
    diagonal = len_k - len_q
    cols = tl.arange(0, BLOCK_D)
    cols_ok = cols[None, :] < HEAD_DIM
    q_ptrs = (Q + q_b.to(tl.int64) * stride_qb + heads.to(tl.int64)[:, None] * stride_qh
              + q_rows.to(tl.int64)[:, None] * stride_qs + cols[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=valid[:, None] & cols_ok, other=0.0)
    cache_b = tl.load(CacheBatchIdx + b) if BATCH_IDX else b
    # Pages are looked up per key from the first key (load_keys); a cache row's view
    # starts at it.
    first = k_start.to(tl.int64) * 0 if PAGED else k_start.to(tl.int64)
    k_view = heads_view(K + first * stride_ks, stride_kb, stride_kh, stride_ks,
                        cache_b * 0 if PAGED else cache_b, h_kv, 1, len_k, HEAD_DIM, BLOCK_N,
                        BLOCK_D, False)
    v_view = heads_view(V + first * stride_vs, stride_vb, stride_vh, stride_vs,
                        cache_b * 0 if PAGED else cache_b, h_kv, 1, len_k, HEAD_DIM, BLOCK_N,
                        BLOCK_D, False)
    table_row = BlockTable + b.to(tl.int64) * block_table_stride if PAGED else BlockTable
    slope = tl.load(Alibi + b * alibi_stride_b + heads, mask=valid, other=0.0)[:, None] \
        if ALIBI else 0.0
    # Each row starts from its own head's sink (rows past the group's read head h_kv's
    # first: valid, and masked at the store).
    m_i, l_i = softmax_start(Sinks, tl.where(valid, heads, h_kv * group), BLOCK_M, SINKS)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Stage: the keys some position sees (positions from the sequence's first key), this
    # split's part of them, every block masked per row.
    start, end = decode_key_range(len_q, len_k, diagonal, window_left, window_right, BLOCK_N,
                                  LEFT_BOUNDED, CAUSAL)
    start, end = split_key_range(start, end, split, splits, BLOCK_N)
    # A tile past the sequence's rows (packed sequences of different lengths) reads none.
    end = tl.where(block * BLOCK_M < group * len_q, end, start)
    acc, l_i, m_i = fwd_key_blocks(
        acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
        stride_vd, None, 0, positions, start, end, len_k, diagonal, qk_scale, window_left,
        window_right, softcap, slope, 0, 0, b, 0, 0, 1.0, table_row, page_size, k_start,
        HEAD_DIM,
        BLOCK_N, BLOCK_D, True, CAUSAL, False, False, False, LEFT_BOUNDED, SOFTCAP, ALIBI,
        False, PAGED)
    # Epilogue: as _fwd_tile's, each row to its head and position.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o_ptrs = (Out + q_b.to(tl.int64) * stride_ob + heads.to(tl.int64)[:, None] * stride_oh
              + q_rows.to(tl.int64)[:, None] * stride_os + cols[None, :] * stride_od)
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty),
             mask=valid[:, None] & cols_ok)
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    tl.store(Lse + (q_b.to(tl.int64) * heads_q + heads) * seqlen_q + q_rows, lse, mask=valid)


@triton.jit(do_not_specialize=["batch", "heads_q", "group", "seqlen_q", "seqlen_k",
                               "seqlen_q_bucket", "seqlen_k_bucket", "window_left",
                               "window_right", "alibi_stride_b", "block_table_stride",
                               "page_size", "max_seqlen_q", "split_stride_o",
                               "split_stride_lse"])
def attn_decode(Q, K, V, Out, Lse,
                stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                stride_os, stride_od,
                batch, heads_q, group, seqlen_q, seqlen_k, qk_scale,
                seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                PERSISTENT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                window_left=0, window_right=0, softcap=1.0, Alibi=None, alibi_stride_b=0,
                SeqUsedK=None, BlockTable=None, block_table_stride=0, page_size=1,
                CacheBatchIdx=None, Sinks=None, CuSeqQ=None, max_seqlen_q=1, LeftPad=None,
                splits=1, split_stride_o=0, split_stride_lse=0,
                LEFT_BOUNDED: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
                ALIBI: tl.constexpr = False, PAGED: tl.constexpr = False,
                BATCH_IDX: tl.constexpr = False, SINKS: tl.constexpr = False,
                VARLEN: tl.constexpr = False, LEFTPAD: tl.constexpr = False,
                PACKED_TILES: tl.constexpr = False, BATCH_BLOCK: tl.constexpr = 1):
    """Tiles (blocks of group x seqlen_q rows, heads_kv, batch; PERSISTENT as in
    forward.attn_fwd): out and lse of one block of a kv head's (query head, position)
    rows, reading sequence b's first SeqUsedK[b] cache entries. The arguments after
    BLOCK_N as in forward.attn_fwd (no dropout nor padding mask: flash_attn_with_kvcache
    has none; VARLEN: packed queries, the grid covering max_seqlen_q rows a head);
    splits > 1: split-KV, each split's out and lse going to Out + split * split_stride_o
    and Lse + split * split_stride_lse (fp32 workspaces shaped as out and lse, for
    attn_decode_combine; the host passes no sinks then). PACKED_TILES (with VARLEN, not
    PERSISTENT): the grid's first axis is a bound on the real row blocks x splits and its
    last 1, each program finding its sequence and block by walking cu_seqlens_q
    (tiles.packed_tile; BATCH_BLOCK >= batch), not max_seqlen_q's blocks for every
    sequence (a vLLM batch is mostly one-token rows beside a long prefill chunk)."""
    assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(group * (max_seqlen_q if VARLEN else seqlen_q), BLOCK_M) * splits
    heads_kv = heads_q // group
    first, end, step = tiles_of_program(blocks * heads_kv * batch, PERSISTENT)
    for tile in range(first, end, step):
        block_split, h_kv, b = tile_index(tile, blocks, heads_kv, PERSISTENT)
        # A block's splits are neighbours in the grid: they start together.
        block = block_split // splits
        split = block_split % splits
        if PACKED_TILES:
            b, block = packed_tile(block, CuSeqQ, batch, group, BLOCK_M, BATCH_BLOCK)
        _decode_tile(Q, K, V, Out + split.to(tl.int64) * split_stride_o,
                     Lse + split.to(tl.int64) * split_stride_lse, block, h_kv, b, split, splits,
                     stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                     stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                     stride_os, stride_od, heads_q, group, seqlen_q, seqlen_k, qk_scale,
                     window_left, window_right, softcap, Alibi, alibi_stride_b, SeqUsedK,
                     BlockTable, block_table_stride, page_size, CacheBatchIdx, Sinks, CuSeqQ,
                     LeftPad, HEAD_DIM, BLOCK_D, CAUSAL, BLOCK_M, BLOCK_N, LEFT_BOUNDED, SOFTCAP,
                     ALIBI, PAGED, BATCH_IDX, SINKS, VARLEN, LEFTPAD)


@triton.jit(do_not_specialize=["rows", "heads_q", "seqlen_q"])
def attn_decode_combine(OutParts, LseParts, Out, Lse, Sinks, rows, heads_q, seqlen_q, splits,
                        stride_ob, stride_oh, stride_os, stride_od,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                        SINKS: tl.constexpr):
    """Split-KV's second pass: BLOCK_R rows (b, h, position), numbered as lse's, of the
    fp32 workspaces OutParts (splits, rows, HEAD_DIM) and LseParts (splits, rows) merged
    into out and lse: out = sum_s w_s out_s / sum_s w_s with w_s = exp(lse_s - m), m the
    largest lse_s, splits in order (deterministic). The sink joins here, once: a term
    exp(sink - m) of the sum with no value. A row no split saw and without a sink gets
    out 0, lse -inf."""
    rows_here = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows_here < rows
    r64 = rows_here.to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = valid[:, None] & (cols[None, :] < HEAD_DIM)
    heads = rows_here // seqlen_q % heads_q
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    if SINKS:
        sink = tl.load(Sinks + heads, mask=valid, other=0.0).to(tl.float32)
        m = sink
    for split in range(splits):
        m = tl.maximum(m, tl.load(LseParts + split * rows + r64, mask=valid,
                                  other=float("-inf")))
    # Rows with m = -inf saw nothing: subtract 0 so every weight is exp(-inf) = 0.
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_R], tl.float32)
    if SINKS:
        total = tl.exp(sink - m_sub)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for split in range(splits):
        part = split * rows + r64
        weight = tl.exp(tl.load(LseParts + part, mask=valid, other=float("-inf")) - m_sub)
        total += weight
        acc += weight[:, None] * tl.load(OutParts + part[:, None] * HEAD_DIM + cols[None, :],
                                         mask=mask, other=0.0)
    seen = total > 0.0
    total_safe = tl.where(seen, total, 1.0)
    b = rows_here // (seqlen_q * heads_q)
    positions = rows_here % seqlen_q
    o_ptrs = (Out + b.to(tl.int64)[:, None] * stride_ob + heads.to(tl.int64)[:, None] * stride_oh
              + positions.to(tl.int64)[:, None] * stride_os + cols[None, :] * stride_od)
    tl.store(o_ptrs, (acc / total_safe[:, None]).to(Out.dtype.element_ty), mask=mask)
    tl.store(Lse + r64, tl.where(seen, m_sub + tl.log(total_safe), float("-inf")), mask=valid)
