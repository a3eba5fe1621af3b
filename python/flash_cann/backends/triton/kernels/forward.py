"""The forward kernel: out and lse of one query block per tile, an online softmax over
the key blocks the block's rows see (FlashAttention-2). Also serves KV caches without
GQA packing (SEQUSED_K, PAGED, BATCH_IDX); ``decode.py`` packs a GQA group into a tile."""

from __future__ import annotations

import triton
import triton.language as tl

from .scores import dropout_keep, head_features, scores_log2, visible_pairs
from .tiles import (LN2, LOG2E, assert_tiles, heads_view, key_block_range, key_value_views, load_keys,
                    load_rows, packed_tile, row_vector, sequence_tile, store_rows, tile_index,
                    tiles_of_program)


@triton.jit
def fwd_key_blocks(acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd,
                   stride_vb, stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, start, end,
                   seqlen_k, diagonal, qk_scale, window_left, window_right, softcap, slope,
                   seed, rng_offset, batch_id, head, dropout_threshold, dropout_scale,
                   table_row, page_size, first_key, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
                   LEFT_BOUNDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                   DROPOUT: tl.constexpr, PAGED: tl.constexpr):
    """Online softmax over the key blocks [start, end). MASKED: blocks crossing a window
    bound (the causal diagonal among them) or the key tail; without it only padding
    (HAS_MASK) is masked. PAGED: key j is the cache entry first_key + j (load_keys)."""
    CHECK: tl.constexpr = MASKED or HAS_MASK
    # triton-ascend 3.2 takes no chained boolean operators (A or B or C).
    SCORE_MOD: tl.constexpr = SOFTCAP or ALIBI
    for n0 in range(start, end, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        # Stage: raw scores Q Kᵀ.
        k = load_keys(k_view, stride_kb, stride_ks, stride_kd, n0, seqlen_k, table_row,
                      page_size, first_key, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA, PAGED)
        s = tl.dot(q, tl.trans(k))
        # Stage: the new running max of the scores (log2 units), and P.
        if CHECK or SCORE_MOD:
            # Scale before masking, so that a hidden score is -inf whatever the scale's
            # sign. A row that has seen no key yet keeps m = -inf and subtracts 0
            # instead, so that exp2 gives 0, not NaN.
            s, _ = scores_log2(s, offs_m[:, None], offs_n[None, :], diagonal, qk_scale,
                               softcap, slope, SOFTCAP, ALIBI)
            if CHECK:
                visible = visible_pairs(offs_m[:, None], offs_n[None, :], keep_row, keep_stride_s,
                                        seqlen_k, diagonal, window_left, window_right,
                                        LEFT_BOUNDED and MASKED, CAUSAL and MASKED, HAS_MASK)
                s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_sub[:, None])
        else:
            # Whole blocks fold the scale into the exponent (one FMA per score): the
            # max of qk_scale * S is qk_scale times the max of S, or the min for a
            # negative scale. 3-7 % faster at the target shapes (NOTES.md, step 5).
            if NEGATIVE_SCALE:
                m_new = tl.maximum(m_i, tl.min(s, 1) * qk_scale)
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_sub = m_new
            p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        # Stage: rescale the running sum and output, then accumulate (P ∘ Z) V.
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            keep = dropout_keep(seed, rng_offset, batch_id, head, offs_m[:, None],
                                offs_n[None, :], dropout_threshold)
            p = tl.where(keep, p * dropout_scale, 0.0)
        v = load_keys(v_view, stride_vb, stride_vs, stride_vd, n0, seqlen_k, table_row,
                      page_size, first_key, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA, PAGED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def softmax_start(Sinks, heads, BLOCK_M: tl.constexpr, SINKS: tl.constexpr):
    """(m, l) of the online softmax before the first key block, per row (log2 units):
    (-inf, 0), or with sinks (sink * log2(e), 1) -- the sink is a key every row sees
    first, with no value, so a row that sees no other key ends with out 0, lse = sink.
    ``heads``: the query head of the tile (a scalar) or of each row."""
    if SINKS:
        m_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(Sinks + heads) * LOG2E
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    return m_i, l_i


@triton.jit
def _fwd_tile(Q, K, V, Out, Lse, Keep, block, h, b, blocks,
              stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
              stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
              stride_os, stride_od, keep_stride_b, keep_stride_s,
              heads_q, group, seqlen_q, seqlen_k, qk_scale,
              window_left, window_right, softcap, Alibi, alibi_stride_b, Rng, dropout_threshold,
              dropout_scale, CuSeqQ, CuSeqK, SeqUsedK, BlockTable, block_table_stride,
              page_size, CacheBatchIdx, Sinks, LeftPad,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
              VARLEN: tl.constexpr, SEQUSED_K: tl.constexpr, PAGED: tl.constexpr,
              BATCH_IDX: tl.constexpr, SINKS: tl.constexpr, LEFTPAD: tl.constexpr):
    """out and lse of query block ``block`` of head h, sequence b (causal: last-first,
    see sequence_tile)."""
    q_start, len_q, k_start, len_k, m0, live, tensor_b, diagonal = sequence_tile(
        block, b, blocks, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, SeqUsedK, LeftPad, BLOCK_M,
        False, CAUSAL, VARLEN, SEQUSED_K, LEFTPAD)
    if live:
        h_kv = h // group  # GQA/MQA: query heads share a key/value head by index
        offs_m = m0 + tl.arange(0, BLOCK_M)
        # A KV cache maps a sequence to a cache row or to pages (whatever q's layout).
        if BATCH_IDX:
            cache_b = tl.load(CacheBatchIdx + b)
        else:
            cache_b = b if SEQUSED_K else tensor_b
        q_view = heads_view(Q + q_start.to(tl.int64) * stride_qs, stride_qb, stride_qh,
                            stride_qs, tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        # Pages are looked up per key (first_key on); other views start at the first key.
        k_view, v_view = key_value_views(K, V, k_start * 0 if PAGED else k_start, stride_kb,
                                         stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                                         cache_b * 0 if PAGED else cache_b, h_kv, len_k,
                                         HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        table_row = BlockTable + b.to(tl.int64) * block_table_stride if PAGED else BlockTable
        keep_row = Keep  # batch b's row of the key padding mask (None without one)
        if HAS_MASK:
            keep_row += b.to(tl.int64) * keep_stride_b
        slope, seed, rng_offset = head_features(b, h, Alibi, alibi_stride_b, Rng, ALIBI, DROPOUT)

        # Stage: fp32 running state; Q is loaded once.
        m_i, l_i = softmax_start(Sinks, h, BLOCK_M, SINKS)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        q = load_rows(q_view, 0, stride_qs, stride_qd, 0, m0, len_q, HEAD_DIM, BLOCK_M,
                      BLOCK_D, USE_TMA)

        # Stage: key blocks crossing the window's left bound, those every row sees whole,
        # then those on the diagonal / right bound and the key tail.
        lo, mid, hi, end = key_block_range(m0, len_k, diagonal, window_left, window_right,
                                           BLOCK_M, BLOCK_N, LEFT_BOUNDED, CAUSAL)
        if LEFT_BOUNDED:
            acc, l_i, m_i = fwd_key_blocks(
                acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb,
                stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, lo, mid, len_k, diagonal,
                qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
                dropout_threshold, dropout_scale, table_row, page_size, k_start, HEAD_DIM, BLOCK_N,
                BLOCK_D, True, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, LEFT_BOUNDED, SOFTCAP,
                ALIBI, DROPOUT, PAGED)
        acc, l_i, m_i = fwd_key_blocks(
            acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb,
            stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, mid, hi, len_k, diagonal,
            qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
            dropout_threshold, dropout_scale, table_row, page_size, k_start, HEAD_DIM, BLOCK_N,
            BLOCK_D, False, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, LEFT_BOUNDED, SOFTCAP,
            ALIBI, DROPOUT, PAGED)
        acc, l_i, m_i = fwd_key_blocks(
            acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb,
            stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, hi, end, len_k, diagonal,
            qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
            dropout_threshold, dropout_scale, table_row, page_size, k_start, HEAD_DIM, BLOCK_N,
            BLOCK_D, True, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, LEFT_BOUNDED, SOFTCAP,
            ALIBI, DROPOUT, PAGED)

        # Epilogue: normalise once; rows that saw no key (l = 0) give out 0, lse -inf
        # (with sinks l >= 1: out 0, lse = the sink).
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        o_view = heads_view(Out + q_start.to(tl.int64) * stride_os, stride_ob, stride_oh,
                            stride_os, tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D,
                            USE_TMA)
        store_rows(o_view, 0, stride_os, stride_od, 0, m0, acc / l_safe[:, None], len_q,
                   HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
        tl.store(row_vector(Lse, tensor_b, h, heads_q, seqlen_q) + q_start + offs_m, lse,
                 mask=offs_m < len_q)


@triton.jit(do_not_specialize=["keep_stride_b", "keep_stride_s", "batch", "heads_q", "group",
                               "seqlen_q", "seqlen_k", "seqlen_q_bucket", "seqlen_k_bucket",
                               "window_left", "window_right", "alibi_stride_b",
                               "block_table_stride", "page_size"])
def attn_fwd(Q, K, V, Out, Lse, Keep,
             stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
             stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
             stride_os, stride_od, keep_stride_b, keep_stride_s,
             batch, heads_q, group, seqlen_q, seqlen_k, qk_scale,
             seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
             PERSISTENT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             window_left=0, window_right=0, softcap=1.0, Alibi=None, alibi_stride_b=0, Rng=None,
             dropout_threshold=0, dropout_scale=1.0, CuSeqQ=None, CuSeqK=None, SeqUsedK=None,
             BlockTable=None, block_table_stride=0, page_size=1, CacheBatchIdx=None,
             max_seqlen_q=1, Sinks=None, LeftPad=None, LEFT_BOUNDED: tl.constexpr = False,
             SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
             DROPOUT: tl.constexpr = False, VARLEN: tl.constexpr = False,
             SEQUSED_K: tl.constexpr = False, PAGED: tl.constexpr = False,
             BATCH_IDX: tl.constexpr = False, SINKS: tl.constexpr = False,
             LEFTPAD: tl.constexpr = False, PACKED_TILES: tl.constexpr = False,
             BATCH_BLOCK: tl.constexpr = 1):
    """Tiles (query blocks, heads_q, batch): out and lse of one query block of one head.
    NEGATIVE_SCALE: qk_scale < 0 (the sign decides which end of a score row is its max).
    CAUSAL: the window has a right bound, window_right keys right of the diagonal (0 for
    causal calls). The arguments after BLOCK_N are the features' (flash_cann.contract.variant),
    off by default: a left window bound, softcap, ALiBi slopes (batch, heads_q), dropout
    (Rng = (seed, offset); keep iff draw >= dropout_threshold; kept P x dropout_scale),
    packed sequences (VARLEN: cu_seqlens; the grid covers max_seqlen_q), a KV cache's
    filled lengths (SEQUSED_K; with VARLEN the queries are packed and the keys are still
    the cache's), each sequence's first key (LEFTPAD: cache_leftpad), pages (PAGED: block
    table, page_size), cache rows (BATCH_IDX) and attention sinks (SINKS: fp32 logits
    (heads_q,)).
    PACKED_TILES (with VARLEN, not PERSISTENT): the grid is (a bound on the real query
    blocks, heads_q, 1) instead, each program finding its sequence and block by walking
    cu_seqlens (tiles.packed_tile; BATCH_BLOCK >= batch), so no program is spent on the
    blocks a short sequence lacks."""
    assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(max_seqlen_q if VARLEN else seqlen_q, BLOCK_M)
    first, end, step = tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = tile_index(tile, blocks, heads_q, PERSISTENT)
        if PACKED_TILES:
            b, block = packed_tile(block, CuSeqQ, batch, 1, BLOCK_M, BATCH_BLOCK)
        _fwd_tile(Q, K, V, Out, Lse, Keep, block, h, b, blocks,
                  stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                  stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                  stride_os, stride_od, keep_stride_b, keep_stride_s, heads_q, group, seqlen_q,
                  seqlen_k, qk_scale, window_left, window_right, softcap, Alibi, alibi_stride_b,
                  Rng, dropout_threshold, dropout_scale, CuSeqQ, CuSeqK, SeqUsedK, BlockTable,
                  block_table_stride, page_size, CacheBatchIdx, Sinks, LeftPad, HEAD_DIM,
                  BLOCK_D, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, BLOCK_M, BLOCK_N,
                  LEFT_BOUNDED, SOFTCAP, ALIBI, DROPOUT, VARLEN, SEQUSED_K, PAGED, BATCH_IDX,
                  SINKS, LEFTPAD)
