"""Tile helpers shared by the forward, decode and backward kernels: where a tile's
rows live (views, loads and stores, paged keys, per-sequence offsets), which tile a
program computes, and which partner blocks a tile's loops visit. Conventions: the
package docstring (``__init__.py``)."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e))
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * ln(2)
# The smallest tile edge tl.dot takes (the K dimension of an MMA instruction).
MIN_DOT_DIM: tl.constexpr = tl.constexpr(16)


@triton.jit
def assert_tiles(HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Tile constraints every MMA kernel relies on."""
    tl.static_assert(BLOCK_D >= HEAD_DIM, "BLOCK_D pads head_dim, never cuts it")
    tl.static_assert((BLOCK_D >= MIN_DOT_DIM and BLOCK_M >= MIN_DOT_DIM)
                     and BLOCK_N >= MIN_DOT_DIM, "tl.dot needs every tile edge >= 16")


@triton.jit
def heads_view(T, stride_b, stride_h, stride_s, b, h0, heads, seqlen, HEAD_DIM: tl.constexpr,
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
def key_value_views(K, V, k_start, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh,
                    stride_vs, b, h_kv, len_k, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """The views of one sequence's keys and values (or their gradients), as every tile
    reads or writes them: kv head h_kv of batch row b, the sequence's rows starting at
    k_start (packed sequences)."""
    k_offset = k_start.to(tl.int64)
    k_view = heads_view(K + k_offset * stride_ks, stride_kb, stride_kh, stride_ks, b, h_kv, 1,
                        len_k, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    v_view = heads_view(V + k_offset * stride_vs, stride_vb, stride_vh, stride_vs, b, h_kv, 1,
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
def load_rows(view, stride_h, stride_s, stride_d, head, row0, seqlen, HEAD_DIM: tl.constexpr,
              BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows [row0, row0 + BLOCK_ROWS) of a view's head; out-of-range elements read 0."""
    if USE_TMA:
        return view.load([head, row0, 0]).reshape(BLOCK_ROWS, BLOCK_D)
    else:
        ptrs, mask = _tile_offsets(view, stride_h, stride_s, stride_d, head, row0, seqlen,
                                   HEAD_DIM, BLOCK_ROWS, BLOCK_D)
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def store_rows(view, stride_h, stride_s, stride_d, head, row0, tile, seqlen,
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
def load_keys(view, stride_page, stride_s, stride_d, row0, seqlen, table_row, page_size,
              first_key, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
              BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr, PAGED: tl.constexpr):
    """Key (or value) rows [row0, row0 + BLOCK_ROWS) of a view; PAGED: row j is the
    sequence's cache entry first_key + j (its first key: cache_leftpad), in block
    table_row[(first_key + j) // page_size] (a block being stride_page apart), row
    (first_key + j) % page_size (without pages the view starts at the first key).
    Rows past seqlen read 0 (never a stale cache entry, which may hold NaN)."""
    if PAGED:
        rows = row0 + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        in_range = rows < seqlen
        entries = first_key + rows
        pages = tl.load(table_row + entries // page_size, mask=in_range, other=0).to(tl.int64)
        mask = in_range[:, None]
        if HEAD_DIM < BLOCK_D:
            mask = mask & (cols[None, :] < HEAD_DIM)
        ptrs = (view + pages[:, None] * stride_page
                + (entries % page_size).to(tl.int64)[:, None] * stride_s
                + cols[None, :] * stride_d)
        return tl.load(ptrs, mask=mask, other=0.0)
    else:
        return load_rows(view, 0, stride_s, stride_d, 0, row0, seqlen, HEAD_DIM, BLOCK_ROWS,
                         BLOCK_D, USE_TMA)


@triton.jit
def row_vector(T, b, h, heads, seqlen):
    """Batch b, head h of a contiguous (batch, heads, seqlen) fp32 tensor (lse, D, dLSE)."""
    return T + (b.to(tl.int64) * heads + h) * seqlen


@triton.jit
def load_lse2(lse_row, rows, seqlen):
    """A row block's lse in log2 units; rows that saw no key (lse = -inf) and rows past
    seqlen get +inf, so that their recomputed P = exp2(s - lse2) is exactly 0."""
    lse = tl.load(lse_row + rows, mask=rows < seqlen, other=float("-inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def tiles_of_program(tiles, PERSISTENT: tl.constexpr):
    """(first, end, step) of the loop over this program's tiles: every num_programs-th
    tile from its program id (PERSISTENT), else one (the loop folds away)."""
    if PERSISTENT:
        return tl.program_id(0), tiles, tl.num_programs(0)
    else:
        return 0, 1, 1


@triton.jit
def tile_index(tile, blocks, heads, PERSISTENT: tl.constexpr):
    """(block, head, batch) of a tile: numbered block-fastest over (blocks, heads, batch)
    (PERSISTENT), else the program's grid position."""
    if PERSISTENT:
        return tile % blocks, tile // blocks % heads, tile // (blocks * heads)
    else:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def packed_tile(tile, CuSeq, batch, rows_per_token, BLOCK_ROWS: tl.constexpr,
                BATCH_BLOCK: tl.constexpr):
    """(sequence, block) of tile number ``tile`` among the real row blocks of packed
    sequences, numbered sequence by sequence (sequence b's cdiv(rows_per_token * len_b,
    BLOCK_ROWS) blocks after those of the sequences before it; empty sequences have none;
    rows_per_token: 1, or a GQA group for the decode kernel's rows). A tile past the last
    gets the last sequence and a block past its end (a tile without rows). Each program
    walks cu_seqlens on the device (BATCH_BLOCK >= batch), so a grid needs only a bound
    on the count of tiles, cdiv(rows_per_token * rows, BLOCK_ROWS) + batch, never the
    lengths themselves."""
    seqs = tl.arange(0, BATCH_BLOCK)
    inside = seqs < batch
    starts = tl.load(CuSeq + seqs, mask=inside, other=0)
    ends = tl.load(CuSeq + seqs + 1, mask=inside, other=0)
    blocks = (rows_per_token * (ends - starts) + BLOCK_ROWS - 1) // BLOCK_ROWS
    ends_at = tl.cumsum(blocks, 0)  # one past each sequence's last tile
    b = tl.minimum(tl.sum((ends_at <= tile).to(tl.int32), 0), batch - 1)
    return b, tile - tl.sum(tl.where(seqs < b, blocks, 0), 0)


@triton.jit
def sequence(b, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, SeqUsedK, LeftPad, VARLEN: tl.constexpr,
             SEQUSED_K: tl.constexpr, LEFTPAD: tl.constexpr):
    """(first query row, query rows, first key row, keys) of sequence b. Queries: from
    cu_seqlens_q (VARLEN: packed sequences, rows of one (tokens, heads, head_dim)
    tensor), else the whole seqlen_q. Keys: a KV cache's entries LeftPad[b] ..
    SeqUsedK[b] - 1 (SEQUSED_K: its filled length; LEFTPAD: its first key, clamped into
    [0, SeqUsedK[b]]), else from cu_seqlens_k (VARLEN), else the whole seqlen_k.
    Positions count from the first key: with bottom-right alignment, dropping the keys
    before it leaves every diagonal, window and ALiBi distance as it was."""
    if VARLEN:
        q_start = tl.load(CuSeqQ + b)
        len_q = tl.load(CuSeqQ + b + 1) - q_start
    else:
        q_start = b * 0
        len_q = seqlen_q + b * 0
    if SEQUSED_K:
        k_end = tl.load(SeqUsedK + b)
        k_start = b * 0
        if LEFTPAD:
            k_start = tl.minimum(tl.maximum(tl.load(LeftPad + b), 0), k_end)
        len_k = k_end - k_start
    elif VARLEN:
        k_start = tl.load(CuSeqK + b)
        len_k = tl.load(CuSeqK + b + 1) - k_start
    else:
        k_start = b * 0
        len_k = seqlen_k + b * 0
    return q_start, len_q, k_start, len_k


@triton.jit
def sequence_tile(block, b, blocks, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, SeqUsedK, LeftPad,
                  BLOCK_ROWS: tl.constexpr, KEY_ROWS: tl.constexpr, LAST_FIRST: tl.constexpr,
                  VARLEN: tl.constexpr, SEQUSED_K: tl.constexpr, LEFTPAD: tl.constexpr):
    """Where tile ``block`` of sequence b lies, for every kernel's tile the same way:
    (q_start, len_q, k_start, len_k) of the sequence (see sequence), the tile's first
    row row0 -- a query row, or a key row (KEY_ROWS) -- whether the tile has rows in
    this sequence (``live``: packed sequences have their own number of blocks while the
    grid covers the longest, so a program past its sequence's rows does nothing), the
    batch index of its rows in q (packed sequences are row ranges of batch 0), and
    the causal diagonal len_k - len_q. LAST_FIRST: the blocks run last-first (causal
    query blocks get cheaper towards the top: longest first, fewer idle cores at the
    end)."""
    q_start, len_q, k_start, len_k = sequence(b, seqlen_q, seqlen_k, CuSeqQ, CuSeqK, SeqUsedK,
                                              LeftPad, VARLEN, SEQUSED_K, LEFTPAD)
    rows = len_k if KEY_ROWS else len_q
    if LAST_FIRST:
        if VARLEN:
            blocks = tl.cdiv(rows, BLOCK_ROWS)
        block = blocks - 1 - block
    row0 = block * BLOCK_ROWS
    live = (row0 >= 0) & (row0 < rows)
    tensor_b = b * 0 if VARLEN else b
    return q_start, len_q, k_start, len_k, row0, live, tensor_b, len_k - len_q


@triton.jit
def _block_ranges(start, full_start, full_end, end):
    """(lo, mid, hi, end) of the three loops over a tile's partner blocks: [lo, mid)
    crosses the window's far bound (masked), [mid, hi) is seen whole (no mask), [hi, end)
    crosses the near bound or the tail (masked). Clamped so the loops never overlap."""
    mid = tl.maximum(tl.minimum(full_start, end), start)
    return start, mid, tl.maximum(mid, full_end), end


@triton.jit
def key_block_range(m0, seqlen_k, diagonal, window_left, window_right,
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
def query_block_range(n0, seqlen_q, diagonal, window_left, window_right,
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
