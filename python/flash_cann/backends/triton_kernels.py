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
def _visible(q_idx, k_idx, keep_row, keep_stride_s, seqlen_k, diagonal,
             CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """Which (query, key) pairs of a queries x keys tile may attend: the key exists, is
    on or below the bottom-right causal diagonal, and is not padding (q_idx a column,
    k_idx a row)."""
    in_range = k_idx < seqlen_k
    visible = in_range
    if CAUSAL:
        visible = visible & (k_idx <= q_idx + diagonal)
    if HAS_MASK:
        keep = tl.load(keep_row + k_idx * keep_stride_s, mask=in_range, other=0)
        visible = visible & (keep != 0)
    return visible


@triton.jit
def _key_block_range(m0, seqlen_k, diagonal, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr):
    """For the query block [m0, m0 + BLOCK_M): (full_end, end). Key blocks below
    full_end are seen whole by every row (no mask); [full_end, end) holds the causal
    diagonal and the key tail (masked); keys from end on are seen by no row."""
    if CAUSAL:
        end = tl.minimum(seqlen_k, m0 + BLOCK_M + diagonal)
        full_end = tl.minimum(seqlen_k, m0 + 1 + diagonal)
    else:
        end = seqlen_k
        full_end = seqlen_k
    full_end = tl.maximum(full_end, 0) // BLOCK_N * BLOCK_N
    return full_end, end


@triton.jit
def _query_block_range(n0, seqlen_q, diagonal, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr):
    """For the key block [n0, n0 + BLOCK_N): (start, full_start). Query blocks before
    start see none of its keys; [start, full_start) cross the causal diagonal (masked);
    from full_start on every row sees every key of the block (no mask)."""
    if CAUSAL:
        start = tl.maximum(n0 - diagonal, 0) // BLOCK_M * BLOCK_M
        full_start = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - diagonal, 0), BLOCK_M) * BLOCK_M
        full_start = tl.minimum(full_start, tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M)
    else:
        start = 0
        full_start = 0
    return start, full_start


@triton.jit
def _probs_and_score_grads(a, b, c, d, lse2, delta, visible, qk_scale,
                           APPLY_VISIBLE: tl.constexpr):
    """One tile of the recomputed softmax and of its score gradient:
        P  = exp2(qk_scale * a bᵀ - lse2)      (masked by ``visible`` if APPLY_VISIBLE)
        dS = P ∘ (c dᵀ - D)
    The caller orients the tile by its operands: (q, k, dO, v) with lse2 and D as
    columns gives queries x keys (the dQ kernel); (k, q, v, dO) with lse2 and D as rows
    gives keys x queries (the dK/dV kernel: its key tile is the MMAs' M dimension, so
    K and V stay in shared memory and Pᵀ, dSᵀ feed the next MMAs without a transpose)."""
    p = tl.math.exp2(tl.dot(a, tl.trans(b)) * qk_scale - lse2)
    if APPLY_VISIBLE:
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(c, tl.trans(d))
    return p, p * (dp - delta)


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


# ---------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------

@triton.jit
def _fwd_key_blocks(acc, l_i, m_i, q, k_view, v_view, stride_ks, stride_kd, stride_vs,
                    stride_vd, keep_row, keep_stride_s, offs_m, start, end, seqlen_k, diagonal,
                    qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr):
    """Online softmax over the key blocks [start, end). MASKED: blocks on the causal
    diagonal or the key tail; without it only padding (HAS_MASK) is masked."""
    CHECK: tl.constexpr = MASKED or HAS_MASK
    for n0 in range(start, end, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        # Stage: raw scores Q Kᵀ.
        k = _load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        s = tl.dot(q, tl.trans(k))
        # Stage: the new running max of the scaled scores (log2 units), and P.
        if CHECK:
            # Scale before masking, so that a hidden score is -inf whatever the scale's
            # sign. A row that has seen no key yet keeps m = -inf and subtracts 0
            # instead, so that exp2 gives 0, not NaN.
            offs_n = n0 + tl.arange(0, BLOCK_N)
            visible = _visible(offs_m[:, None], offs_n[None, :], keep_row, keep_stride_s,
                               seqlen_k, diagonal, CAUSAL and MASKED, HAS_MASK)
            s = tl.where(visible, s * qk_scale, float("-inf"))
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
        # Stage: rescale the running sum and output, then accumulate P V.
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_tile(Q, K, V, Out, Lse, Keep, block, h, b, blocks,
              stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
              stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
              stride_os, stride_od, keep_stride_b, keep_stride_s,
              heads_q, group, seqlen_q, seqlen_k, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out and lse of query block ``block`` of head h, batch b. Causal query blocks get
    cheaper towards the top, so they run last-first (longest first, fewer idle cores at
    the end)."""
    if CAUSAL:
        block = blocks - 1 - block
    m0 = block * BLOCK_M
    h_kv = h // group  # GQA/MQA: query heads share a key/value head by index
    diagonal = seqlen_k - seqlen_q
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_view = _heads_view(Q, stride_qb, stride_qh, stride_qs, b, h, 1, seqlen_q, HEAD_DIM,
                         BLOCK_M, BLOCK_D, USE_TMA)
    k_view = _heads_view(K, stride_kb, stride_kh, stride_ks, b, h_kv, 1, seqlen_k, HEAD_DIM,
                         BLOCK_N, BLOCK_D, USE_TMA)
    v_view = _heads_view(V, stride_vb, stride_vh, stride_vs, b, h_kv, 1, seqlen_k, HEAD_DIM,
                         BLOCK_N, BLOCK_D, USE_TMA)
    keep_row = Keep  # batch b's row of the key padding mask (None without one)
    if HAS_MASK:
        keep_row += b.to(tl.int64) * keep_stride_b

    # Stage: fp32 running state; Q is loaded once.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    q = _load_rows(q_view, 0, stride_qs, stride_qd, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D,
                   USE_TMA)

    # Stage: key blocks every row sees whole, then the diagonal / tail blocks.
    full_end, end = _key_block_range(m0, seqlen_k, diagonal, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fwd_key_blocks(acc, l_i, m_i, q, k_view, v_view, stride_ks, stride_kd,
                                    stride_vs, stride_vd, keep_row, keep_stride_s, offs_m, 0,
                                    full_end, seqlen_k, diagonal, qk_scale, HEAD_DIM, BLOCK_N,
                                    BLOCK_D, False, CAUSAL, HAS_MASK, NEGATIVE_SCALE, USE_TMA)
    acc, l_i, m_i = _fwd_key_blocks(acc, l_i, m_i, q, k_view, v_view, stride_ks, stride_kd,
                                    stride_vs, stride_vd, keep_row, keep_stride_s, offs_m,
                                    full_end, end, seqlen_k, diagonal, qk_scale, HEAD_DIM,
                                    BLOCK_N, BLOCK_D, True, CAUSAL, HAS_MASK, NEGATIVE_SCALE,
                                    USE_TMA)

    # Epilogue: normalise once; rows that saw no key (l = 0) give out 0, lse -inf.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o_view = _heads_view(Out, stride_ob, stride_oh, stride_os, b, h, 1, seqlen_q, HEAD_DIM,
                         BLOCK_M, BLOCK_D, USE_TMA)
    _store_rows(o_view, 0, stride_os, stride_od, 0, m0, acc / l_safe[:, None], seqlen_q,
                HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    tl.store(_row_vector(Lse, b, h, heads_q, seqlen_q) + offs_m, lse, mask=offs_m < seqlen_q)


@triton.jit(do_not_specialize=["keep_stride_b", "keep_stride_s", "batch", "heads_q", "group",
                               "seqlen_q", "seqlen_k", "seqlen_q_bucket", "seqlen_k_bucket"])
def attn_fwd(Q, K, V, Out, Lse, Keep,
             stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
             stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
             stride_os, stride_od, keep_stride_b, keep_stride_s,
             batch, heads_q, group, seqlen_q, seqlen_k, qk_scale,
             seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_MASK: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
             PERSISTENT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tiles (query blocks, heads_q, batch): out and lse of one query block of one head.
    NEGATIVE_SCALE: qk_scale < 0 (the sign decides which end of a score row is its max)."""
    _assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(seqlen_q, BLOCK_M)
    first, end, step = _tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = _tile_index(tile, blocks, heads_q, PERSISTENT)
        _fwd_tile(Q, K, V, Out, Lse, Keep, block, h, b, blocks,
                  stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                  stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh,
                  stride_os, stride_od, keep_stride_b, keep_stride_s, heads_q, group, seqlen_q,
                  seqlen_k, qk_scale, HEAD_DIM, BLOCK_D, CAUSAL, HAS_MASK, NEGATIVE_SCALE,
                  USE_TMA, BLOCK_M, BLOCK_N)


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
                       stride_doh, stride_dos, stride_dod, Lse, Delta, b, h0, group, offs_n,
                       start, end, heads_q, seqlen_q, diagonal, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_D: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """Accumulate dK, dV of one key block over the query blocks [start, end) of every
    query head h0 + g of its group, as one flat loop over (g, block): no loop nest, so
    the compiler keeps the accumulators in registers. MASKED: blocks crossing the causal
    diagonal. Rows past seqlen_q load as q = dO = 0 with lse2 = +inf: they add nothing."""
    blocks = tl.cdiv(tl.maximum(end - start, 0), BLOCK_M)
    for i in range(group * blocks):
        g = i // blocks
        m0 = tl.multiple_of(start + (i - g * blocks) * BLOCK_M, BLOCK_M)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        q = _load_rows(q_view, stride_qh, stride_qs, stride_qd, g, m0, seqlen_q, HEAD_DIM,
                       BLOCK_M, BLOCK_D, USE_TMA)
        do = _load_rows(do_view, stride_doh, stride_dos, stride_dod, g, m0, seqlen_q, HEAD_DIM,
                        BLOCK_M, BLOCK_D, USE_TMA)
        lse2 = _load_lse2(_row_vector(Lse, b, h0 + g, heads_q, seqlen_q), offs_m, seqlen_q)
        delta = tl.load(_row_vector(Delta, b, h0 + g, heads_q, seqlen_q) + offs_m,
                        mask=offs_m < seqlen_q, other=0.0)
        # Stage: Pᵀ and dSᵀ (keys x queries), causal-masked on the diagonal (the key
        # tail and padding need no mask: their rows of dK/dV are dropped or zeroed).
        if MASKED:
            visible = offs_n[:, None] <= offs_m[None, :] + diagonal
        else:
            visible = None
        p_t, ds_t = _probs_and_score_grads(k, q, v, do, lse2[None, :], delta[None, :], visible,
                                           qk_scale, MASKED)
        # Stage: dV += Pᵀ dO;  dK += dSᵀ Q (scaled once at the end).
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
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK and dV of key block ``block`` of kv head h_kv, batch b, summed over the query
    heads of its group (GQA) here, so no two tiles write the same element."""
    n0 = block * BLOCK_N
    h0 = h_kv * group  # the group's first query head
    diagonal = seqlen_k - seqlen_q
    offs_n = n0 + tl.arange(0, BLOCK_N)
    # Stage: K and V of the block are loaded once; fp32 accumulators.
    k_view = _heads_view(K, stride_kb, stride_kh, stride_ks, b, h_kv, 1, seqlen_k, HEAD_DIM,
                         BLOCK_N, BLOCK_D, USE_TMA)
    v_view = _heads_view(V, stride_vb, stride_vh, stride_vs, b, h_kv, 1, seqlen_k, HEAD_DIM,
                         BLOCK_N, BLOCK_D, USE_TMA)
    k = _load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D,
                   USE_TMA)
    v = _load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D,
                   USE_TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    q_view = _heads_view(Q, stride_qb, stride_qh, stride_qs, b, h0, group, seqlen_q, HEAD_DIM,
                         BLOCK_M, BLOCK_D, USE_TMA)
    do_view = _heads_view(DOut, stride_dob, stride_doh, stride_dos, b, h0, group, seqlen_q,
                          HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)

    # Stage: query blocks crossing the diagonal (masked), then those that see the whole
    # key block.
    start, full_start = _query_block_range(n0, seqlen_q, diagonal, BLOCK_M, BLOCK_N, CAUSAL)
    dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_view, do_view, stride_qh, stride_qs, stride_qd,
                                stride_doh, stride_dos, stride_dod, Lse, Delta, b, h0, group,
                                offs_n, start, full_start, heads_q, seqlen_q, diagonal,
                                qk_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True, USE_TMA)
    dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_view, do_view, stride_qh, stride_qs, stride_qd,
                                stride_doh, stride_dos, stride_dod, Lse, Delta, b, h0, group,
                                offs_n, full_start, seqlen_q, heads_q, seqlen_q, diagonal,
                                qk_scale, HEAD_DIM, BLOCK_M, BLOCK_D, False, USE_TMA)

    # Epilogue: padded keys get exactly zero gradients; dK = scale * dSᵀ Q.
    if HAS_MASK:
        keep_row = Keep + b.to(tl.int64) * keep_stride_b
        keep = tl.load(keep_row + offs_n * keep_stride_s, mask=offs_n < seqlen_k, other=0) != 0
        dk = tl.where(keep[:, None], dk, 0.0)
        dv = tl.where(keep[:, None], dv, 0.0)
    dk_view = _heads_view(DK, stride_dkb, stride_dkh, stride_dks, b, h_kv, 1, seqlen_k,
                          HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    dv_view = _heads_view(DV, stride_dvb, stride_dvh, stride_dvs, b, h_kv, 1, seqlen_k,
                          HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    _store_rows(dk_view, 0, stride_dks, stride_dkd, 0, n0, dk * scale, seqlen_k, HEAD_DIM,
                BLOCK_N, BLOCK_D, USE_TMA)
    _store_rows(dv_view, 0, stride_dvs, stride_dvd, 0, n0, dv, seqlen_k, HEAD_DIM, BLOCK_N,
                BLOCK_D, USE_TMA)


@triton.jit(do_not_specialize=["keep_stride_b", "keep_stride_s", "batch", "heads_q", "group",
                               "seqlen_q", "seqlen_k", "seqlen_q_bucket", "seqlen_k_bucket"])
def attn_bwd_dkdv(Q, K, V, DOut, Lse, Delta, Keep, DK, DV,
                  stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                  stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                  stride_dos, stride_dod, stride_dkb, stride_dkh, stride_dks, stride_dkd,
                  stride_dvb, stride_dvh, stride_dvs, stride_dvd, keep_stride_b, keep_stride_s,
                  batch, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
                  seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                  HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr, PERSISTENT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tiles (key blocks, heads_kv, batch): dK and dV of one key block of one kv head."""
    _assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(seqlen_k, BLOCK_N)
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
                   HEAD_DIM, BLOCK_D, CAUSAL, HAS_MASK, USE_TMA, BLOCK_M, BLOCK_N)


@triton.jit
def _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd, stride_vs,
                   stride_vd, keep_row, keep_stride_s, offs_m, start, end, seqlen_k, diagonal,
                   qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr):
    """Accumulate dQ of one query block over the key blocks [start, end). MASKED: the
    causal diagonal and the key tail; without it only padding (HAS_MASK) is masked."""
    CHECK: tl.constexpr = MASKED or HAS_MASK
    for n0 in range(start, end, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        k = _load_rows(k_view, 0, stride_ks, stride_kd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        v = _load_rows(v_view, 0, stride_vs, stride_vd, 0, n0, seqlen_k, HEAD_DIM, BLOCK_N,
                       BLOCK_D, USE_TMA)
        if CHECK:
            offs_n = n0 + tl.arange(0, BLOCK_N)
            visible = _visible(offs_m[:, None], offs_n[None, :], keep_row, keep_stride_s,
                               seqlen_k, diagonal, CAUSAL and MASKED, HAS_MASK)
        else:
            visible = None
        # Stage: P and dS (queries x keys); dQ += dS K (scaled once at the end).
        _, ds = _probs_and_score_grads(q, k, do, v, lse2[:, None], delta[:, None], visible,
                                       qk_scale, CHECK)
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _dq_tile(Q, K, V, DOut, Lse, Delta, Keep, DQ, block, h, b, blocks,
             stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
             stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
             stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
             keep_stride_b, keep_stride_s, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of query block ``block`` of head h, batch b (causal: last-first, as forward)."""
    if CAUSAL:
        block = blocks - 1 - block
    m0 = block * BLOCK_M
    h_kv = h // group
    diagonal = seqlen_k - seqlen_q
    offs_m = m0 + tl.arange(0, BLOCK_M)
    # Stage: Q, dO, lse and D of the block are loaded once.
    q_view = _heads_view(Q, stride_qb, stride_qh, stride_qs, b, h, 1, seqlen_q, HEAD_DIM,
                         BLOCK_M, BLOCK_D, USE_TMA)
    do_view = _heads_view(DOut, stride_dob, stride_doh, stride_dos, b, h, 1, seqlen_q, HEAD_DIM,
                          BLOCK_M, BLOCK_D, USE_TMA)
    k_view = _heads_view(K, stride_kb, stride_kh, stride_ks, b, h_kv, 1, seqlen_k, HEAD_DIM,
                         BLOCK_N, BLOCK_D, USE_TMA)
    v_view = _heads_view(V, stride_vb, stride_vh, stride_vs, b, h_kv, 1, seqlen_k, HEAD_DIM,
                         BLOCK_N, BLOCK_D, USE_TMA)
    q = _load_rows(q_view, 0, stride_qs, stride_qd, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D,
                   USE_TMA)
    do = _load_rows(do_view, 0, stride_dos, stride_dod, 0, m0, seqlen_q, HEAD_DIM, BLOCK_M,
                    BLOCK_D, USE_TMA)
    lse2 = _load_lse2(_row_vector(Lse, b, h, heads_q, seqlen_q), offs_m, seqlen_q)
    delta = tl.load(_row_vector(Delta, b, h, heads_q, seqlen_q) + offs_m, mask=offs_m < seqlen_q,
                    other=0.0)
    keep_row = Keep  # batch b's row of the key padding mask (None without one)
    if HAS_MASK:
        keep_row += b.to(tl.int64) * keep_stride_b
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Stage: key blocks every row sees whole, then the diagonal / tail blocks.
    full_end, end = _key_block_range(m0, seqlen_k, diagonal, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd, stride_vs,
                        stride_vd, keep_row, keep_stride_s, offs_m, 0, full_end, seqlen_k,
                        diagonal, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, HAS_MASK,
                        USE_TMA)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_view, v_view, stride_ks, stride_kd, stride_vs,
                        stride_vd, keep_row, keep_stride_s, offs_m, full_end, end, seqlen_k,
                        diagonal, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, HAS_MASK,
                        USE_TMA)

    # Epilogue: dQ = scale * dS K.
    dq_view = _heads_view(DQ, stride_dqb, stride_dqh, stride_dqs, b, h, 1, seqlen_q, HEAD_DIM,
                          BLOCK_M, BLOCK_D, USE_TMA)
    _store_rows(dq_view, 0, stride_dqs, stride_dqd, 0, m0, dq * scale, seqlen_q, HEAD_DIM,
                BLOCK_M, BLOCK_D, USE_TMA)


@triton.jit(do_not_specialize=["keep_stride_b", "keep_stride_s", "batch", "heads_q", "group",
                               "seqlen_q", "seqlen_k", "seqlen_q_bucket", "seqlen_k_bucket"])
def attn_bwd_dq(Q, K, V, DOut, Lse, Delta, Keep, DQ,
                stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                keep_stride_b, keep_stride_s,
                batch, heads_q, group, seqlen_q, seqlen_k, scale, qk_scale,
                seqlen_q_bucket, seqlen_k_bucket,  # the autotuner's key only
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                HAS_MASK: tl.constexpr, USE_TMA: tl.constexpr, PERSISTENT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tiles (query blocks, heads_q, batch): dQ of one query block of one head."""
    _assert_tiles(HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    blocks = tl.cdiv(seqlen_q, BLOCK_M)
    first, end, step = _tiles_of_program(blocks * heads_q * batch, PERSISTENT)
    for tile in range(first, end, step):
        block, h, b = _tile_index(tile, blocks, heads_q, PERSISTENT)
        _dq_tile(Q, K, V, DOut, Lse, Delta, Keep, DQ, block, h, b, blocks,
                 stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                 stride_kd, stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh,
                 stride_dos, stride_dod, stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                 keep_stride_b, keep_stride_s, heads_q, group, seqlen_q, seqlen_k, scale,
                 qk_scale, HEAD_DIM, BLOCK_D, CAUSAL, HAS_MASK, USE_TMA, BLOCK_M, BLOCK_N)
