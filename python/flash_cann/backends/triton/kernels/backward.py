"""The backward kernels: D = rowsum(dO ∘ O) - dLSE (preprocess, with the attention sinks'
gradient), then dK/dV per key block and dQ per query block -- two kernels, each owning
its output: deterministic, no atomics. Both recompute P from the saved lse (which
includes the sink: P = exp(S - lse) needs nothing more)."""

from __future__ import annotations

import triton
import triton.language as tl

from .scores import dropout_keep, head_features, in_window, scores_log2, visible_pairs
from .tiles import (assert_tiles, heads_view, key_block_range, key_value_views, load_lse2,
                    load_rows, query_block_range, row_vector, sequence_tile, store_rows,
                    tile_index, tiles_of_program)


@triton.jit(do_not_specialize=["batch", "heads_q", "seqlen_q"])
def attn_bwd_preprocess(Out, DOut, DLse, Delta, stride_ob, stride_oh, stride_os, stride_od,
                        stride_dob, stride_doh, stride_dos, stride_dod, batch, heads_q, seqlen_q,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        HAS_DLSE: tl.constexpr, PERSISTENT: tl.constexpr,
                        BLOCK_M: tl.constexpr, Lse=None, Sinks=None, DSinkParts=None,
                        SINKS: tl.constexpr = False):
    """Tiles (query blocks, heads_q, batch): D = rowsum(dO ∘ O) - dLSE, fp32. SINKS: also
    each tile's share of the sink's gradient, -Σ_rows exp(sink - lse) * D, into
    DSinkParts (batch, heads_q, blocks), which the host sums in a fixed order: no atomics,
    so the result is bitwise repeatable."""
    blocks = tl.cdiv(seqlen_q, BLOCK_M)
    first, end, step = tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = tile_index(tile, blocks, heads_q, PERSISTENT)
        m0 = block * BLOCK_M
        rows = m0 + tl.arange(0, BLOCK_M)
        # A streaming reduction with no MMA to feed: plain pointer loads (USE_TMA False).
        o_view = heads_view(Out, stride_ob, stride_oh, stride_os, b, h, 1, seqlen_q, HEAD_DIM,
                            BLOCK_M, BLOCK_D, False)
        do_view = heads_view(DOut, stride_dob, stride_doh, stride_dos, b, h, 1, seqlen_q,
                             HEAD_DIM, BLOCK_M, BLOCK_D, False)
        o = load_rows(o_view, 0, stride_os, stride_od, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M,
                      BLOCK_D, False)
        do = load_rows(do_view, 0, stride_dos, stride_dod, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M,
                       BLOCK_D, False)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        if HAS_DLSE:
            delta -= tl.load(row_vector(DLse, b, h, heads_q, seqlen_q) + rows,
                             mask=rows < seqlen_q, other=0.0)
        tl.store(row_vector(Delta, b, h, heads_q, seqlen_q) + rows, delta,
                 mask=rows < seqlen_q)
        if SINKS:
            # P_sink = exp(sink - lse) of each row; the sink has no value, so its dP is 0
            # and dsink = Σ P_sink * (0 - D). A sink of -inf (a head without one) in a row
            # that sees no key has lse -inf too: P_sink 0, not NaN.
            lse = tl.load(row_vector(Lse, b, h, heads_q, seqlen_q) + rows,
                          mask=rows < seqlen_q, other=float("inf"))
            p_sink = tl.where(lse == float("-inf"), 0.0, tl.exp(tl.load(Sinks + h) - lse))
            tl.store(DSinkParts + (b * heads_q + h) * blocks + block, -tl.sum(p_sink * delta, 0))


@triton.jit
def _probs_and_score_grads(a, b, c, d, lse2, delta, visible, qk_scale, q_idx, k_idx,
                           diagonal, softcap, slope, seed, rng_offset, batch_id, head,
                           dropout_threshold, dropout_scale, APPLY_VISIBLE: tl.constexpr,
                           SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr):
    """One tile of the recomputed softmax and of its score gradient:
        P  = exp2(scores(a bᵀ) - lse2)          (masked by ``visible`` if APPLY_VISIBLE)
        Z  = keep / (1 - p) (DROPOUT), else 1
        dS = P ∘ ((c dᵀ) ∘ Z - D) ∘ S'          (S': the softcap's derivative)
    and P ∘ Z, which dV accumulates. The caller orients the tile by its operands: (q,
    k, dO, v) with lse2 and D as columns gives queries x keys (the dQ kernel); (k, q, v,
    dO) with lse2 and D as rows gives keys x queries (the dK/dV kernel: its key tile is
    the MMAs' M dimension, so K and V stay in shared memory and Pᵀ, dSᵀ feed the next
    MMAs without a transpose). q_idx, k_idx: positions in that orientation."""
    s, slope_cap = scores_log2(tl.dot(a, tl.trans(b)), q_idx, k_idx, diagonal, qk_scale,
                               softcap, slope, SOFTCAP, ALIBI)
    p = tl.math.exp2(s - lse2)
    if APPLY_VISIBLE:
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(c, tl.trans(d))
    p_dropped = p
    if DROPOUT:
        keep = dropout_keep(seed, rng_offset, batch_id, head, q_idx, k_idx, dropout_threshold)
        p_dropped = tl.where(keep, p * dropout_scale, 0.0)
        dp = tl.where(keep, dp * dropout_scale, 0.0)
    ds = p * (dp - delta)
    if SOFTCAP:
        ds = ds * slope_cap
    return p_dropped, ds


@triton.jit
def _dkdv_query_blocks(dk, dv, k, v, q_view, do_view, stride_qh, stride_qs, stride_qd,
                       stride_doh, stride_dos, stride_dod, Lse, Delta, lse_b, lse_seqlen, q_start,
                       b, h0, group, offs_n, start, end, heads_q, seqlen_q, diagonal, qk_scale,
                       window_left, window_right, softcap, Alibi, alibi_stride_b, seed,
                       rng_offset, dropout_threshold, dropout_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_D: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr,
                       CAUSAL: tl.constexpr, LEFT_BOUNDED: tl.constexpr, SOFTCAP: tl.constexpr,
                       ALIBI: tl.constexpr, DROPOUT: tl.constexpr):
    """Accumulate dK, dV of one key block over the query blocks [start, end) of every
    query head h0 + g of its group, as one flat loop over (g, block): no loop nest, so
    the compiler keeps the accumulators in registers. MASKED: blocks crossing a window
    bound (the causal diagonal among them). Rows past seqlen_q (this sequence's) load as
    q = dO = 0 with lse2 = +inf: they add nothing."""
    blocks = tl.cdiv(tl.maximum(end - start, 0), BLOCK_M)
    # Never a division by zero, even where the pipeliner computes a first iteration's
    # addresses ahead of an empty loop's trip-count check (an illegal access on sm_90).
    divisor = tl.maximum(blocks, 1)
    for i in range(group * blocks):
        g = i // divisor
        m0 = tl.multiple_of(start + (i - g * divisor) * BLOCK_M, BLOCK_M)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        q = load_rows(q_view, stride_qh, stride_qs, stride_qd, g, m0, seqlen_q, HEAD_DIM,
                      BLOCK_M, BLOCK_D, USE_TMA)
        do = load_rows(do_view, stride_doh, stride_dos, stride_dod, g, m0, seqlen_q, HEAD_DIM,
                       BLOCK_M, BLOCK_D, USE_TMA)
        rows = row_vector(Lse, lse_b, h0 + g, heads_q, lse_seqlen) + q_start
        lse2 = load_lse2(rows, offs_m, seqlen_q)
        delta = tl.load(row_vector(Delta, lse_b, h0 + g, heads_q, lse_seqlen) + q_start + offs_m,
                        mask=offs_m < seqlen_q, other=0.0)
        slope = tl.load(Alibi + b * alibi_stride_b + h0 + g) if ALIBI else 0.0
        # Stage: Pᵀ and dSᵀ (keys x queries), masked on the window's bounds (the key tail
        # and padding need no mask: their rows of dK/dV are dropped or zeroed).
        if MASKED:
            visible = in_window(offs_m[None, :], offs_n[:, None], diagonal, window_left,
                                window_right, LEFT_BOUNDED, CAUSAL)
        else:
            visible = None
        p_t, ds_t = _probs_and_score_grads(k, q, v, do, lse2[None, :], delta[None, :], visible,
                                           qk_scale, offs_m[None, :], offs_n[:, None],
                                           diagonal, softcap, slope, seed, rng_offset, b,
                                           h0 + g, dropout_threshold, dropout_scale, MASKED,
                                           SOFTCAP, ALIBI, DROPOUT)
        # Stage: dV += (P ∘ Z)ᵀ dO;  dK += dSᵀ Q (scaled once at the end).
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dkdv_tile(Q, K, V, DOut, Lse, Delta, Keep, DK, DV, block, h_kv, b,
               stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
               stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
               stride_dos, stride_dod, stride_dkb, stride_dkh, stride_dks, stride_dkd,
               stride_dvb, stride_dvh, stride_dvs, stride_dvd, keep_stride_b, keep_stride_s,
               heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
               window_left, window_right, softcap, Alibi, alibi_stride_b, Rng, dropout_threshold,
               dropout_scale, CuSeqQ, CuSeqK,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
               SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
               VARLEN: tl.constexpr):
    """dK and dV of key block ``block`` of kv head h_kv, sequence b, summed over the query
    heads of its group (GQA) here, so no two tiles write the same element."""
    q_start, len_q, k_start, len_k, n0, live, tensor_b, diagonal = sequence_tile(
        block, b, 0, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, None, None, BLOCK_N, True, False,
        VARLEN, False, False)
    if live:
        h0 = h_kv * group  # the group's first query head
        offs_n = n0 + tl.arange(0, BLOCK_N)
        q_offset = q_start.to(tl.int64)
        # Stage: K and V of the block are loaded once; fp32 accumulators.
        k_view, v_view = key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks,
                                         stride_vb, stride_vh, stride_vs, tensor_b, h_kv, len_k,
                                         HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        k = load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, len_k, HEAD_DIM, BLOCK_N,
                      BLOCK_D, USE_TMA)
        v = load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, len_k, HEAD_DIM, BLOCK_N,
                      BLOCK_D, USE_TMA)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        q_view = heads_view(Q + q_offset * stride_qs, stride_qb, stride_qh, stride_qs, tensor_b,
                            h0, group, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        do_view = heads_view(DOut + q_offset * stride_dos, stride_dob, stride_doh, stride_dos,
                             tensor_b, h0, group, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        seed = tl.load(Rng) if DROPOUT else 0
        rng_offset = tl.load(Rng + 1) if DROPOUT else 0

        # Stage: query blocks crossing the right bound (the diagonal), those that see the
        # whole key block, then those crossing the left bound.
        lo, mid, hi, end = query_block_range(n0, len_q, diagonal, window_left, window_right,
                                             BLOCK_M, BLOCK_N, LEFT_BOUNDED, CAUSAL)
        if CAUSAL:
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_view, do_view, stride_qh, stride_qs, stride_qd, stride_doh,
                stride_dos, stride_dod, Lse, Delta, tensor_b, seqlen_q, q_start, b, h0, group,
                offs_n, lo, mid, heads_q, len_q, diagonal, qk_scale, window_left, window_right,
                softcap, Alibi, alibi_stride_b, seed, rng_offset, dropout_threshold,
                dropout_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True, USE_TMA, CAUSAL, LEFT_BOUNDED,
                SOFTCAP, ALIBI, DROPOUT)
        dk, dv = _dkdv_query_blocks(
            dk, dv, k, v, q_view, do_view, stride_qh, stride_qs, stride_qd, stride_doh,
            stride_dos, stride_dod, Lse, Delta, tensor_b, seqlen_q, q_start, b, h0, group,
            offs_n, mid, hi, heads_q, len_q, diagonal, qk_scale, window_left, window_right,
            softcap, Alibi, alibi_stride_b, seed, rng_offset, dropout_threshold, dropout_scale,
            HEAD_DIM, BLOCK_M, BLOCK_D, False, USE_TMA, CAUSAL, LEFT_BOUNDED, SOFTCAP, ALIBI,
            DROPOUT)
        if LEFT_BOUNDED:
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_view, do_view, stride_qh, stride_qs, stride_qd, stride_doh,
                stride_dos, stride_dod, Lse, Delta, tensor_b, seqlen_q, q_start, b, h0, group,
                offs_n, hi, end, heads_q, len_q, diagonal, qk_scale, window_left, window_right,
                softcap, Alibi, alibi_stride_b, seed, rng_offset, dropout_threshold,
                dropout_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True, USE_TMA, CAUSAL, LEFT_BOUNDED,
                SOFTCAP, ALIBI, DROPOUT)

        # Epilogue: padded keys get exactly zero gradients; dK = scale * dSᵀ Q.
        if HAS_MASK:
            keep_row = Keep + b.to(tl.int64) * keep_stride_b
            keep = tl.load(keep_row + offs_n * keep_stride_s, mask=offs_n < len_k, other=0) != 0
            dk = tl.where(keep[:, None], dk, 0.0)
            dv = tl.where(keep[:, None], dv, 0.0)
        dk_view, dv_view = key_value_views(DK, DV, k_start, stride_dkb, stride_dkh, stride_dks,
                                           stride_dvb, stride_dvh, stride_dvs, tensor_b, h_kv,
                                           len_k, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        store_rows(dk_view, 0, stride_dks, stride_dkd, 0, n0, dk * scale, len_k, HEAD_DIM,
                   BLOCK_N, BLOCK_D, USE_TMA)
        store_rows(dv_view, 0, stride_dvs, stride_dvd, 0, n0, dv, len_k, HEAD_DIM, BLOCK_N,
                   BLOCK_D, USE_TMA)


@triton.jit(do_not_specialize=["keep_stride_b", "keep_stride_s", "batch", "heads_q", "group",
                               "seqlen_q", "seqlen_k", "seqlen_q_bucket", "seqlen_k_bucket",
                               "window_left", "window_right", "alibi_stride_b"])
def attn_bwd_dkdv(Q, K, V, DOut, Lse, Delta, Keep, DK, DV,
                  stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                  stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                  stride_dos, stride_dod, stride_dkb, stride_dkh, stride_dks, stride_dkd,
                  stride_dvb, stride_dvh, stride_dvs, stride_dvd, keep_stride_b, keep_stride_s,
                  batch, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
                  seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                  HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr, PERSISTENT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  window_left=0, window_right=0, softcap=1.0, Alibi=None, alibi_stride_b=0,
                  Rng=None, dropout_threshold=0, dropout_scale=1.0, CuSeqQ=None, CuSeqK=None,
                  max_seqlen_k=1, LEFT_BOUNDED: tl.constexpr = False,
                  SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
                  DROPOUT: tl.constexpr = False, VARLEN: tl.constexpr = False):
    """Tiles (key blocks, heads_kv, batch): dK and dV of one key block of one kv head.
    The features' arguments (after BLOCK_N) as in attn_fwd."""
    assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(max_seqlen_k if VARLEN else seqlen_k, BLOCK_N)
    heads_kv = heads_q // group
    first, end, step = tiles_of_program(blocks * heads_kv * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h_kv, b = tile_index(tile, blocks, heads_kv, PERSISTENT)
        _dkdv_tile(Q, K, V, DOut, Lse, Delta, Keep, DK, DV, block, h_kv, b,
                   stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                   stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob,
                   stride_doh, stride_dos, stride_dod, stride_dkb, stride_dkh, stride_dks,
                   stride_dkd, stride_dvb, stride_dvh, stride_dvs, stride_dvd, keep_stride_b,
                   keep_stride_s, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
                   window_left, window_right, softcap, Alibi, alibi_stride_b, Rng,
                   dropout_threshold, dropout_scale, CuSeqQ, CuSeqK,
                   HEAD_DIM, BLOCK_D, CAUSAL, HAS_MASK, USE_TMA, BLOCK_M, BLOCK_N, LEFT_BOUNDED,
                   SOFTCAP, ALIBI, DROPOUT, VARLEN)


@triton.jit
def _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd, stride_vs,
                   stride_vd, keep_row, keep_stride_s, offs_m, start, end, seqlen_k, diagonal,
                   qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
                   dropout_threshold, dropout_scale, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
                   CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr,
                   LEFT_BOUNDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                   DROPOUT: tl.constexpr):
    """Accumulate dQ of one query block over the key blocks [start, end). MASKED: a
    window bound (the causal diagonal among them) and the key tail; without it only
    padding (HAS_MASK) is masked."""
    CHECK: tl.constexpr = MASKED or HAS_MASK
    for n0 in range(start, end, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                      BLOCK_D, USE_TMA)
        v = load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                      BLOCK_D, USE_TMA)
        if CHECK:
            visible = visible_pairs(offs_m[:, None], offs_n[None, :], keep_row, keep_stride_s,
                                    seqlen_k, diagonal, window_left, window_right,
                                    LEFT_BOUNDED and MASKED, CAUSAL and MASKED, HAS_MASK)
        else:
            visible = None
        # Stage: P and dS (queries x keys); dQ += dS K (scaled once at the end).
        _, ds = _probs_and_score_grads(q, k, do, v, lse2[:, None], delta[:, None], visible,
                                       qk_scale, offs_m[:, None], offs_n[None, :], diagonal,
                                       softcap, slope, seed, rng_offset, b, h,
                                       dropout_threshold, dropout_scale, CHECK, SOFTCAP, ALIBI,
                                       DROPOUT)
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _dq_tile(Q, K, V, DOut, Lse, Delta, Keep, DQ, block, h, b, blocks,
             stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
             stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
             stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
             keep_stride_b, keep_stride_s, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
             window_left, window_right, softcap, Alibi, alibi_stride_b, Rng, dropout_threshold,
             dropout_scale, CuSeqQ, CuSeqK,
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
             SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
             VARLEN: tl.constexpr):
    """dQ of query block ``block`` of head h, sequence b (causal: last-first, as forward)."""
    q_start, len_q, k_start, len_k, m0, live, tensor_b, diagonal = sequence_tile(
        block, b, blocks, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, None, None, BLOCK_M, False,
        CAUSAL, VARLEN, False, False)
    if live:
        h_kv = h // group
        offs_m = m0 + tl.arange(0, BLOCK_M)
        q_offset = q_start.to(tl.int64)
        # Stage: Q, dO, lse and D of the block are loaded once.
        q_view = heads_view(Q + q_offset * stride_qs, stride_qb, stride_qh, stride_qs, tensor_b,
                            h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        do_view = heads_view(DOut + q_offset * stride_dos, stride_dob, stride_doh, stride_dos,
                             tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        k_view, v_view = key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks,
                                         stride_vb, stride_vh, stride_vs, tensor_b, h_kv, len_k,
                                         HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        q = load_rows(q_view, 0, stride_qs, stride_qd, 0, m0, len_q, HEAD_DIM, BLOCK_M,
                      BLOCK_D, USE_TMA)
        do = load_rows(do_view, 0, stride_dos, stride_dod, 0, m0, len_q, HEAD_DIM, BLOCK_M,
                       BLOCK_D, USE_TMA)
        lse2 = load_lse2(row_vector(Lse, tensor_b, h, heads_q, seqlen_q) + q_start, offs_m,
                         len_q)
        delta = tl.load(row_vector(Delta, tensor_b, h, heads_q, seqlen_q) + q_start + offs_m,
                        mask=offs_m < len_q, other=0.0)
        keep_row = Keep  # batch b's row of the key padding mask (None without one)
        if HAS_MASK:
            keep_row += b.to(tl.int64) * keep_stride_b
        slope, seed, rng_offset = head_features(b, h, Alibi, alibi_stride_b, Rng, ALIBI, DROPOUT)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        # Stage: key blocks crossing the left bound, those every row sees whole, then the
        # diagonal / right bound and the key tail.
        lo, mid, hi, end = key_block_range(m0, len_k, diagonal, window_left, window_right,
                                           BLOCK_M, BLOCK_N, LEFT_BOUNDED, CAUSAL)
        if LEFT_BOUNDED:
            dq = _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd,
                                stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, lo, mid,
                                len_k, diagonal, qk_scale, window_left, window_right, softcap,
                                slope, seed, rng_offset, b, h, dropout_threshold, dropout_scale,
                                HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, HAS_MASK, USE_TMA,
                                LEFT_BOUNDED, SOFTCAP, ALIBI, DROPOUT)
        dq = _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd,
                            stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, mid, hi, len_k,
                            diagonal, qk_scale, window_left, window_right, softcap, slope, seed,
                            rng_offset, b, h, dropout_threshold, dropout_scale, HEAD_DIM,
                            BLOCK_N, BLOCK_D, False, CAUSAL, HAS_MASK, USE_TMA, LEFT_BOUNDED,
                            SOFTCAP, ALIBI, DROPOUT)
        dq = _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd,
                            stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, hi, end, len_k,
                            diagonal, qk_scale, window_left, window_right, softcap, slope, seed,
                            rng_offset, b, h, dropout_threshold, dropout_scale, HEAD_DIM,
                            BLOCK_N, BLOCK_D, True, CAUSAL, HAS_MASK, USE_TMA, LEFT_BOUNDED,
                            SOFTCAP, ALIBI, DROPOUT)

        # Epilogue: dQ = scale * dS K.
        dq_view = heads_view(DQ + q_offset * stride_dqs, stride_dqb, stride_dqh, stride_dqs,
                             tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        store_rows(dq_view, 0, stride_dqs, stride_dqd, 0, m0, dq * scale, len_q, HEAD_DIM,
                   BLOCK_M, BLOCK_D, USE_TMA)


@triton.jit(do_not_specialize=["keep_stride_b", "keep_stride_s", "batch", "heads_q", "group",
                               "seqlen_q", "seqlen_k", "seqlen_q_bucket", "seqlen_k_bucket",
                               "window_left", "window_right", "alibi_stride_b"])
def attn_bwd_dq(Q, K, V, DOut, Lse, Delta, Keep, DQ,
                stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                keep_stride_b, keep_stride_s,
                batch, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
                seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr, PERSISTENT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                window_left=0, window_right=0, softcap=1.0, Alibi=None, alibi_stride_b=0,
                Rng=None, dropout_threshold=0, dropout_scale=1.0, CuSeqQ=None, CuSeqK=None,
                max_seqlen_q=1, LEFT_BOUNDED: tl.constexpr = False,
                SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
                DROPOUT: tl.constexpr = False, VARLEN: tl.constexpr = False):
    """Tiles (query blocks, heads_q, batch): dQ of one query block of one head. The
    features' arguments (after BLOCK_N) as in attn_fwd."""
    assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(max_seqlen_q if VARLEN else seqlen_q, BLOCK_M)
    first, end, step = tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = tile_index(tile, blocks, heads_q, PERSISTENT)
        _dq_tile(Q, K, V, DOut, Lse, Delta, Keep, DQ, block, h, b, blocks,
                 stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                 stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                 stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                 keep_stride_b, keep_stride_s, heads_q, group, seqlen_q, seqlen_k, scale,
                 qk_scale, window_left, window_right, softcap, Alibi, alibi_stride_b, Rng,
                 dropout_threshold, dropout_scale, CuSeqQ, CuSeqK, HEAD_DIM, BLOCK_D, CAUSAL,
                 HAS_MASK, USE_TMA, BLOCK_M, BLOCK_N, LEFT_BOUNDED, SOFTCAP, ALIBI, DROPOUT,
                 VARLEN)


@triton.jit
def attn_bwd_dq_convert(DQAccum, DQ, stride_dqb, stride_dqh, stride_dqs, seqlen_q,
                        scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Tiles (query blocks, heads_q, batch): dQ = scale * DQAccum in dQ's dtype, where
    DQAccum (batch, heads_q, seqlen_q, head_dim), contiguous fp32, holds the Hopper
    backward's reduce-added dS K (kernels/backward_sm90.py)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    b = tl.program_id(2)
    cols = tl.arange(0, HEAD_DIM)
    keep = rows[:, None] < seqlen_q
    src = DQAccum + ((b * tl.num_programs(1) + h).to(tl.int64) * seqlen_q
                     + rows[:, None]) * HEAD_DIM + cols[None, :]
    dst = (DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
           + rows[:, None].to(tl.int64) * stride_dqs + cols[None, :])
    tl.store(dst, (tl.load(src, mask=keep) * scale).to(DQ.dtype.element_ty), mask=keep)
