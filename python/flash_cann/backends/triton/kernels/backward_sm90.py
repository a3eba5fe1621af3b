"""The Hopper (sm90) backward, in Gluon: FlashAttention-3's structure for the plain path
(causal or not, GQA, head_dim 64 or 128, fp16/bf16). ``sm90.py`` decides when it runs;
everything else takes ``backward.py``.

One CTA owns a key block of 2 x 64 keys of one kv head and walks the query blocks that
see it (of every query head of the group), split into warp-specialised partitions:

* the **loader** (1 warp) issues TMA copies: K and V of the key block once, then Q and
  dO of every query block into a ring of ``STAGES`` slots, as far ahead as it allows,
  with the block's lse and D beside them (cp.async: their rows need no alignment);
* two **consumers** (a warpgroup each) own 64 keys each and keep their dK and dV in
  registers for the whole walk. Per query block, in program order::

      issue Sᵀ = K Qᵀ, dPᵀ = V dOᵀ      (async wgmma, keys x queries)
      wait Sᵀ; Pᵀ = exp2(Sᵀ - lse)       <- overlaps dPᵀ
      issue dV += Pᵀ dO                   (P from registers)
      wait dPᵀ; dSᵀ = Pᵀ (dPᵀ - D)       <- overlaps dV
      store dSᵀ to shared memory; both consumers' halves in, then
      issue dQ[:, half] = dS K[:, half]   (each consumer half of head_dim, all 128 keys)
      issue dK += dSᵀ Q                   (dS from registers)
      wait for dQ; dQ to a shared tile for the writer; wait for dK; release the slot

  The keys x queries orientation lets Pᵀ and dSᵀ feed dV and dK straight from
  registers; only dS goes through shared memory, once, for dQ;
* the **dQ writer** (1 warp) adds each block's two dQ tiles into ``DQAccum`` (fp32,
  zeroed by the caller) by TMA reduce-adds, in flight while the consumers go on; a
  tile goes back to its consumer ``DQ_BUFFERS`` blocks on, once its add has read it.

The adds of different key blocks reach L2 in any order, so dQ's last bits vary from
run to run. ``DETERMINISTIC`` fixes the order, as FlashAttention-3 does: a query
block's dQ takes the key blocks' adds in key-block order, through a turn counter per
(batch, head, query block) in ``DQTurns`` (int32, zeroed by the caller). The writer
waits for its key block's turn before a block's adds and passes the turn on once they
are written, after issuing the next block's, so the consumers never wait on the chain
unless it falls two blocks behind. Key block n only ever waits for key block n - 1 of
its own head, launched before it, so the chain cannot deadlock; its cost is the ramp
(key block n's first add comes n blocks late), which sm90.backward_grid shortens by
running heads fastest.

The caller scales and casts dQ_accum into dQ. Scores are in log2 units; rows past
seqlen_q read Q = dO = 0 (TMA zero fill) with lse = +inf, so their P and dS are exactly
0, as are those of rows that saw no key (lse -inf in the forward's contract).
"""

from __future__ import annotations

from triton._C.libtriton import gluon_ir, ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from .hopper import bnsd_descriptor, warpgroup_accumulator

if not hasattr(gluon_ir.GluonOpBuilder, "create_async_tma_reduce"):
    raise ImportError("this Triton's Gluon builds no TMA reduce-add")  # sm90.py falls back

CONSUMERS = gl.constexpr(2)     # warpgroups computing, KEYS (64) keys each
KEYS = gl.constexpr(64)
CONSUMER_REGISTERS = gl.constexpr(240)
WORKER_REGISTERS = gl.constexpr(24)   # the loader's and the dQ writer's (a warp each)
LOG2E = gl.constexpr(1.4426950408889634)


@builtin
def _reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA reduce-add of shared ``src`` into the descriptor's block at ``coord``
    (cp.reduce.async.bulk.tensor; Gluon 3.6 builds it but does not name it); completed
    by tma.store_wait, like a TMA store."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                              coord, src.handle)


@gluon.jit
def _turn(DQTurns, b, h, m0, heads_q, seqlen_q, BLOCK_M: gl.constexpr):
    """The turn counter of query block m0 of head h."""
    return DQTurns + (b * heads_q + h).to(gl.int64) * gl.cdiv(seqlen_q, BLOCK_M) + m0 // BLOCK_M


@gluon.jit
def _wait_turn(turn, key_block):
    """Until ``*turn == key_block``: the warp polls with acquire loads at GPU scope, then
    orders the async proxy (the TMA reduce-adds that follow) after what it saw."""
    gl.inline_asm_elementwise(
        "{ .reg .pred waiting; .reg .b32 seen;\n"
        "poll_${:uid}: ld.acquire.gpu.global.b32 seen, [$1];\n"
        "setp.ne.s32 waiting, seen, $2;\n"
        "@waiting bra poll_${:uid};\n"
        "fence.proxy.async.global; mov.b32 $0, seen; }",
        "=r,l,r", [turn, key_block], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pass_turn(turn, PENDING: gl.constexpr):
    """Once every reduce-add issued but the newest ``PENDING`` (0 or CONSUMERS) is
    written to global memory -- not only read from shared memory, which is all
    tma.store_wait waits for -- the next key block's turn: the issuing thread's writes
    made visible to the generic proxy, the warp synchronised, one release increment."""
    gl.static_assert((PENDING == 0) or (PENDING == CONSUMERS), "a block's adds, or none")
    if PENDING == 0:
        gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\n"
                                  "fence.proxy.async.global; mov.b32 $0, 0;",
                                  "=r,l", [turn], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("cp.async.bulk.wait_group 2;\n"
                                  "fence.proxy.async.global; mov.b32 $0, 0;",
                                  "=r,l", [turn], dtype=gl.int32, is_pure=False, pack=1)
    gl.thread_barrier()
    gl.atomic_add(turn, 1, sem="release", scope="gpu")


@gluon.jit
def _query_blocks(n0, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """(first, count) of the query blocks that see a key of the block starting at n0
    (causal: from the first row whose diagonal reaches n0). Every partition walks them
    for each query head of the group in turn (_walk_step)."""
    first = 0
    if CAUSAL:
        first = gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // BLOCK_M
    return first, gl.maximum(gl.cdiv(seqlen_q, BLOCK_M) - first, 0)


@gluon.jit
def _walk_step(i, first, blocks, h_kv, group, BLOCK_M: gl.constexpr):
    """(query head, first row) of step i of the walk."""
    g = i // blocks
    return h_kv * group + g, (first + i - g * blocks) * BLOCK_M


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, stats_smem,
            kv_ready, qdo_ready, qdo_free, stats_ready, Lse, Delta, b, h_kv, n0, group, heads_q,
            seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
            CAUSAL: gl.constexpr):
    stats_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, h_kv, n0, 0], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b, h_kv, n0, 0], kv_ready, v_smem)
    first, blocks = _query_blocks(n0, seqlen_q, seqlen_k, BLOCK_M, CAUSAL)
    for i in range(group * blocks):
        h, m0 = _walk_step(i, first, blocks, h_kv, group, BLOCK_M)
        slot = i % STAGES
        mbarrier.wait(qdo_free.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(qdo_ready.index(slot),
                        q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, m0, 0], qdo_ready.index(slot),
                                        q_smem.index(slot))
        tma.async_copy_global_to_shared(do_desc, [b, h, m0, 0], qdo_ready.index(slot),
                                        do_smem.index(slot))
        # The block's lse and D (rows past seqlen_q: 0, which the consumers replace),
        # by cp.async: their rows need not be 16-byte aligned, as TMA's would.
        rows = m0 + gl.arange(0, BLOCK_M, stats_layout)
        row_vector = (b * heads_q + h).to(gl.int64) * seqlen_q + rows
        async_copy.async_copy_global_to_shared(stats_smem.index(2 * slot), Lse + row_vector,
                                               mask=rows < seqlen_q)
        async_copy.async_copy_global_to_shared(stats_smem.index(2 * slot + 1),
                                               Delta + row_vector, mask=rows < seqlen_q)
        async_copy.mbarrier_arrive(stats_ready.index(slot))
        mbarrier.arrive(stats_ready.index(slot), count=1)


@gluon.jit
def _dq_writer(dq_desc, dq_smem, dq_ready, dq_free, DQTurns, b, h_kv, n0, group, heads_q,
               seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
               DQ_BUFFERS: gl.constexpr, DETERMINISTIC: gl.constexpr):
    """DQAccum += each query block's dQ share, both consumers' halves, by TMA reduce-adds
    (rows past seqlen_q fall outside the descriptor), in flight while the consumers
    compute; a block's shared tiles go back to them once the next block's adds are
    issued and theirs have been read (DETERMINISTIC: written, then the turn passed)."""
    HALF_D: gl.constexpr = dq_desc.block_type.shape[3]
    first, blocks = _query_blocks(n0, seqlen_q, seqlen_k, BLOCK_M, CAUSAL)
    previous_turn = DQTurns  # DETERMINISTIC: the turn to pass on once its block's adds land
    for i in range(group * blocks):
        h, m0 = _walk_step(i, first, blocks, h_kv, group, BLOCK_M)
        buf = i % DQ_BUFFERS
        mbarrier.wait(dq_ready.index(buf), (i // DQ_BUFFERS) & 1)
        if DETERMINISTIC:
            turn = _turn(DQTurns, b, h, m0, heads_q, seqlen_q, BLOCK_M)
            _wait_turn(turn, n0 // (CONSUMERS * KEYS))
        for c in gl.static_range(CONSUMERS):
            _reduce_add(dq_desc, [b, h, m0, c * HALF_D], dq_smem.index(c * DQ_BUFFERS + buf))
        if i > 0:  # the previous block's adds have read their tiles
            if DETERMINISTIC:
                _pass_turn(previous_turn, CONSUMERS)
            else:
                tma.store_wait(CONSUMERS)
            mbarrier.arrive(dq_free.index((i - 1) % DQ_BUFFERS), count=1)
        if DETERMINISTIC:
            previous_turn = turn
    if DETERMINISTIC:
        if group * blocks > 0:
            _pass_turn(previous_turn, 0)
    tma.store_wait(0)


@gluon.jit
def _consumer(c: gl.constexpr, q_smem, k_smem, v_smem, do_smem, ds_smem, dq_smem, stats_smem,
              kv_ready, qdo_ready, qdo_free, stats_ready, ds_ready, ds_free, dq_ready, dq_free,
              DK, DV, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
              b, h_kv, n0, group, seqlen_q, seqlen_k, scale, qk_scale, HEAD_DIM: gl.constexpr,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              DQ_BUFFERS: gl.constexpr):
    """dK and dV of keys [n0 + c * KEYS, n0 + (c + 1) * KEYS), and columns [c * HEAD_DIM / 2,
    (c + 1) * HEAD_DIM / 2) of every query block's dQ share."""
    dtype: gl.constexpr = q_smem.dtype
    HALF_D: gl.constexpr = HEAD_DIM // CONSUMERS
    s_layout: gl.constexpr = warpgroup_accumulator(BLOCK_M)
    kv_layout: gl.constexpr = warpgroup_accumulator(HEAD_DIM)
    dq_layout: gl.constexpr = warpgroup_accumulator(HALF_D)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    no_scores = gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout)
    no_dq = gl.zeros([BLOCK_M, HALF_D], gl.float32, dq_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    diagonal = seqlen_k - seqlen_q
    keys = n0 + c * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, s_layout))
    k_all = k_smem.reshape([CONSUMERS * KEYS, HEAD_DIM])
    k_mine = k_all.slice(c * KEYS, KEYS)
    v_mine = v_smem.reshape([CONSUMERS * KEYS, HEAD_DIM]).slice(c * KEYS, KEYS)
    k_half = k_all.slice(c * HALF_D, HALF_D, dim=1)
    first, blocks = _query_blocks(n0, seqlen_q, seqlen_k, BLOCK_M, CAUSAL)
    mbarrier.wait(kv_ready, 0)
    for i in range(group * blocks):
        h, m0 = _walk_step(i, first, blocks, h_kv, group, BLOCK_M)
        slot = i % STAGES
        mbarrier.wait(qdo_ready.index(slot), (i // STAGES) & 1)
        q = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        s_t = warpgroup_mma(k_mine, q.permute((1, 0)), no_scores, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_mine, do.permute((1, 0)), no_scores, use_acc=False,
                             is_async=True)
        # lse (log2 units; +inf where P must be 0) and D of the block's rows, along the
        # columns, read from the loader's copies only where they are used: each is 16
        # registers a thread in this orientation.
        mbarrier.wait(stats_ready.index(slot), (i // STAGES) & 1)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=(s_t,))
        lse = stats_smem.index(2 * slot).load(col_layout)
        if m0 + BLOCK_M > seqlen_q:  # the last block: its rows past seqlen_q see no key
            lse = gl.where(m0 + gl.arange(0, BLOCK_M, col_layout) < seqlen_q, lse,
                           float("-inf"))
        p_t = gl.exp2(s_t * qk_scale - gl.where(lse == float("-inf"), float("inf"),
                                                 lse * LOG2E)[None, :])
        if CAUSAL:
            if n0 + CONSUMERS * KEYS - 1 > m0 + diagonal:  # the block crosses the diagonal
                rows = m0 + gl.arange(0, BLOCK_M, col_layout)
                p_t = gl.where(keys[:, None] <= rows[None, :] + diagonal, p_t, 0.0)
        p_op = gl.convert_layout(p_t.to(dtype), op_layout)
        dv = warpgroup_mma(p_op, do, dv, is_async=True)
        dp_t = warpgroup_mma_wait(num_outstanding=1, deps=(dp_t,))
        delta = stats_smem.index(2 * slot + 1).load(col_layout)
        ds_t = p_t * (dp_t - delta[None, :])
        ds_op = gl.convert_layout(ds_t.to(dtype), op_layout)
        # dS through shared memory, both consumers' key halves, for dQ = dS K.
        buf = i % 2
        mbarrier.wait(ds_free.index(buf), ((i // 2) & 1) ^ 1)
        ds_smem.index(buf).slice(c * KEYS, KEYS).store(ds_t.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(buf), count=1)
        mbarrier.wait(ds_ready.index(buf), (i // 2) & 1)
        dq = warpgroup_mma(ds_smem.index(buf).permute((1, 0)), k_half, no_dq, use_acc=False,
                           is_async=True)
        dk = warpgroup_mma(ds_op, q, dk, is_async=True)
        dq, dv = warpgroup_mma_wait(num_outstanding=1, deps=(dq, dv))  # dK may still run
        mbarrier.arrive(ds_free.index(buf), count=1)
        # dQ to shared memory for the writer's reduce-add; a tile is refilled DQ_BUFFERS
        # blocks on, once that add has read it.
        dq_slot = i % DQ_BUFFERS
        mbarrier.wait(dq_free.index(dq_slot), ((i // DQ_BUFFERS) & 1) ^ 1)
        dq_smem.index(c * DQ_BUFFERS + dq_slot).reshape([BLOCK_M, HALF_D]).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(dq_ready.index(dq_slot), count=1)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
        mbarrier.arrive(qdo_free.index(slot), count=1)
    # dK = scale * dSᵀ Q, dV = Pᵀ dO, summed over the group; rows past seqlen_k dropped.
    out_keys = n0 + c * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, kv_layout))
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, kv_layout))
    keep = out_keys[:, None] < seqlen_k
    dk_base = DK + b.to(gl.int64) * stride_dkb + h_kv.to(gl.int64) * stride_dkh
    gl.store(dk_base + out_keys[:, None].to(gl.int64) * stride_dks + cols[None, :],
             (dk * scale).to(dtype), mask=keep)
    dv_base = DV + b.to(gl.int64) * stride_dvb + h_kv.to(gl.int64) * stride_dvh
    gl.store(dv_base + out_keys[:, None].to(gl.int64) * stride_dvs + cols[None, :],
             dv.to(dtype), mask=keep)


@gluon.jit
def attn_bwd_sm90(Q, K, V, DOut, Lse, Delta, DQAccum, DQTurns, DK, DV, stride_qb, stride_qh,
                  stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_dob,
                  stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                  stride_dvh, stride_dvs, batch, heads_q, heads_kv, seqlen_q, seqlen_k, scale,
                  qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, DQ_BUFFERS: gl.constexpr,
                  DETERMINISTIC: gl.constexpr):
    """Grid (key blocks of 128, heads_kv, batch), or (heads_kv, batch, key blocks) if
    DETERMINISTIC. q/k/v/dO/dK/dV strides in elements,
    (batch, head, row) each (head_dim is unit-stride); Lse, Delta (batch, heads_q,
    seqlen_q) and DQAccum (batch, heads_q, seqlen_q, head_dim) contiguous fp32; DQTurns
    (batch, heads_q, query blocks of BLOCK_M, CONSUMERS) int32 zeros if DETERMINISTIC,
    else None."""
    dtype: gl.constexpr = Q.dtype.element_ty
    BLOCK_N: gl.constexpr = CONSUMERS * KEYS
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_N, HEAD_DIM],
                                                                  dtype)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    HALF_D: gl.constexpr = HEAD_DIM // CONSUMERS
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_M, HALF_D],
                                                                  gl.float32)
    q_desc = bnsd_descriptor(Q, batch, heads_q, seqlen_q, stride_qb, stride_qh, stride_qs,
                             BLOCK_M, HEAD_DIM, q_layout)
    do_desc = bnsd_descriptor(DOut, batch, heads_q, seqlen_q, stride_dob, stride_doh,
                              stride_dos, BLOCK_M, HEAD_DIM, q_layout)
    k_desc = bnsd_descriptor(K, batch, heads_kv, seqlen_k, stride_kb, stride_kh, stride_ks,
                             BLOCK_N, HEAD_DIM, kv_layout)
    v_desc = bnsd_descriptor(V, batch, heads_kv, seqlen_k, stride_vb, stride_vh, stride_vs,
                             BLOCK_N, HEAD_DIM, kv_layout)
    # DQAccum in blocks of one consumer's half of head_dim.
    dq_desc = tma.make_tensor_descriptor(DQAccum, [batch, heads_q, seqlen_q, HEAD_DIM],
                                         [heads_q * seqlen_q * HEAD_DIM, seqlen_q * HEAD_DIM,
                                          HEAD_DIM, 1], [1, 1, BLOCK_M, HALF_D], dq_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [CONSUMERS * DQ_BUFFERS, 1, 1, BLOCK_M, HALF_D],
                                        dq_layout)
    stats_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M],
                                           gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    stats_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_ready = gl.allocate_shared_memory(gl.int64, [DQ_BUFFERS, 1], mbarrier.MBarrierLayout())
    dq_free = gl.allocate_shared_memory(gl.int64, [DQ_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(i), count=1)
        mbarrier.init(qdo_free.index(i), count=CONSUMERS)
        mbarrier.init(stats_ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=CONSUMERS)
        mbarrier.init(ds_free.index(i), count=CONSUMERS)
    for i in gl.static_range(DQ_BUFFERS):
        mbarrier.init(dq_ready.index(i), count=CONSUMERS)
        mbarrier.init(dq_free.index(i), count=1)
    fence_async_shared()
    if DETERMINISTIC:  # heads fastest: sm90.backward_grid
        n0 = gl.program_id(2) * BLOCK_N
        h_kv = gl.program_id(0)
        b = gl.program_id(1)
    else:
        n0 = gl.program_id(0) * BLOCK_N
        h_kv = gl.program_id(1)
        b = gl.program_id(2)
    group = heads_q // heads_kv
    gl.warp_specialize([
        (_consumer, (0, q_smem, k_smem, v_smem, do_smem, ds_smem, dq_smem, stats_smem,
                     kv_ready, qdo_ready, qdo_free, stats_ready, ds_ready, ds_free, dq_ready,
                     dq_free, DK, DV, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                     stride_dvh, stride_dvs, b, h_kv, n0, group, seqlen_q, seqlen_k, scale,
                     qk_scale, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, DQ_BUFFERS)),
        (_consumer, (1, q_smem, k_smem, v_smem, do_smem, ds_smem, dq_smem, stats_smem,
                     kv_ready, qdo_ready, qdo_free, stats_ready, ds_ready, ds_free, dq_ready,
                     dq_free, DK, DV, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                     stride_dvh, stride_dvs, b, h_kv, n0, group, seqlen_q, seqlen_k, scale,
                     qk_scale, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, DQ_BUFFERS)),
        (_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, stats_smem,
                   kv_ready, qdo_ready, qdo_free, stats_ready, Lse, Delta, b, h_kv, n0, group,
                   heads_q, seqlen_q, seqlen_k, BLOCK_M, STAGES, CAUSAL)),
        (_dq_writer, (dq_desc, dq_smem, dq_ready, dq_free, DQTurns, b, h_kv, n0, group, heads_q,
                      seqlen_q, seqlen_k, BLOCK_M, CAUSAL, DQ_BUFFERS, DETERMINISTIC)),
    ], [4, 1, 1], [CONSUMER_REGISTERS, WORKER_REGISTERS, WORKER_REGISTERS])
