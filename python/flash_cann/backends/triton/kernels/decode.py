"""The decoding kernel over a KV cache with GQA: a tile's rows are the (query head,
position) pairs of one kv head's group, so each K/V block is read once per group
instead of once per query head. The loop over key blocks is the forward's."""

from __future__ import annotations

import triton
import triton.language as tl

from .forward import fwd_key_blocks, softmax_start
from .tiles import LN2, assert_tiles, heads_view, sequence, tile_index, tiles_of_program


@triton.jit
def _decode_tile(Q, K, V, Out, Lse, block, h_kv, b,
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
    VARLEN: q, out and lse are packed (TND), sequence b's rows from cu_seqlens_q."""
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
    # Stage: the keys some position sees (the first position's left bound, the last
    # position's right bound), every block masked per row.
    start = 0
    if LEFT_BOUNDED:
        start = tl.maximum(diagonal - window_left, 0) // BLOCK_N * BLOCK_N
    end = tl.minimum(len_k, len_q + diagonal + window_right) if CAUSAL else len_k
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
                               "page_size", "max_seqlen_q"])
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
                LEFT_BOUNDED: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
                ALIBI: tl.constexpr = False, PAGED: tl.constexpr = False,
                BATCH_IDX: tl.constexpr = False, SINKS: tl.constexpr = False,
                VARLEN: tl.constexpr = False, LEFTPAD: tl.constexpr = False):
    """Tiles (blocks of group x seqlen_q rows, heads_kv, batch; PERSISTENT as in
    forward.attn_fwd): out and lse of one block of a kv head's (query head, position)
    rows, reading sequence b's first SeqUsedK[b] cache entries. The arguments after
    BLOCK_N as in forward.attn_fwd (no dropout nor padding mask: flash_attn_with_kvcache
    has none; VARLEN: packed queries, the grid covering max_seqlen_q rows a head)."""
    assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(group * (max_seqlen_q if VARLEN else seqlen_q), BLOCK_M)
    heads_kv = heads_q // group
    first, end, step = tiles_of_program(blocks * heads_kv * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h_kv, b = tile_index(tile, blocks, heads_kv, PERSISTENT)
        _decode_tile(Q, K, V, Out, Lse, block, h_kv, b,
                     stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                     stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                     stride_os, stride_od, heads_q, group, seqlen_q, seqlen_k, qk_scale,
                     window_left, window_right, softcap, Alibi, alibi_stride_b, SeqUsedK,
                     BlockTable, block_table_stride, page_size, CacheBatchIdx, Sinks, CuSeqQ,
                     LeftPad, HEAD_DIM, BLOCK_D, CAUSAL, BLOCK_M, BLOCK_N, LEFT_BOUNDED, SOFTCAP,
                     ALIBI, PAGED, BATCH_IDX, SINKS, VARLEN, LEFTPAD)
