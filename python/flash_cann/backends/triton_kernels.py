"""Triton kernels of the Triton backend: FlashAttention-2 forward and backward, for
NVIDIA GPUs (upstream Triton) and Ascend NPUs (triton-ascend).

Device code only; ``backends/triton.py`` (CUDA) and ``backends/triton_npu.py`` (NPU)
pick the tiles and launch it. The source stays within what both compilers take
(triton-ascend 3.2 has no tuple arguments, so strides travel as scalars). Conventions:

* q, k, v, out and their gradients travel with their (batch, head, seqlen, head_dim)
  strides as four scalars, so BNSD, BSND and strided views need no copies. The fp32
  (batch, heads_q, seqlen_q) vectors (lse, D, dLSE) are contiguous. A tile is
  BLOCK_ROWS x BLOCK_D with BLOCK_D = head_dim rounded up to a power of two >= 16;
  padding columns load as 0 and are never stored.
* A "view" is a run of consecutive heads of one batch: with USE_TMA a tensor
  descriptor (TMA on Hopper; Triton lowers it to plain loads elsewhere) whose bounds
  zero-fill tails on load and clip them on store, else a base pointer with masked
  loads. The host picks USE_TMA only where the strides allow it.
* BLOCK_M counts query rows and BLOCK_N key rows, in every kernel.
* A program computes one output tile (a query or key block of one head), indexed by
  its grid position (CUDA: one program per tile) or, with PERSISTENT, by a loop over
  the tiles ``program_id, program_id + num_programs, ...`` (Ascend: one program per AI
  core). The tile's work is the same ``_*_tile`` function either way.
* Scores live in log2 units: qk_scale = scale * log2(e), so exp(scale * s - lse)
  = exp2(qk_scale * s - lse * log2(e)) and the hot loops use exp2.
* Causal is bottom-right aligned: query i sees key j iff j <= i + diagonal,
  diagonal = seqlen_k - seqlen_q. Each kernel splits its loop into blocks that every
  row sees whole (no mask) and blocks on the diagonal or the key tail (masked).
* A row that sees no key keeps m = -inf: its output is 0, its lse -inf, and the
  backward turns that lse into +inf so the row's recomputed P is exactly 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_scores import alibi_bias, dropout_keep, in_window, softcap_slope, softcapped

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e))
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * ln(2)
# The smallest tile edge tl.dot takes (the K dimension of an MMA instruction).
MIN_DOT_DIM: tl.constexpr = tl.constexpr(16)


# ---------------------------------------------------------------------------------------
# Shared device helpers
# ---------------------------------------------------------------------------------------

@triton.jit
def _assert_tiles(HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """Tile constraints every MMA kernel relies on."""
    tl.static_assert(BLOCK_D >= HEAD_DIM, "BLOCK_D pads head_dim, never cuts it")
    tl.static_assert((BLOCK_D >= MIN_DOT_DIM and BLOCK_M >= MIN_DOT_DIM)
                     and BLOCK_N >= MIN_DOT_DIM, "tl.dot needs every tile edge >= 16")


@triton.jit
def _heads_view(T, stride_b, stride_h, stride_s, b, h0, heads, seqlen, HEAD_DIM: tl.constexpr,
                BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Heads h0 .. h0 + heads - 1 of batch b, each a (seqlen, head_dim) matrix."""
    base = T + b.to(tl.int64) * stride_b + h0.to(tl.int64) * stride_h
    if USE_TMA:
        return tl.make_tensor_descriptor(base, shape=[heads, seqlen, HEAD_DIM],
                                         strides=[stride_h, stride_s, 1],
                                         block_shape=[1, BLOCK_ROWS, BLOCK_D])
    else:
        return base


@triton.jit
def _key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh,
                     stride_vs, b, h_kv, len_k, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """The views of one sequence's keys and values (or their gradients), as every tile
    reads or writes them: kv head h_kv of batch row b, the sequence's rows starting at
    k_start (packed sequences)."""
    k_offset = k_start.to(tl.int64)
    k_view = _heads_view(K + k_offset * stride_ks, stride_kb, stride_kh, stride_ks, b, h_kv, 1,
                         len_k, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    v_view = _heads_view(V + k_offset * stride_vs, stride_vb, stride_vh, stride_vs, b, h_kv, 1,
                         len_k, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    return k_view, v_view


@triton.jit
def _tile_offsets(view, stride_h, stride_s, stride_d, head, row0, seqlen, HEAD_DIM: tl.constexpr,
                  BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pointers and in-bounds mask of a tile (pointer path). Offsets in int64: rows x
    row stride passes 2^31 elements at 128k rows of 64 heads x 256 (BSND)."""
    rows = row0 + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = rows[:, None] < seqlen
    if HEAD_DIM < BLOCK_D:
        mask = mask & (cols[None, :] < HEAD_DIM)
    ptrs = (view + tl.cast(head, tl.int64) * stride_h
            + rows.to(tl.int64)[:, None] * stride_s + cols[None, :] * stride_d)
    return ptrs, mask


@triton.jit
def _load_rows(view, stride_h, stride_s, stride_d, head, row0, seqlen, HEAD_DIM: tl.constexpr,
               BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows [row0, row0 + BLOCK_ROWS) of a view's head; out-of-range elements read 0."""
    if USE_TMA:
        return view.load([head, row0, 0]).reshape(BLOCK_ROWS, BLOCK_D)
    else:
        ptrs, mask = _tile_offsets(view, stride_h, stride_s, stride_d, head, row0, seqlen,
                                   HEAD_DIM, BLOCK_ROWS, BLOCK_D)
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_rows(view, stride_h, stride_s, stride_d, head, row0, tile, seqlen,
                HEAD_DIM: tl.constexpr,
                BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Store the in-range part of a tile at rows [row0, row0 + BLOCK_ROWS), in the
    tensor's dtype."""
    if USE_TMA:
        view.store([head, row0, 0], tile.to(view.dtype).reshape(1, BLOCK_ROWS, BLOCK_D))
    else:
        ptrs, mask = _tile_offsets(view, stride_h, stride_s, stride_d, head, row0, seqlen,
                                   HEAD_DIM, BLOCK_ROWS, BLOCK_D)
        tl.store(ptrs, tile.to(view.dtype.element_ty), mask=mask)


@triton.jit
def _row_vector(T, b, h, heads, seqlen):
    """Batch b, head h of a contiguous (batch, heads, seqlen) fp32 tensor (lse, D, dLSE)."""
    return T + (b.to(tl.int64) * heads + h) * seqlen


@triton.jit
def _load_lse2(lse_row, rows, seqlen):
    """A row block's lse in log2 units; rows that saw no key (lse = -inf) and rows past
    seqlen get +inf, so that their recomputed P = exp2(s - lse2) is exactly 0."""
    lse = tl.load(lse_row + rows, mask=rows < seqlen, other=float("-inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def _visible(q_idx, k_idx, keep_row, keep_stride_s, seqlen_k, diagonal, window_left,
             window_right, LEFT_BOUNDED: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_MASK: tl.constexpr):
    """Which (query, key) pairs of a queries x keys tile may attend: the key exists, lies
    in the window -- right of the diagonal by at most window_right (CAUSAL: the right
    bound exists; causal calls pass 0) and left of it by at most window_left
    (LEFT_BOUNDED) -- and is not padding (q_idx a column, k_idx a row)."""
    in_range = k_idx < seqlen_k
    visible = in_range & in_window(q_idx, k_idx, diagonal, window_left, window_right,
                                   LEFT_BOUNDED, CAUSAL)
    if HAS_MASK:
        keep = tl.load(keep_row + k_idx * keep_stride_s, mask=in_range, other=0)
        visible = visible & (keep != 0)
    return visible


@triton.jit
def _block_ranges(start, full_start, full_end, end):
    """(lo, mid, hi, end) of the three loops over a tile's partner blocks: [lo, mid)
    crosses the window's far bound (masked), [mid, hi) is seen whole (no mask), [hi, end)
    crosses the near bound or the tail (masked). Clamped so the loops never overlap."""
    mid = tl.maximum(tl.minimum(full_start, end), start)
    return start, mid, tl.maximum(mid, full_end), end


@triton.jit
def _key_block_range(m0, seqlen_k, diagonal, window_left, window_right,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
                     CAUSAL: tl.constexpr):
    """For the query block [m0, m0 + BLOCK_M): the key block loops' bounds (see
    _block_ranges). Keys before the first and from the last bound on are seen by no row."""
    if CAUSAL:
        end = tl.minimum(seqlen_k, m0 + BLOCK_M + diagonal + window_right)
        full_end = tl.minimum(seqlen_k, m0 + 1 + diagonal + window_right)
    else:
        end = seqlen_k
        full_end = seqlen_k
    full_end = tl.maximum(full_end, 0) // BLOCK_N * BLOCK_N
    start = 0
    full_start = 0
    if LEFT_BOUNDED:
        start = tl.maximum(m0 + diagonal - window_left, 0) // BLOCK_N * BLOCK_N
        full_start = tl.cdiv(tl.maximum(m0 + BLOCK_M - 1 + diagonal - window_left, 0),
                             BLOCK_N) * BLOCK_N
    return _block_ranges(start, full_start, full_end, end)


@triton.jit
def _query_block_range(n0, seqlen_q, diagonal, window_left, window_right,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
                       CAUSAL: tl.constexpr):
    """For the key block [n0, n0 + BLOCK_N): the query block loops' bounds (see
    _block_ranges): rows before the first see none of its keys (right bound), rows from
    the last on see none either (left bound)."""
    rounded_q = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        start = tl.maximum(n0 - diagonal - window_right, 0) // BLOCK_M * BLOCK_M
        full_start = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - diagonal - window_right, 0),
                             BLOCK_M) * BLOCK_M
        full_start = tl.minimum(full_start, rounded_q)
    else:
        start = 0
        full_start = 0
    end = seqlen_q
    full_end = rounded_q
    if LEFT_BOUNDED:
        end = tl.minimum(seqlen_q, n0 + BLOCK_N - diagonal + window_left)
        full_end = tl.maximum(n0 - diagonal + window_left + 1, 0) // BLOCK_M * BLOCK_M
    # Here the masked loop comes first: [start, full_start) crosses the right bound.
    return start, tl.maximum(tl.minimum(full_start, end), start), \
        tl.maximum(tl.maximum(tl.minimum(full_start, end), start), full_end), end


@triton.jit
def _scores_log2(s, offs_m, offs_n, diagonal, qk_scale, softcap, slope,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """A tile of raw scores Q Kᵀ in log2 units: scale, softcap and ALiBi (natural units,
    triton_scores), then x log2(e). Also the softcap's derivative dS/dS_scaled (1.0
    without softcap), which the backward's chain rule needs."""
    slope_cap = 1.0
    if SOFTCAP or ALIBI:
        s = s * (qk_scale * LN2)
        if SOFTCAP:
            s = softcapped(s, softcap)
            slope_cap = softcap_slope(s, softcap)
        if ALIBI:
            s += alibi_bias(offs_m, offs_n, diagonal, slope)
        s = s * LOG2E
    else:
        s = s * qk_scale
    return s, slope_cap


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
    s, slope_cap = _scores_log2(tl.dot(a, tl.trans(b)), q_idx, k_idx, diagonal, qk_scale,
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
def _tiles_of_program(tiles, PERSISTENT: tl.constexpr):
    """(first, end, step) of the loop over this program's tiles: every num_programs-th
    tile from its program id (PERSISTENT), else one (the loop folds away)."""
    if PERSISTENT:
        return tl.program_id(0), tiles, tl.num_programs(0)
    else:
        return 0, 1, 1


@triton.jit
def _tile_index(tile, blocks, heads, PERSISTENT: tl.constexpr):
    """(block, head, batch) of a tile: numbered block-fastest over (blocks, heads, batch)
    (PERSISTENT), else the program's grid position."""
    if PERSISTENT:
        return tile % blocks, tile // blocks % heads, tile // (blocks * heads)
    else:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def _sequence(b, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, SeqUsedK, VARLEN: tl.constexpr,
              SEQUSED_K: tl.constexpr):
    """(first query row, query rows, first key row, keys) of sequence b: from cu_seqlens
    (VARLEN: packed sequences, rows of one (tokens, heads, head_dim) tensor), else the
    whole seqlen_q and seqlen_k, or seqused_k[b] keys (SEQUSED_K: a KV cache's filled
    length)."""
    if VARLEN:
        q_start = tl.load(CuSeqQ + b)
        k_start = tl.load(CuSeqK + b)
        return (q_start, tl.load(CuSeqQ + b + 1) - q_start, k_start,
                tl.load(CuSeqK + b + 1) - k_start)
    elif SEQUSED_K:
        return b * 0, seqlen_q, b * 0, tl.load(SeqUsedK + b)
    else:
        return b * 0, seqlen_q, b * 0, seqlen_k


@triton.jit
def _load_keys(view, stride_page, stride_s, stride_d, row0, seqlen, table_row, page_size,
               HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
               USE_TMA: tl.constexpr, PAGED: tl.constexpr):
    """Key (or value) rows [row0, row0 + BLOCK_ROWS) of a view; PAGED: row j lives in
    block table_row[j // page_size] (a block being stride_page apart), row j % page_size.
    Rows past seqlen read 0 (never a stale cache entry, which may hold NaN)."""
    if PAGED:
        rows = row0 + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        in_range = rows < seqlen
        pages = tl.load(table_row + rows // page_size, mask=in_range, other=0).to(tl.int64)
        mask = in_range[:, None]
        if HEAD_DIM < BLOCK_D:
            mask = mask & (cols[None, :] < HEAD_DIM)
        ptrs = (view + pages[:, None] * stride_page
                + (rows % page_size).to(tl.int64)[:, None] * stride_s + cols[None, :] * stride_d)
        return tl.load(ptrs, mask=mask, other=0.0)
    else:
        return _load_rows(view, 0, stride_s, stride_d, 0, row0, seqlen, HEAD_DIM, BLOCK_ROWS,
                          BLOCK_D, USE_TMA)


# ---------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------

@triton.jit
def _fwd_key_blocks(acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd,
                    stride_vb, stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, start, end,
                    seqlen_k, diagonal, qk_scale, window_left, window_right, softcap, slope,
                    seed, rng_offset, batch_id, head, dropout_threshold, dropout_scale,
                    table_row, page_size, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
                    LEFT_BOUNDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                    DROPOUT: tl.constexpr, PAGED: tl.constexpr):
    """Online softmax over the key blocks [start, end). MASKED: blocks crossing a window
    bound (the causal diagonal among them) or the key tail; without it only padding
    (HAS_MASK) is masked."""
    CHECK: tl.constexpr = MASKED or HAS_MASK
    # triton-ascend 3.2 takes no chained boolean operators (A or B or C).
    SCORE_MOD: tl.constexpr = SOFTCAP or ALIBI
    for n0 in range(start, end, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        # Stage: raw scores Q Kᵀ.
        k = _load_keys(k_view, stride_kb, stride_ks, stride_kd, n0, seqlen_k, table_row,
                       page_size, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA, PAGED)
        s = tl.dot(q, tl.trans(k))
        # Stage: the new running max of the scores (log2 units), and P.
        if CHECK or SCORE_MOD:
            # Scale before masking, so that a hidden score is -inf whatever the scale's
            # sign. A row that has seen no key yet keeps m = -inf and subtracts 0
            # instead, so that exp2 gives 0, not NaN.
            s, _ = _scores_log2(s, offs_m[:, None], offs_n[None, :], diagonal, qk_scale,
                                softcap, slope, SOFTCAP, ALIBI)
            if CHECK:
                visible = _visible(offs_m[:, None], offs_n[None, :], keep_row, keep_stride_s,
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
        v = _load_keys(v_view, stride_vb, stride_vs, stride_vd, n0, seqlen_k, table_row,
                       page_size, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA, PAGED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_tile(Q, K, V, Out, Lse, Keep, block, h, b, blocks,
              stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
              stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
              stride_os, stride_od, keep_stride_b, keep_stride_s,
              heads_q, group, seqlen_q, seqlen_k, qk_scale,
              window_left, window_right, softcap, Alibi, alibi_stride_b, Rng, dropout_threshold,
              dropout_scale, CuSeqQ, CuSeqK, SeqUsedK, BlockTable, block_table_stride,
              page_size, CacheBatchIdx,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
              VARLEN: tl.constexpr, SEQUSED_K: tl.constexpr, PAGED: tl.constexpr,
              BATCH_IDX: tl.constexpr):
    """out and lse of query block ``block`` of head h, sequence b. Causal query blocks
    get cheaper towards the top, so they run last-first (longest first, fewer idle cores
    at the end). Packed sequences (VARLEN) have their own number of blocks: a program
    past its sequence's rows does nothing."""
    q_start, len_q, k_start, len_k = _sequence(b, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, SeqUsedK,
                                               VARLEN, SEQUSED_K)
    if VARLEN:
        blocks = tl.cdiv(len_q, BLOCK_M)
    if CAUSAL:
        block = blocks - 1 - block
    m0 = block * BLOCK_M
    if (m0 >= 0) & (m0 < len_q):
        h_kv = h // group  # GQA/MQA: query heads share a key/value head by index
        diagonal = len_k - len_q
        offs_m = m0 + tl.arange(0, BLOCK_M)
        # Where this sequence's rows live: packed sequences are row ranges of one tensor
        # (batch 0); a KV cache maps a sequence to a cache row or to pages.
        tensor_b = b * 0 if VARLEN else b
        cache_b = tl.load(CacheBatchIdx + b) if BATCH_IDX else tensor_b
        q_view = _heads_view(Q + q_start.to(tl.int64) * stride_qs, stride_qb, stride_qh,
                             stride_qs, tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        k_view, v_view = _key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks,
                                          stride_vb, stride_vh, stride_vs,
                                          cache_b * 0 if PAGED else cache_b, h_kv, len_k,
                                          HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        table_row = BlockTable + b.to(tl.int64) * block_table_stride if PAGED else BlockTable
        keep_row = Keep  # batch b's row of the key padding mask (None without one)
        if HAS_MASK:
            keep_row += b.to(tl.int64) * keep_stride_b
        slope = tl.load(Alibi + b * alibi_stride_b + h) if ALIBI else 0.0
        seed = tl.load(Rng) if DROPOUT else 0
        rng_offset = tl.load(Rng + 1) if DROPOUT else 0

        # Stage: fp32 running state; Q is loaded once.
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        q = _load_rows(q_view, 0, stride_qs, stride_qd, 0, m0, len_q, HEAD_DIM, BLOCK_M,
                       BLOCK_D, USE_TMA)

        # Stage: key blocks crossing the window's left bound, those every row sees whole,
        # then those on the diagonal / right bound and the key tail.
        lo, mid, hi, end = _key_block_range(m0, len_k, diagonal, window_left, window_right,
                                            BLOCK_M, BLOCK_N, LEFT_BOUNDED, CAUSAL)
        if LEFT_BOUNDED:
            acc, l_i, m_i = _fwd_key_blocks(
                acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb,
                stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, lo, mid, len_k, diagonal,
                qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
                dropout_threshold, dropout_scale, table_row, page_size, HEAD_DIM, BLOCK_N,
                BLOCK_D, True, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, LEFT_BOUNDED, SOFTCAP,
                ALIBI, DROPOUT, PAGED)
        acc, l_i, m_i = _fwd_key_blocks(
            acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb,
            stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, mid, hi, len_k, diagonal,
            qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
            dropout_threshold, dropout_scale, table_row, page_size, HEAD_DIM, BLOCK_N, BLOCK_D,
            False, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, LEFT_BOUNDED, SOFTCAP, ALIBI,
            DROPOUT, PAGED)
        acc, l_i, m_i = _fwd_key_blocks(
            acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb,
            stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, hi, end, len_k, diagonal,
            qk_scale, window_left, window_right, softcap, slope, seed, rng_offset, b, h,
            dropout_threshold, dropout_scale, table_row, page_size, HEAD_DIM, BLOCK_N, BLOCK_D,
            True, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA, LEFT_BOUNDED, SOFTCAP, ALIBI,
            DROPOUT, PAGED)

        # Epilogue: normalise once; rows that saw no key (l = 0) give out 0, lse -inf.
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        o_view = _heads_view(Out + q_start.to(tl.int64) * stride_os, stride_ob, stride_oh,
                             stride_os, tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D,
                             USE_TMA)
        _store_rows(o_view, 0, stride_os, stride_od, 0, m0, acc / l_safe[:, None], len_q,
                    HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
        tl.store(_row_vector(Lse, tensor_b, h, heads_q, seqlen_q) + q_start + offs_m, lse,
                 mask=offs_m < len_q)


@triton.jit
def _fwd_group_tile(Q, K, V, Out, Lse, block, h_kv, b,
                    stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                    stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                    stride_os, stride_od, heads_q, group, seqlen_q, seqlen_k, qk_scale,
                    window_left, window_right, softcap, Alibi, alibi_stride_b, SeqUsedK,
                    BlockTable, block_table_stride, page_size, CacheBatchIdx,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEQUSED_K: tl.constexpr,
                    PAGED: tl.constexpr, BATCH_IDX: tl.constexpr):
    """Decoding over a KV cache with GQA (PACK_GQA): the rows of a tile are the (query
    head of kv head h_kv's group, position) pairs of sequence b, group-major, so each K/V
    block is read once for the whole group rather than once per query head. A few rows
    per head, so every key block is masked per row (causal and windows by position)."""
    _, len_q, _, len_k = _sequence(b, seqlen_q, seqlen_k, None, None, SeqUsedK, False,
                                   SEQUSED_K)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < group * len_q
    heads = h_kv * group + rows // len_q
    positions = rows % len_q
    diagonal = len_k - len_q
    cols = tl.arange(0, BLOCK_D)
    cols_ok = cols[None, :] < HEAD_DIM
    q_ptrs = (Q + b.to(tl.int64) * stride_qb + heads.to(tl.int64)[:, None] * stride_qh
              + positions.to(tl.int64)[:, None] * stride_qs + cols[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=valid[:, None] & cols_ok, other=0.0)
    cache_b = tl.load(CacheBatchIdx + b) if BATCH_IDX else b
    k_view = _heads_view(K, stride_kb, stride_kh, stride_ks, cache_b * 0 if PAGED else cache_b,
                         h_kv, 1, len_k, HEAD_DIM, BLOCK_N, BLOCK_D, False)
    v_view = _heads_view(V, stride_vb, stride_vh, stride_vs, cache_b * 0 if PAGED else cache_b,
                         h_kv, 1, len_k, HEAD_DIM, BLOCK_N, BLOCK_D, False)
    table_row = BlockTable + b.to(tl.int64) * block_table_stride if PAGED else BlockTable
    slope = tl.load(Alibi + b * alibi_stride_b + heads, mask=valid, other=0.0)[:, None] \
        if ALIBI else 0.0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Stage: the keys some position sees (the first position's left bound, the last
    # position's right bound), every block masked per row.
    start = 0
    if LEFT_BOUNDED:
        start = tl.maximum(diagonal - window_left, 0) // BLOCK_N * BLOCK_N
    end = tl.minimum(len_k, len_q + diagonal + window_right) if CAUSAL else len_k
    acc, l_i, m_i = _fwd_key_blocks(
        acc, l_i, m_i, q, k_view, v_view, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs,
        stride_vd, None, 0, positions, start, end, len_k, diagonal, qk_scale, window_left,
        window_right, softcap, slope, 0, 0, b, 0, 0, 1.0, table_row, page_size, HEAD_DIM,
        BLOCK_N, BLOCK_D, True, CAUSAL, False, False, False, LEFT_BOUNDED, SOFTCAP, ALIBI,
        False, PAGED)
    # Epilogue: as _fwd_tile's, each row to its head and position.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o_ptrs = (Out + b.to(tl.int64) * stride_ob + heads.to(tl.int64)[:, None] * stride_oh
              + positions.to(tl.int64)[:, None] * stride_os + cols[None, :] * stride_od)
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty),
             mask=valid[:, None] & cols_ok)
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    tl.store(Lse + (b.to(tl.int64) * heads_q + heads) * seqlen_q + positions, lse, mask=valid)


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
             max_seqlen_q=1, LEFT_BOUNDED: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
             ALIBI: tl.constexpr = False, DROPOUT: tl.constexpr = False,
             VARLEN: tl.constexpr = False, SEQUSED_K: tl.constexpr = False,
             PAGED: tl.constexpr = False, BATCH_IDX: tl.constexpr = False,
             PACK_GQA: tl.constexpr = False):
    """Tiles (query blocks, heads_q, batch): out and lse of one query block of one head
    (PACK_GQA, for decoding over a KV cache: tiles (blocks of group x seqlen_q rows,
    heads_kv, batch), see _fwd_group_tile).
    NEGATIVE_SCALE: qk_scale < 0 (the sign decides which end of a score row is its max).
    CAUSAL: the window has a right bound, window_right keys right of the diagonal (0 for
    causal calls). The arguments after BLOCK_N are the features' (flash_cann.variant),
    off by default: a left window bound, softcap, ALiBi slopes (batch, heads_q), dropout
    (Rng = (seed, offset); keep iff draw >= dropout_threshold; kept P x dropout_scale),
    packed sequences (VARLEN: cu_seqlens; the grid covers max_seqlen_q), a KV cache's
    filled lengths (SEQUSED_K), pages (PAGED: block table, page_size) and cache rows
    (BATCH_IDX)."""
    _assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    if PACK_GQA:
        tl.static_assert(SEQUSED_K and not ((VARLEN or DROPOUT) or (HAS_MASK or PERSISTENT)),
                         "PACK_GQA serves KV-cache decoding only")
        _fwd_group_tile(Q, K, V, Out, Lse, tl.program_id(0), tl.program_id(1),
                        tl.program_id(2), stride_qb, stride_qh, stride_qs, stride_qd, stride_kb,
                        stride_kh, stride_ks, stride_kd, stride_vb, stride_vh, stride_vs,
                        stride_vd, stride_ob, stride_oh, stride_os, stride_od, heads_q, group,
                        seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap, Alibi,
                        alibi_stride_b, SeqUsedK, BlockTable, block_table_stride, page_size,
                        CacheBatchIdx, HEAD_DIM, BLOCK_D, CAUSAL, BLOCK_M, BLOCK_N,
                        LEFT_BOUNDED, SOFTCAP, ALIBI, SEQUSED_K, PAGED, BATCH_IDX)
        return
    blocks = tl.cdiv(max_seqlen_q if VARLEN else seqlen_q, BLOCK_M)
    first, end, step = _tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = _tile_index(tile, blocks, heads_q, PERSISTENT)
        _fwd_tile(Q, K, V, Out, Lse, Keep, block, h, b, blocks,
                  stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                  stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                  stride_os, stride_od, keep_stride_b, keep_stride_s, heads_q, group, seqlen_q,
                  seqlen_k, qk_scale, window_left, window_right, softcap, Alibi, alibi_stride_b,
                  Rng, dropout_threshold, dropout_scale, CuSeqQ, CuSeqK, SeqUsedK, BlockTable,
                  block_table_stride, page_size, CacheBatchIdx, HEAD_DIM, BLOCK_D, CAUSAL,
                  HAS_MASK, NEGATIVE_SCALE, USE_TMA, BLOCK_M, BLOCK_N, LEFT_BOUNDED, SOFTCAP,
                  ALIBI, DROPOUT, VARLEN, SEQUSED_K, PAGED, BATCH_IDX)


# ---------------------------------------------------------------------------------------
# Backward: D = rowsum(dO ∘ O) - dLSE, then dK/dV per key block and dQ per query block
# (two kernels, each owning its output: deterministic, no atomics).
# ---------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["batch", "heads_q", "seqlen_q"])
def attn_bwd_preprocess(Out, DOut, DLse, Delta, stride_ob, stride_oh, stride_os, stride_od,
                        stride_dob, stride_doh, stride_dos, stride_dod, batch, heads_q, seqlen_q,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        HAS_DLSE: tl.constexpr, PERSISTENT: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    """Tiles (query blocks, heads_q, batch): D = rowsum(dO ∘ O) - dLSE, fp32."""
    blocks = tl.cdiv(seqlen_q, BLOCK_M)
    first, end, step = _tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = _tile_index(tile, blocks, heads_q, PERSISTENT)
        m0 = block * BLOCK_M
        rows = m0 + tl.arange(0, BLOCK_M)
        # A streaming reduction with no MMA to feed: plain pointer loads (USE_TMA False).
        o_view = _heads_view(Out, stride_ob, stride_oh, stride_os, b, h, 1, seqlen_q, HEAD_DIM,
                             BLOCK_M, BLOCK_D, False)
        do_view = _heads_view(DOut, stride_dob, stride_doh, stride_dos, b, h, 1, seqlen_q,
                              HEAD_DIM, BLOCK_M, BLOCK_D, False)
        o = _load_rows(o_view, 0, stride_os, stride_od, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M,
                       BLOCK_D, False)
        do = _load_rows(do_view, 0, stride_dos, stride_dod, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M,
                        BLOCK_D, False)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        if HAS_DLSE:
            delta -= tl.load(_row_vector(DLse, b, h, heads_q, seqlen_q) + rows,
                             mask=rows < seqlen_q, other=0.0)
        tl.store(_row_vector(Delta, b, h, heads_q, seqlen_q) + rows, delta,
                 mask=rows < seqlen_q)


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
        q = _load_rows(q_view, stride_qh, stride_qs, stride_qd, g, m0, seqlen_q, HEAD_DIM,
                       BLOCK_M, BLOCK_D, USE_TMA)
        do = _load_rows(do_view, stride_doh, stride_dos, stride_dod, g, m0, seqlen_q, HEAD_DIM,
                        BLOCK_M, BLOCK_D, USE_TMA)
        rows = _row_vector(Lse, lse_b, h0 + g, heads_q, lse_seqlen) + q_start
        lse2 = _load_lse2(rows, offs_m, seqlen_q)
        delta = tl.load(_row_vector(Delta, lse_b, h0 + g, heads_q, lse_seqlen) + q_start + offs_m,
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
    q_start, len_q, k_start, len_k = _sequence(b, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, None,
                                               VARLEN, False)
    n0 = block * BLOCK_N
    if n0 < len_k:
        tensor_b = b * 0 if VARLEN else b
        h0 = h_kv * group  # the group's first query head
        diagonal = len_k - len_q
        offs_n = n0 + tl.arange(0, BLOCK_N)
        q_offset = q_start.to(tl.int64)
        # Stage: K and V of the block are loaded once; fp32 accumulators.
        k_view, v_view = _key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks,
                                          stride_vb, stride_vh, stride_vs, tensor_b, h_kv, len_k,
                                          HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        k = _load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, len_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        v = _load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, len_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        q_view = _heads_view(Q + q_offset * stride_qs, stride_qb, stride_qh, stride_qs, tensor_b,
                             h0, group, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        do_view = _heads_view(DOut + q_offset * stride_dos, stride_dob, stride_doh, stride_dos,
                              tensor_b, h0, group, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        seed = tl.load(Rng) if DROPOUT else 0
        rng_offset = tl.load(Rng + 1) if DROPOUT else 0

        # Stage: query blocks crossing the right bound (the diagonal), those that see the
        # whole key block, then those crossing the left bound.
        lo, mid, hi, end = _query_block_range(n0, len_q, diagonal, window_left, window_right,
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
        dk_view, dv_view = _key_value_views(DK, DV, k_start, stride_dkb, stride_dkh, stride_dks,
                                            stride_dvb, stride_dvh, stride_dvs, tensor_b, h_kv,
                                            len_k, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        _store_rows(dk_view, 0, stride_dks, stride_dkd, 0, n0, dk * scale, len_k, HEAD_DIM,
                    BLOCK_N, BLOCK_D, USE_TMA)
        _store_rows(dv_view, 0, stride_dvs, stride_dvd, 0, n0, dv, len_k, HEAD_DIM, BLOCK_N,
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
    _assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(max_seqlen_k if VARLEN else seqlen_k, BLOCK_N)
    heads_kv = heads_q // group
    first, end, step = _tiles_of_program(blocks * heads_kv * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h_kv, b = _tile_index(tile, blocks, heads_kv, PERSISTENT)
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
        k = _load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        v = _load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        if CHECK:
            visible = _visible(offs_m[:, None], offs_n[None, :], keep_row, keep_stride_s,
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
    q_start, len_q, k_start, len_k = _sequence(b, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, None,
                                               VARLEN, False)
    if VARLEN:
        blocks = tl.cdiv(len_q, BLOCK_M)
    if CAUSAL:
        block = blocks - 1 - block
    m0 = block * BLOCK_M
    if (m0 >= 0) & (m0 < len_q):
        tensor_b = b * 0 if VARLEN else b
        h_kv = h // group
        diagonal = len_k - len_q
        offs_m = m0 + tl.arange(0, BLOCK_M)
        q_offset = q_start.to(tl.int64)
        # Stage: Q, dO, lse and D of the block are loaded once.
        q_view = _heads_view(Q + q_offset * stride_qs, stride_qb, stride_qh, stride_qs, tensor_b,
                             h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        do_view = _heads_view(DOut + q_offset * stride_dos, stride_dob, stride_doh, stride_dos,
                              tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        k_view, v_view = _key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks,
                                          stride_vb, stride_vh, stride_vs, tensor_b, h_kv, len_k,
                                          HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
        q = _load_rows(q_view, 0, stride_qs, stride_qd, 0, m0, len_q, HEAD_DIM, BLOCK_M,
                       BLOCK_D, USE_TMA)
        do = _load_rows(do_view, 0, stride_dos, stride_dod, 0, m0, len_q, HEAD_DIM, BLOCK_M,
                        BLOCK_D, USE_TMA)
        lse2 = _load_lse2(_row_vector(Lse, tensor_b, h, heads_q, seqlen_q) + q_start, offs_m,
                          len_q)
        delta = tl.load(_row_vector(Delta, tensor_b, h, heads_q, seqlen_q) + q_start + offs_m,
                        mask=offs_m < len_q, other=0.0)
        keep_row = Keep  # batch b's row of the key padding mask (None without one)
        if HAS_MASK:
            keep_row += b.to(tl.int64) * keep_stride_b
        slope = tl.load(Alibi + b * alibi_stride_b + h) if ALIBI else 0.0
        seed = tl.load(Rng) if DROPOUT else 0
        rng_offset = tl.load(Rng + 1) if DROPOUT else 0
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        # Stage: key blocks crossing the left bound, those every row sees whole, then the
        # diagonal / right bound and the key tail.
        lo, mid, hi, end = _key_block_range(m0, len_k, diagonal, window_left, window_right,
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
        dq_view = _heads_view(DQ + q_offset * stride_dqs, stride_dqb, stride_dqh, stride_dqs,
                              tensor_b, h, 1, len_q, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
        _store_rows(dq_view, 0, stride_dqs, stride_dqd, 0, m0, dq * scale, len_q, HEAD_DIM,
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
    _assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(max_seqlen_q if VARLEN else seqlen_q, BLOCK_M)
    first, end, step = _tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = _tile_index(tile, blocks, heads_q, PERSISTENT)
        _dq_tile(Q, K, V, DOut, Lse, Delta, Keep, DQ, block, h, b, blocks,
                 stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                 stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                 stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                 keep_stride_b, keep_stride_s, heads_q, group, seqlen_q, seqlen_k, scale,
                 qk_scale, window_left, window_right, softcap, Alibi, alibi_stride_b, Rng,
                 dropout_threshold, dropout_scale, CuSeqQ, CuSeqK, HEAD_DIM, BLOCK_D, CAUSAL,
                 HAS_MASK, USE_TMA, BLOCK_M, BLOCK_N, LEFT_BOUNDED, SOFTCAP, ALIBI, DROPOUT,
                 VARLEN)
