"""The Hopper (sm90) forward, in Gluon: FlashAttention-3's structure for the plain path
(causal or not, GQA, head_dim 64 or 128, fp16/bf16). ``sm90.py`` decides when it runs;
everything else takes ``forward.py``.

One CTA owns a query tile of 2 x 64 rows and is split into warp-specialised partitions
that talk through mbarriers in shared memory:

* the **loader** (1 warp) issues TMA copies: Q of the tile, then K and V of every key
  block into a ring of ``STAGES`` slots, as far ahead as the ring allows (it waits for a
  slot's ``kv_free`` before refilling it), and the next tile's Q as soon as the
  consumers release this one's;
* two **consumers** (a warpgroup each, 64 query rows each) run the online softmax. Per
  key block j, in program order::

      issue S(j) = Q K(j)^T            (async wgmma)
      issue O += P(j-1) V(j-1)          (async wgmma, P from registers)
      wait S(j); softmax(S(j)) -> P(j), alpha(j)   <- overlaps the P.V above
      wait P.V; release slot j-1; O *= alpha(j)

  so the tensor cores run one consumer's products while the other (or the same one)
  does exponentials; both read the same K/V slot, which is free once both released it.

The grid is persistent (one CTA per SM, tiles dealt out in waves; causal deals odd
waves back to front so long and short tiles alternate) except for long causal problems,
where the hardware's dynamic CTA scheduling balances better (``sm90.persistent``).
Descriptors are built on the device over (batch, heads, seqlen, head_dim) with the
tensors' own strides, so a tile never reads another sequence's rows: TMA zero-fills
past seqlen, and the masked blocks (key tail, causal diagonal) set those scores to -inf.
Scores are in log2 units; whole blocks fold the scale into the exponent (one FMA per
score). Rows that see no key give out 0 and lse -inf (kernels/__init__.py).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from .hopper import bnsd_descriptor, warpgroup_accumulator

CONSUMERS = gl.constexpr(2)     # warpgroups computing, BLOCK_M (64) query rows each
LOADER_WARPS = gl.constexpr(1)
CONSUMER_REGISTERS = gl.constexpr(232)  # requested per thread of the second consumer
LOADER_REGISTERS = gl.constexpr(40)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _wave_tile(wave, SNAKE: gl.constexpr):
    """The tile this CTA takes in ``wave`` (the CTAs take consecutive tiles a wave).
    SNAKE deals odd waves back to front: a CTA that took a long causal tile takes a short
    one next (tiles run from the longest to the shortest within a head)."""
    pid = gl.program_id(0)
    ctas = gl.num_programs(0)
    if SNAKE:
        if wave % 2 == 1:
            pid = ctas - 1 - pid
    return wave * ctas + pid


@gluon.jit
def _tile_coords(tile, m_tiles, heads_q, TILE_M: gl.constexpr, CAUSAL: gl.constexpr):
    """(batch, head, first row) of ``tile``: head-major, so the tiles in flight share a
    head's K and V in L2; causal takes a head's tiles from the last (the longest) on."""
    bh = tile // m_tiles
    m = tile % m_tiles
    if CAUSAL:
        m = m_tiles - 1 - m
    return bh // heads_q, bh % heads_q, m * TILE_M


@gluon.jit
def _key_blocks(m0, seqlen_q, seqlen_k, TILE_M: gl.constexpr, BLOCK_N: gl.constexpr,
                CAUSAL: gl.constexpr):
    """Key blocks a tile starting at row m0 sees (causal: up to its last row's diagonal)."""
    if CAUSAL:
        hi = gl.minimum(seqlen_k, m0 + TILE_M + seqlen_k - seqlen_q)
    else:
        hi = seqlen_k
    return gl.cdiv(gl.maximum(hi, 0), BLOCK_N)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready,
            kv_free, n_tiles, m_tiles, heads_q, group, seqlen_q, seqlen_k,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            CAUSAL: gl.constexpr):
    TILE_M: gl.constexpr = CONSUMERS * BLOCK_M
    loaded = 0  # K/V blocks loaded so far: slot loaded % STAGES, phase (loaded // STAGES) & 1
    tiles_done = 0
    for wave in range(gl.cdiv(n_tiles, gl.num_programs(0))):
        tile = _wave_tile(wave, CAUSAL)
        if tile < n_tiles:
            b, h, m0 = _tile_coords(tile, m_tiles, heads_q, TILE_M, CAUSAL)
            for c in gl.static_range(CONSUMERS):
                mbarrier.wait(q_free.index(c), (tiles_done & 1) ^ 1)
                mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [b, h, m0 + c * BLOCK_M, 0],
                                                q_ready.index(c), q_smem.index(c))
            for j in range(_key_blocks(m0, seqlen_q, seqlen_k, TILE_M, BLOCK_N, CAUSAL)):
                slot = loaded % STAGES
                mbarrier.wait(kv_free.index(slot), ((loaded // STAGES) & 1) ^ 1)
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [b, h // group, j * BLOCK_N, 0],
                                                k_ready.index(slot), k_smem.index(slot))
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(v_desc, [b, h // group, j * BLOCK_N, 0],
                                                v_ready.index(slot), v_smem.index(slot))
                loaded += 1
            tiles_done += 1


@gluon.jit
def _softmax_block(s, col0, m_i, l_i, rows, row0, seqlen_k, diagonal, qk_scale,
                   s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """P of the key block at col0 (fp32, unnormalised), the new running max and sum (log2
    units), and alpha, the factor that rescales what came before."""
    edge = col0 + BLOCK_N > seqlen_k
    if CAUSAL:
        edge = edge | (col0 + BLOCK_N - 1 > row0 + diagonal)
    if edge:
        # Scale before masking, so that a hidden score is -inf; a row that has seen no
        # key yet subtracts 0 instead of -inf, so exp2 gives 0, not NaN.
        cols = col0 + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        visible = cols[None, :] < seqlen_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + diagonal)
        s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_sub[:, None])
    else:
        # Every score visible: max(qk_scale * S) = qk_scale * max(S) (qk_scale > 0,
        # sm90.eligible), and the scale folds into the exponent's FMA.
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s * qk_scale - m_sub[:, None])
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _consumer(c: gl.constexpr, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, kv_free,
              Out, Lse, stride_ob, stride_oh, stride_os, n_tiles, m_tiles, heads_q, seqlen_q,
              seqlen_k, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Rows [c * BLOCK_M, (c + 1) * BLOCK_M) of every tile this CTA takes."""
    TILE_M: gl.constexpr = CONSUMERS * BLOCK_M
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = warpgroup_accumulator(BLOCK_N)
    o_layout: gl.constexpr = warpgroup_accumulator(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    no_scores = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    diagonal = seqlen_k - seqlen_q
    used = 0  # K/V blocks consumed so far (the loader's count)
    tiles_done = 0
    for wave in range(gl.cdiv(n_tiles, gl.num_programs(0))):
        tile = _wave_tile(wave, CAUSAL)
        if tile < n_tiles:
            b, h, m0 = _tile_coords(tile, m_tiles, heads_q, TILE_M, CAUSAL)
            blocks = _key_blocks(m0, seqlen_q, seqlen_k, TILE_M, BLOCK_N, CAUSAL)
            row0 = m0 + c * BLOCK_M
            rows = row0 + gl.arange(0, BLOCK_M, row_layout)
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
            l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_layout)
            acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
            mbarrier.wait(q_ready.index(c), tiles_done & 1)
            q = q_smem.index(c).reshape([BLOCK_M, HEAD_DIM])
            if blocks > 0:
                # Prologue: S(0) and its softmax.
                slot = used % STAGES
                mbarrier.wait(k_ready.index(slot), (used // STAGES) & 1)
                k_t = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                s = warpgroup_mma(q, k_t, no_scores, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                p, m_i, l_i, alpha = _softmax_block(s, 0, m_i, l_i, rows, row0, seqlen_k,
                                                    diagonal, qk_scale, s_layout, BLOCK_N, CAUSAL)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                # Steady state: S(j) and P(j-1).V(j-1) in flight together.
                for j in range(1, blocks):
                    prev = slot
                    prev_phase = ((used + j - 1) // STAGES) & 1
                    slot = (used + j) % STAGES
                    mbarrier.wait(k_ready.index(slot), ((used + j) // STAGES) & 1)
                    k_t = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                    s = warpgroup_mma(q, k_t, no_scores, use_acc=False, is_async=True)
                    mbarrier.wait(v_ready.index(prev), prev_phase)
                    acc = warpgroup_mma(p_op, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]),
                                        acc, is_async=True)
                    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
                    p, m_i, l_i, alpha = _softmax_block(s, j * BLOCK_N, m_i, l_i, rows, row0,
                                                        seqlen_k, diagonal, qk_scale, s_layout,
                                                        BLOCK_N, CAUSAL)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(kv_free.index(prev), count=1)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                mbarrier.arrive(q_free.index(c), count=1)  # the tile's last S has read Q
                # Epilogue of the loop: the last P.V.
                mbarrier.wait(v_ready.index(slot), ((used + blocks - 1) // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]), acc,
                                    is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(kv_free.index(slot), count=1)
            else:
                mbarrier.arrive(q_free.index(c), count=1)
            used += blocks
            tiles_done += 1
            # out = acc / l, lse = (m + log2 l) ln 2; rows that saw no key: 0 and -inf.
            seen = l_i > 0.0
            l_safe = gl.where(seen, l_i, 1.0)
            out = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
            out_rows = row0 + gl.arange(0, BLOCK_M, gl.SliceLayout(1, o_layout))
            out_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
            base = Out + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
            gl.store(base + out_rows[:, None].to(gl.int64) * stride_os + out_cols[None, :],
                     out.to(dtype), mask=out_rows[:, None] < seqlen_q)
            lse = gl.where(seen, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
            gl.store(Lse + (b * heads_q + h).to(gl.int64) * seqlen_q + rows, lse,
                     mask=rows < seqlen_q)


@gluon.jit
def attn_fwd_sm90(Q, K, V, Out, Lse, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh,
                  stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
                  batch, heads_q, heads_kv, seqlen_q, seqlen_k, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """out and lse of (batch, heads_q, seqlen_q) query rows; q/k/v/out strides in
    elements, (batch, head, row) each (head_dim is unit-stride); lse contiguous."""
    dtype: gl.constexpr = Q.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_N, HEAD_DIM],
                                                                  dtype)
    q_desc = bnsd_descriptor(Q, batch, heads_q, seqlen_q, stride_qb, stride_qh, stride_qs,
                             BLOCK_M, HEAD_DIM, q_layout)
    k_desc = bnsd_descriptor(K, batch, heads_kv, seqlen_k, stride_kb, stride_kh, stride_ks,
                             BLOCK_N, HEAD_DIM, kv_layout)
    v_desc = bnsd_descriptor(V, batch, heads_kv, seqlen_k, stride_vb, stride_vh, stride_vs,
                             BLOCK_N, HEAD_DIM, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_free.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_free.index(i), count=CONSUMERS)  # both consumers read a slot
    fence_async_shared()
    m_tiles = gl.cdiv(seqlen_q, CONSUMERS * BLOCK_M)
    n_tiles = batch * heads_q * m_tiles
    gl.warp_specialize([
        (_consumer, (0, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, kv_free, Out,
                     Lse, stride_ob, stride_oh, stride_os, n_tiles, m_tiles, heads_q, seqlen_q,
                     seqlen_k, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        (_consumer, (1, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, kv_free, Out,
                     Lse, stride_ob, stride_oh, stride_os, n_tiles, m_tiles, heads_q, seqlen_q,
                     seqlen_k, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_free, k_ready,
                   v_ready, kv_free, n_tiles, m_tiles, heads_q, heads_q // heads_kv, seqlen_q,
                   seqlen_k, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
    ], [4, LOADER_WARPS], [CONSUMER_REGISTERS, LOADER_REGISTERS])
