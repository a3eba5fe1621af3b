"""CUDA backend: FlashAttention-2 as Triton kernels (``kernels/``).

This module is the host side: it picks a tile configuration per kernel (autotuned per
head_dim, causal, mask and seqlen bucket, results cached in memory and on disk),
chooses between tensor-descriptor (TMA) and pointer loads, allocates the outputs and
launches. The algorithm is FA2's:

forward, one program per query block:  online softmax over key blocks in fp32, out, lse
backward:  preprocess  D = rowsum(dO ∘ O) - dLSE
           dK, dV      one program per key block (and kv head: a GQA group's query
                       heads are summed inside the program)
           dQ          one program per query block
Every output element has exactly one writer, so the backward is deterministic and
needs no atomics; the price is recomputing S and dP in both kernels (7 matmuls per
tile pair instead of 5).

Outputs are contiguous in the input's layout; inputs are read through their strides.
A plain call (no features) is also planned: its launches are recorded and later calls of
its signature replay them (``forward_planned`` / ``backward_planned``, triton_launch.py).
``FLASH_CANN_TRITON_TMA``: ``auto`` (default; descriptors on sm90+), ``1`` (wherever
the strides allow, including the interpreter), ``0`` (never).

On sm90 a plain forward, and a plain backward of at least 2048 keys, take the Hopper
kernels instead (``sm90.py``, ``kernels/forward_sm90.py``,
``kernels/backward_sm90.py``: FlashAttention-3's warp-specialised TMA/wgmma pipelines, in
Gluon); ``FLASH_CANN_SM90=0`` keeps the FA2 kernels there too.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
from typing import Iterator

import torch
import triton

from ...contract import layout as layouts
from ...contract import ops
from ...contract.checks import MAX_NUM_SPLITS
from ...contract.variant import PLAIN, Variant
from . import kernels, sm90
from .arguments import cache_call, feature_arguments, packed_views, sink_arguments
from .buffers import empty
from .descriptors import tma_compatible
from .launch import Launch, current_stream, launch_and_record

# Tune only calls with at least this many scores (batch * heads * seqlen_q * seqlen_k,
# ~0.1 ms on an H100): below it a search costs more than it can save, and the
# default tile serves.
TUNE_MIN_SCORES = 2**27
# The decode kernel's work is reading the cache, not MMAs: tune calls that read at least
# this many bytes of K and V (~0.1 ms at an H100's 3 TB/s), as TUNE_MIN_SCORES does.
TUNE_MIN_CACHE_BYTES = 2**28
# Split-KV (kernels/decode.py): split when the (sequence, kv head, row block) programs
# fill fewer than this share of the GPU's program slots, into at most MAX_NUM_SPLITS
# key ranges of at least SPLIT_MIN_KEYS keys each (flash-attn 2's num_splits_heuristic,
# which counts two program slots per SM, 0.8 and 128).
SPLIT_FILL = 0.8
SLOTS_PER_SM = 2
SPLIT_MIN_KEYS = 128
# The interpreter (CPU tensors) has no SMs: a few, so that the heuristic splits the
# tests' small problems as a GPU splits long contexts.
INTERPRETER_SMS = 4
# Rows of a combine program: at most this many elements (BLOCK_R x BLOCK_D fp32 per split:
# 8 values a thread at 4 warps), fewer where that leaves SMs idle (a batch-1 long context
# has a few dozen rows: one row a program spreads its splits' reads over the GPU).
COMBINE_ELEMENTS = 1024
# The packed forward's programs walk cu_seqlens as one vector (kernels.tiles.packed_tile):
# up to this many sequences (4 int32 a thread at 8 warps); more take the max_seqlen grid.
PACKED_TILES_MAX_BATCH = 1024
# The autotuner's seqlen key is the next power of two, capped: past 16k every tile is
# deep in its steady state, and a search at 128k would run each candidate for seconds.
SEQLEN_BUCKET_CAP = 16384
# Elements per preprocess tile (two fp32 tiles in 4 warps: 64 registers a thread each).
PREPROCESS_TILE = 8192
# Per-thread budget of fp32 accumulator and score-tile values in registers (of 255):
# the rest holds operands, indices and pipelining state. Calibrated on sm_90 builds
# (ptxas) and H200 timings: at 160 every candidate compiled without spills, but the
# fastest dK/dV tile (64 queries x 128 keys, 8 warps: 192) was left out; at 192 a few
# 3-stage candidates spill some bytes and the autotuner weighs them like the rest
# (NOTES.md, step 6).
REGISTER_BUDGET = 192
# Shared memory a config may plan for: what one block may have (227 KiB on an H100)
# less a margin for barriers and layout conversions (the _smem_* estimates match
# sm_90 builds to within 2 KiB).
SHARED_MEMORY_MARGIN = 8 * 1024
SHARED_MEMORY_BUDGET = 227 * 1024 - SHARED_MEMORY_MARGIN  # the interpreter's (CPU) budget
# For a GPU where no candidate fits (head_dim 256 in 99 KiB): slow, but it runs.
FALLBACK_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)
BYTES_PER_ELEMENT = 2  # fp16 / bf16
ROWS_PER_WARPGROUP = 64  # rows of one Hopper wgmma: 4 warps per 64 rows of the stationary tile
# A block's 64K registers give each of 256 threads its 255; more threads get fewer.
MAX_WARPS = 8


def available() -> bool:
    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------
# Tile configurations
# ---------------------------------------------------------------------------------------

def _warps(stationary_rows: int) -> int:
    """4 warps (one warpgroup) per 64 rows of the stationary tile."""
    return 4 * max(1, stationary_rows // ROWS_PER_WARPGROUP)


def _registers_fwd(m: int, n: int, block_d: int) -> int:
    """fp32 values live across the loop: the output accumulator and the score tile."""
    return m * block_d + m * n


def _registers_dq(m: int, n: int, block_d: int) -> int:
    """The dQ accumulator and the S/P and dP/dS tiles."""
    return m * block_d + 2 * m * n


def _registers_dkdv(m: int, n: int, block_d: int) -> int:
    """The dK and dV accumulators and the Pᵀ and dSᵀ tiles."""
    return 2 * n * block_d + 2 * n * m


def _smem_fwd(m: int, n: int, block_d: int, stages: int) -> int:
    """Q, plus K and V in every pipeline stage."""
    return BYTES_PER_ELEMENT * block_d * (m + 2 * n * stages)


def _smem_dq(m: int, n: int, block_d: int, stages: int) -> int:
    """Q and dO, plus K and V in every pipeline stage."""
    return BYTES_PER_ELEMENT * block_d * (2 * m + 2 * n * stages)


def _smem_dkdv(m: int, n: int, block_d: int, stages: int) -> int:
    """K and V, plus Q and dO in every pipeline stage."""
    return BYTES_PER_ELEMENT * block_d * (2 * n + 2 * m * stages)


STAGES = (2, 3)
# (BLOCK_M, BLOCK_N) candidates. Query-stationary kernels (forward, dQ) hold BLOCK_M
# query rows and stream key blocks; the dK/dV kernel holds BLOCK_N key rows and
# streams query blocks.
FWD_TILES = ((64, 64), (128, 64), (128, 128))
DQ_TILES = ((64, 32), (64, 64), (128, 64))
DKDV_TILES = ((32, 64), (64, 64), (32, 128), (64, 128))
# The decode kernel's rows are a kv head's group x seqlen_q (4 for 32/8 heads, one
# token): 16-row tiles (the smallest tl.dot takes) waste no MMA rows and leave room for
# deeper K/V pipelines; the forward's tiles serve long query chunks.
DECODE_TILES = ((16, 64), (16, 128), *FWD_TILES)

# What a tuned config is kept for: the sequence-length buckets and every constexpr flag
# that changes the kernel (the decode kernel has fewer of them).
_AUTOTUNE_KEY = ["seqlen_q_bucket", "seqlen_k_bucket", "HEAD_DIM", "CAUSAL", "HAS_MASK",
                 "USE_TMA", "LEFT_BOUNDED", "SOFTCAP", "ALIBI", "DROPOUT", "VARLEN", "SEQUSED_K",
                 "PAGED", "BATCH_IDX", "PACKED_TILES"]
_DECODE_AUTOTUNE_KEY = ["seqlen_q_bucket", "seqlen_k_bucket", "HEAD_DIM", "CAUSAL",
                        "LEFT_BOUNDED", "SOFTCAP", "ALIBI", "PAGED", "BATCH_IDX", "splits",
                        "PACKED_TILES"]


class _Kernel:
    """A jit kernel with its candidate configs, the keep() filter that fits them to a
    BLOCK_D, and the default config for problems too small to tune.

    Candidates: every tile x pipeline depth, with one warpgroup per 64 stationary rows
    or twice that (which halves the registers each thread holds). keep() takes a
    config whose fp32 tiles fit REGISTER_BUDGET per thread and whose buffers fit
    SHARED_MEMORY_BUDGET, and doubles the warps only where the single count would not
    fit."""

    def __init__(self, name, fn, tiles, query_stationary: bool, registers, smem,
                 key=_AUTOTUNE_KEY, tune_min: int = TUNE_MIN_SCORES):
        self.name = name
        self.tune_min = tune_min  # the least work (launch's ``work``) worth a search
        self.fn = fn
        self.query_stationary = query_stationary
        self.registers = registers
        self.smem = smem
        self.configs = [
            triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_stages=stages,
                          num_warps=_warps(m if query_stationary else n) * factor)
            for (m, n), stages, factor in itertools.product(tiles, STAGES, (1, 2))]
        self.tuned = triton.autotune(
            configs=self.configs, key=key, cache_results=True,
            prune_configs_by={"early_config_prune": self._prune})(fn)

    def keep(self, config: triton.Config, block_d: int, smem_budget: int) -> bool:
        m, n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
        base_warps = _warps(m if self.query_stationary else n)
        per_thread = self.registers(m, n, block_d) / (32 * config.num_warps)
        base_fits = self.registers(m, n, block_d) / (32 * base_warps) <= REGISTER_BUDGET
        return (per_thread <= REGISTER_BUDGET and config.num_warps <= MAX_WARPS
                and (config.num_warps == base_warps or not base_fits)
                and self.smem(m, n, block_d, config.num_stages) <= smem_budget)

    def candidates(self, block_d: int,
                   smem_budget: int = SHARED_MEMORY_BUDGET) -> list[triton.Config]:
        """The configs the autotuner tries for this BLOCK_D."""
        return [c for c in self.configs if self.keep(c, block_d, smem_budget)]

    def default(self, block_d: int, smem_budget: int) -> triton.Config:
        """For problems too small to tune: the candidate with the smallest buffers (it
        fits the most GPUs and wastes the least on short sequences)."""
        fitting = self.candidates(block_d, smem_budget)
        if not fitting:
            return FALLBACK_CONFIG
        return min(fitting, key=lambda c: (self.smem(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"],
                                                     block_d, c.num_stages), c.num_warps))

    def _prune(self, configs, named_args, **kwargs):
        budget = _smem_budget(named_args["Q"].device)
        return [c for c in configs if self.keep(c, kwargs["BLOCK_D"], budget)]

    def launch(self, grid, *args, work: int, record: int = 0, **constexprs):
        """Launch (tuned, pinned, or the default config for a problem whose ``work`` --
        scores, or cache bytes for the decode kernel -- is below tune_min). With
        ``record`` = n, return the launch as a triton_launch.Launch that replays it with
        new tensors in the first n arguments (or None where it cannot)."""
        pinned = _pinned.get(self.name)
        if pinned is None and work < self.tune_min:
            pinned = self.default(constexprs["BLOCK_D"], _smem_budget(args[0].device))
        launcher = self.tuned if pinned is None else self.fn
        if pinned is not None:
            constexprs.update(pinned.all_kwargs())
        return _launch(launcher, grid, record, *args, **constexprs)


def _launch(launcher, grid, record: int, *args, **kwargs) -> Launch | None:
    """``launcher[grid](*args, **kwargs)``; with ``record`` = n > 0, the launch as a Launch
    replaying it with new tensors in the first n arguments (None where it cannot)."""
    if record:
        return launch_and_record(launcher, grid, record, _tma_scratch, *args, **kwargs)
    launcher[grid](*args, **kwargs)
    return None


FWD = _Kernel("fwd", kernels.attn_fwd, FWD_TILES, True, _registers_fwd, _smem_fwd)
DQ = _Kernel("dq", kernels.attn_bwd_dq, DQ_TILES, True, _registers_dq, _smem_dq)
DKDV = _Kernel("dkdv", kernels.attn_bwd_dkdv, DKDV_TILES, False, _registers_dkdv, _smem_dkdv)
# The decode tile holds what a forward tile holds (rows of Q, K/V blocks in flight).
DECODE = _Kernel("decode", kernels.attn_decode, DECODE_TILES, True, _registers_fwd, _smem_fwd,
                 key=_DECODE_AUTOTUNE_KEY, tune_min=TUNE_MIN_CACHE_BYTES)
KERNELS = {k.name: k for k in (FWD, DQ, DKDV, DECODE)}

# Kernel name -> config used instead of tuning (see pinned_configs).
_pinned: dict[str, triton.Config] = {}


@contextlib.contextmanager
def pinned_configs(**configs: triton.Config) -> Iterator[None]:
    """Launch the named kernels ("fwd", "dq", "dkdv", "decode") with these configs instead of the
    autotuner's or the default choice: for tests that check every candidate, and for
    experiments."""
    unknown = configs.keys() - KERNELS.keys()
    if unknown:
        raise ValueError(f"unknown kernel(s) {sorted(unknown)}; choose from {sorted(KERNELS)}")
    previous = dict(_pinned)
    _pinned.update(configs)
    ops.forget_plans()  # plans made before would replay other configs
    try:
        yield
    finally:
        _pinned.clear()
        _pinned.update(previous)
        ops.forget_plans()


# ---------------------------------------------------------------------------------------
# Buffers, devices, tensor descriptors
# ---------------------------------------------------------------------------------------

# (device, stream) -> the descriptor scratch last handed out there. Kernels on one
# stream run one after another, so each may reuse the previous one's scratch instead of
# allocating its own per launch (~5 µs of host time on the lent H100's host).
_scratch: dict[tuple[int, int], torch.Tensor] = {}


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for the tensor descriptors the kernels build on the device (torch
    aligns to 512 bytes, more than any descriptor needs). While a CUDA graph is captured
    each launch gets its own, from the graph's pool."""
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.int8, device="cuda")
    key = (torch.cuda.current_device(), stream)  # (stream 0 is every device's default)
    buffer = _scratch.get(key)
    if buffer is None or buffer.numel() < size:
        buffer = _scratch[key] = torch.empty(size, dtype=torch.int8, device="cuda")
    return buffer


def _tma_setting() -> str:
    return os.environ.get("FLASH_CANN_TRITON_TMA", "auto")


def _packed_grid() -> str:
    """FLASH_CANN_TRITON_VARLEN_GRID: ``tiles`` (default: the packed forward's programs
    cover the real query blocks, kernels.tiles.packed_tile) or ``max`` (max_seqlen_q
    blocks for every sequence, the earlier grid; for A/B timings)."""
    setting = os.environ.get("FLASH_CANN_TRITON_VARLEN_GRID", "tiles")
    if setting not in ("tiles", "max"):
        raise ValueError(f"FLASH_CANN_TRITON_VARLEN_GRID must be tiles or max (got {setting!r})")
    return setting


def _packed_tiles(batch: int) -> bool:
    """Whether a packed call's grid covers the real query blocks (kernels.tiles.packed_tile)
    rather than max_seqlen_q's blocks for every sequence."""
    return _packed_grid() == "tiles" and batch <= PACKED_TILES_MAX_BATCH


def _use_tma(*bnsd_views: torch.Tensor) -> bool:
    setting = _tma_setting()
    if setting not in ("auto", "0", "1"):
        raise ValueError(f"FLASH_CANN_TRITON_TMA must be auto, 0 or 1 (got {setting!r})")
    device = bnsd_views[0].device
    if setting == "0" or (setting == "auto" and not (
            device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9)):
        return False
    return all(tma_compatible(t) for t in bnsd_views)


def _on_device(device: torch.device):
    """A CUDA device guard that costs nothing when ``device`` is the current one (plan
    replays allocate their descriptor scratch themselves and need no more)."""
    if device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


@contextlib.contextmanager
def _launching_on(device: torch.device, use_tma: bool) -> Iterator[None]:
    """Kernels launch on the tensors' GPU (not the current one); descriptor kernels get
    their scratch allocator. CPU tensors (the Triton interpreter) need neither."""
    if device.type != "cuda":
        yield
        return
    with _on_device(device):
        if use_tma:
            triton.set_allocator(_tma_scratch)
        yield


@functools.lru_cache(maxsize=None)
def _smem_budget(device: torch.device) -> int:
    """Shared memory a config may plan for on ``device``."""
    if device.type != "cuda":
        return SHARED_MEMORY_BUDGET
    index = device.index if device.index is not None else torch.cuda.current_device()
    limit = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return min(SHARED_MEMORY_BUDGET, limit - SHARED_MEMORY_MARGIN)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _bucket(seqlen: int) -> int:
    return min(triton.next_power_of_2(seqlen), SEQLEN_BUCKET_CAP)


def _mask_strides(mask: torch.Tensor | None) -> tuple[int, ...]:
    return mask.stride() if mask is not None else (0, 0)


# ---------------------------------------------------------------------------------------
# The backend's entry points (called by flash_cann.contract.ops after the shared checks)
# ---------------------------------------------------------------------------------------

def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant: Variant = PLAIN):
    out, lse, _ = _forward(query, key, value, key_padding_mask, scale, causal, layout, variant)
    return out, lse


def forward_planned(query, key, value, key_padding_mask, *, scale: float, causal: bool,
                    layout: str):
    """A plain forward, and its plan for later calls of the signature (ops.plain_forward):
    the same launch replayed with the new tensors (None where Triton's cannot be)."""
    out, lse, launch = _forward(query, key, value, key_padding_mask, scale, causal, layout,
                                PLAIN, record=True)
    attrs = dict(scale=scale, causal=causal, layout=layout)
    return (out, lse), launch and _ForwardPlan(launch, lse.shape, query.device, attrs)


def _forward(query, key, value, key_padding_mask, scale, causal, layout, variant,
             record=False):
    """(out, lse, the kernel's Launch if ``record`` and it can be replayed)."""
    packed = layout == layouts.PACKED
    out = empty(query.shape, query.dtype, query.device)
    if packed:
        q, k, v, o = packed_views(query, key, value, out)
        batch = variant.cu_seqlens_q.shape[0] - 1
        rows_q, rows_k = variant.max_seqlen_q, variant.max_seqlen_k
    else:
        q, k, v, o = (layouts.to_bnsd(t, layout) for t in (query, key, value, out))
        batch = q.shape[0]
        rows_q, rows_k = q.shape[2], k.shape[2]
    _, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    lse = empty((q.shape[0], heads_q, seqlen_q), torch.float32, query.device)
    if sm90.eligible(q, k, v, o, plain=variant.plain, packed=packed,
                     key_padding_mask=key_padding_mask, scale=scale):
        return out, lse, _forward_sm90(q, k, v, o, lse, scale, causal, record)
    # Packed sequences take descriptors too: a sequence's view starts q_start rows in,
    # 16-byte aligned whenever the row stride is (descriptors.tma_compatible), and its bounds are
    # the sequence's own rows.
    use_tma = _use_tma(q, k, v, o)
    features = feature_arguments(variant, causal)
    features.update(sink_arguments(variant))
    packed_tiles = packed and _packed_tiles(batch)
    if packed:
        features.update(VARLEN=True, CuSeqQ=variant.cu_seqlens_q, CuSeqK=variant.cu_seqlens_k,
                        max_seqlen_q=rows_q)
    if packed_tiles:
        features.update(PACKED_TILES=True, BATCH_BLOCK=triton.next_power_of_2(batch))

    def grid(meta):
        if packed_tiles:
            # A bound on the real query blocks (each sequence wastes less than one), not
            # max_seqlen_q's blocks for every sequence.
            return triton.cdiv(seqlen_q, meta["BLOCK_M"]) + batch, heads_q, 1
        return triton.cdiv(rows_q, meta["BLOCK_M"]), heads_q, batch
    with _launching_on(query.device, use_tma):
        # The first six arguments are the tensors a replay supplies (same data pointers
        # as these views).
        launch = FWD.launch(grid, q, k, v, o, lse, key_padding_mask,
                            *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                            *_mask_strides(key_padding_mask),
                            batch, heads_q, heads_q // heads_kv, seqlen_q, seqlen_k,
                            scale * math.log2(math.e), _bucket(rows_q), _bucket(rows_k),
                            work=batch * heads_q * rows_q * rows_k, record=6 * record,
                            HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim),
                            HAS_MASK=key_padding_mask is not None, NEGATIVE_SCALE=scale < 0,
                            USE_TMA=use_tma, PERSISTENT=False, **features)
    return out, (lse[0] if packed else lse), launch


def _forward_sm90(q, k, v, o, lse, scale, causal, record):
    """The Hopper forward (sm90.py) on BNSD views; its Launch if ``record``."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    size = sm90.grid(sm90.tiles(batch, heads_q, seqlen_q), _multiprocessors(q.device), causal,
                     seqlen_k)
    with _launching_on(q.device, True):
        return _launch(sm90.kernel(), lambda meta: size, 5 * record, q, k, v, o, lse,
                       q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
                       k.stride(2), v.stride(0), v.stride(1), v.stride(2), o.stride(0),
                       o.stride(1), o.stride(2), batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                       scale * math.log2(math.e), HEAD_DIM=head_dim, BLOCK_M=sm90.BLOCK_M,
                       BLOCK_N=sm90.BLOCK_N, STAGES=sm90.STAGES[head_dim], CAUSAL=causal,
                       num_warps=4)


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool = False,
             variant: Variant = PLAIN):
    grads, _ = _backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
                         grad_softmax_lse, scale, causal, layout, deterministic, variant)
    return grads


def backward_planned(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
                     grad_softmax_lse, *, scale: float, causal: bool, layout: str,
                     deterministic: bool):
    """A plain backward, and its plan (as forward_planned)."""
    grads, launches = _backward(grad_out, query, key, value, out, softmax_lse,
                                key_padding_mask, grad_softmax_lse, scale, causal, layout,
                                deterministic, PLAIN, record=True)
    attrs = dict(scale=scale, causal=causal, layout=layout, deterministic=deterministic)
    plan = None
    if all(launches.values()):
        plan = _BackwardPlan(launches, softmax_lse.shape, query.device, attrs)
    return grads, plan


def _backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
              grad_softmax_lse, scale, causal, layout, deterministic, variant, record=False):
    """((dq, dk, dv, dsinks or None), {stage: its Launch if ``record`` and replayable}). The
    FA2 kernels are deterministic (no atomic adds: NOTES.md, step 9, an atomic dQ was
    slower there); the Hopper backward (sm90.backward_eligible) reduce-adds dQ, in a
    fixed order where ``deterministic``."""
    packed = layout == layouts.PACKED
    device = query.device
    grad_query = empty(query.shape, query.dtype, device)
    grad_key = empty(key.shape, key.dtype, device)
    grad_value = empty(value.shape, value.dtype, device)
    tensors = (query, key, value, out, grad_out, grad_query, grad_key, grad_value)
    if packed:
        q, k, v, o, do, dq, dk, dv = packed_views(*tensors)
        batch = variant.cu_seqlens_q.shape[0] - 1
        rows_q, rows_k = variant.max_seqlen_q, variant.max_seqlen_k
        softmax_lse = softmax_lse.unsqueeze(0)
        grad_softmax_lse = None if grad_softmax_lse is None else grad_softmax_lse.unsqueeze(0)
    else:
        q, k, v, o, do, dq, dk, dv = (layouts.to_bnsd(t, layout) for t in tensors)
        batch = q.shape[0]
        rows_q, rows_k = q.shape[2], k.shape[2]
    _, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    block_d = _block_d(head_dim)
    delta = empty((q.shape[0], heads_q, seqlen_q), torch.float32, device)
    use_tma = not packed and _use_tma(q, k, v, do, dq, dk, dv)
    # The (batch, heads, seqlen) fp32 vectors are read contiguous (a strided one, e.g. an
    # expanded lse gradient, costs a copy of batch * heads * seqlen floats).
    lse = softmax_lse.contiguous()
    dlse = grad_softmax_lse.contiguous() if grad_softmax_lse is not None else None
    launches = {}
    # The sinks' gradient: one partial sum per preprocess tile, added here in a fixed order.
    rows = max(16, PREPROCESS_TILE // block_d)
    sinks = {}
    if variant.sinks is not None:
        sinks = dict(SINKS=True, Lse=lse, Sinks=variant.sinks.contiguous(),
                     DSinkParts=empty((q.shape[0], heads_q, triton.cdiv(seqlen_q, rows)),
                                      torch.float32, device))
    hopper = sm90.backward_eligible(q, k, v, do, plain=variant.plain, packed=packed,
                                    key_padding_mask=key_padding_mask, scale=scale)
    with _launching_on(device, use_tma):
        # Stage: D = rowsum(dO ∘ O) - dLSE (row by row: packed sequences need no bounds).
        launches["preprocess"] = _launch(
            kernels.attn_bwd_preprocess, lambda meta: (triton.cdiv(seqlen_q, rows), heads_q,
                                                       q.shape[0]), 4 * record,
            o, do, dlse, delta, *o.stride(), *do.stride(), q.shape[0], heads_q, seqlen_q,
            HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_DLSE=dlse is not None, PERSISTENT=False,
            BLOCK_M=rows, **sinks)
    if hopper:  # plain: no sinks, so no sinks' gradient
        launches.update(_backward_sm90(q, k, v, do, lse, delta, dq, dk, dv, scale, causal,
                                       deterministic, rows, record))
        return (grad_query, grad_key, grad_value, None), launches
    # The FA2 kernels' arguments.
    inputs = (q, k, v, do, lse, delta, key_padding_mask)
    input_strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    scalars = (*_mask_strides(key_padding_mask), batch, heads_q, heads_q // heads_kv, seqlen_q,
               seqlen_k, scale, scale * math.log2(math.e), _bucket(rows_q), _bucket(rows_k))
    features = feature_arguments(variant, causal)
    shared = dict(work=batch * heads_q * rows_q * rows_k, HEAD_DIM=head_dim,
                  BLOCK_D=block_d, HAS_MASK=key_padding_mask is not None,
                  USE_TMA=use_tma, PERSISTENT=False, **features)
    varlen = dict(VARLEN=True, CuSeqQ=variant.cu_seqlens_q, CuSeqK=variant.cu_seqlens_k) \
        if packed else {}
    with _launching_on(device, use_tma):
        # Stage: dK, dV per key block.
        launches["dkdv"] = DKDV.launch(
            lambda meta: (triton.cdiv(rows_k, meta["BLOCK_N"]), heads_kv, batch),
            *inputs, dk, dv, *input_strides, *dk.stride(), *dv.stride(), *scalars,
            record=9 * record, **shared, **varlen,
            **({"max_seqlen_k": rows_k} if packed else {}))
        # Stage: dQ per query block.
        launches["dq"] = DQ.launch(
            lambda meta: (triton.cdiv(rows_q, meta["BLOCK_M"]), heads_q, batch),
            *inputs, dq, *input_strides, *dq.stride(), *scalars, record=8 * record,
            **shared, **varlen, **({"max_seqlen_q": rows_q} if packed else {}))
    grad_sinks = sinks["DSinkParts"].sum((0, 2)) if sinks else None
    return (grad_query, grad_key, grad_value, grad_sinks), launches


def _dq_accumulator(lse_shape, head_dim: int, deterministic: bool, device: torch.device):
    """The Hopper backward's fp32 dQ, (batch, heads_q, seqlen_q, head_dim), zeroed: every
    key block reduce-adds into it; and, ``deterministic``, the turn counters that order
    those adds (int32 zeros, one per query block: kernels/backward_sm90.py), else None."""
    accum = torch.zeros((*lse_shape, head_dim), dtype=torch.float32, device=device)
    if not deterministic:
        return accum, None
    *batch_heads, seqlen_q = lse_shape
    blocks = triton.cdiv(seqlen_q, sm90.BACKWARD_BLOCK_M)
    return accum, torch.zeros((*batch_heads, blocks), dtype=torch.int32, device=device)


def _backward_sm90(q, k, v, do, lse, delta, dq, dk, dv, scale, causal, deterministic, rows,
                   record):
    """The Hopper backward (sm90.py) on BNSD views, after the preprocess: dK, dV, and dQ
    reduce-added in fp32, then scaled and cast into dq by tiles of the preprocess's
    ``rows``; {stage: its Launch if ``record``}."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    dq_accum, dq_turns = _dq_accumulator((batch, heads_q, seqlen_q), head_dim, deterministic,
                                         q.device)
    grid = sm90.backward_grid(batch, heads_kv, seqlen_k, deterministic)
    with _launching_on(q.device, True):
        main = _launch(sm90.backward_kernel(), lambda meta: grid, 10 * record, q, k, v, do, lse,
                       delta, dq_accum, dq_turns, dk, dv, *q.stride()[:3], *k.stride()[:3],
                       *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
                       batch, heads_q, heads_kv, seqlen_q, seqlen_k, scale,
                       scale * math.log2(math.e), HEAD_DIM=head_dim,
                       BLOCK_M=sm90.BACKWARD_BLOCK_M, STAGES=sm90.BACKWARD_STAGES[head_dim],
                       CAUSAL=causal, DQ_BUFFERS=sm90.BACKWARD_DQ_BUFFERS,
                       DETERMINISTIC=deterministic, num_warps=4)
        convert = _launch(kernels.attn_bwd_dq_convert,
                          lambda meta: (triton.cdiv(seqlen_q, rows), heads_q, batch),
                          2 * record, dq_accum, dq, *dq.stride()[:3], seqlen_q, scale,
                          HEAD_DIM=head_dim, BLOCK_M=rows)
    return {"sm90": main, "dq_convert": convert}


class _ForwardPlan:
    """A plain forward's recorded launch, for later calls of its signature: allocate the
    outputs, launch. FLASH_CANN_TRITON_TMA or FLASH_CANN_SM90 changed since: the full
    path."""

    def __init__(self, launch: Launch, lse_shape, device: torch.device, attrs: dict):
        self.launch, self.lse_shape, self.device, self.attrs = launch, lse_shape, device, attrs
        self.settings = (_tma_setting(), sm90.setting())

    def __call__(self, query, key, value, key_padding_mask):
        if (_tma_setting(), sm90.setting()) != self.settings:
            return forward(query, key, value, key_padding_mask, **self.attrs)
        out = empty(query.shape, query.dtype, self.device)
        lse = empty(self.lse_shape, torch.float32, self.device)
        with _on_device(self.device):
            self.replay(query, key, value, key_padding_mask, out, lse)
        return out, lse

    def replay(self, query, key, value, key_padding_mask, out, lse) -> None:
        """The recorded launch alone, writing ``out`` and ``lse`` (on the current device).
        The Hopper forward takes no mask (sm90.eligible): its launch has 5 tensors."""
        tensors = (query, key, value, out, lse, key_padding_mask)[:self.launch.tensors]
        self.launch(*tensors, stream=current_stream(self.device.index))


class _BackwardPlan:
    """A plain backward's recorded launches (as _ForwardPlan)."""

    def __init__(self, launches: dict, lse_shape, device: torch.device, attrs: dict):
        self.launches, self.lse_shape, self.device, self.attrs = launches, lse_shape, device, attrs
        self.settings = (_tma_setting(), sm90.setting())

    def __call__(self, grad_out, query, key, value, out, softmax_lse, key_padding_mask,
                 grad_softmax_lse):
        if (_tma_setting(), sm90.setting()) != self.settings:
            return backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
                            grad_softmax_lse, **self.attrs)
        device = self.device
        grad_query = empty(query.shape, query.dtype, device)
        grad_key = empty(key.shape, key.dtype, device)
        grad_value = empty(value.shape, value.dtype, device)
        delta = empty(self.lse_shape, torch.float32, device)
        lse = softmax_lse.contiguous()
        dlse = grad_softmax_lse.contiguous() if grad_softmax_lse is not None else None
        inputs = (query, key, value, grad_out, lse, delta, key_padding_mask)
        launches = self.launches
        with _on_device(device):
            stream = current_stream(device.index)
            launches["preprocess"](out, grad_out, dlse, delta, stream=stream)
            if "sm90" in launches:  # the Hopper backward (_backward_sm90)
                dq_accum, dq_turns = _dq_accumulator(self.lse_shape, query.shape[-1],
                                                     self.attrs["deterministic"], device)
                launches["sm90"](query, key, value, grad_out, lse, delta, dq_accum, dq_turns,
                                 grad_key, grad_value, stream=stream)
                launches["dq_convert"](dq_accum, grad_query, stream=stream)
            else:
                launches["dkdv"](*inputs, grad_key, grad_value, stream=stream)
                launches["dq"](*inputs, grad_query, stream=stream)
        return grad_query, grad_key, grad_value, None


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(index).multi_processor_count


def split_count(programs: int, capacity: int, multiprocessors: int) -> int:
    """How many key ranges split-KV gives each (sequence, kv head), from shapes only
    (never the filled lengths, which live on the device): 1 when ``programs`` (sequences
    x kv heads x row blocks) already fill SPLIT_FILL of the GPU's program slots; else,
    as flash-attn 2's num_splits_heuristic, the fewest splits whose waves of programs
    use the slots within 85 % as well as the best count does, each split keeping at
    least SPLIT_MIN_KEYS of the ``capacity`` keys. Splits that give every range the same
    number of key blocks as one split fewer are skipped (the same work, more combine)."""
    slots = SLOTS_PER_SM * multiprocessors
    if programs >= SPLIT_FILL * slots:
        return 1
    key_blocks = max(1, -(-capacity // SPLIT_MIN_KEYS))
    most = min(MAX_NUM_SPLITS, slots, key_blocks)

    def useful(n):
        return n == 1 or -(-key_blocks // n) != -(-key_blocks // (n - 1))

    def efficiency(n):
        waves = programs * n / slots
        return waves / math.ceil(waves)

    candidates = [n for n in range(1, most + 1) if useful(n)]
    best = max(efficiency(n) for n in candidates)
    return next(n for n in candidates if efficiency(n) >= 0.85 * best)


def kvcache_forward(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, *,
                    scale: float, causal: bool, layout: str = "BSND", cache_leftpad=None,
                    variant: Variant = PLAIN, num_splits: int = 0):
    """Attention over entries cache_leftpad[b] (LEFTPAD) .. seqlens_k[b] - 1 (SEQUSED_K) of
    each sequence's cache, read in place: through its cache row (BATCH_IDX) or its pages
    (PAGED, pointer loads through the block table); never a gathered copy of the cache.
    Queries BSND or packed (TND: VARLEN, vLLM's mixed prefill + decode rows). With GQA
    the decode kernel packs the group's query heads into one tile, so K/V are read once
    per group; without, the forward kernel runs. num_splits: flash-attn's hint (0:
    split_count's choice, 1: no split, n: n key ranges); split calls run the decode kernel
    (any group) into workspaces and attn_decode_combine."""
    call = cache_call(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table,
                      scale=scale, causal=causal, variant=variant, layout=layout,
                      cache_leftpad=cache_leftpad)
    batch, heads_q, group, _, capacity, _ = call.sizes
    rows_q = call.rows_q  # a sequence's query rows at most (max_seqlen_q with TND)
    head_dim, heads_kv = query.shape[-1], call.heads_kv
    tensors, strides = call.tensors, call.strides
    sizes = (*call.sizes, _bucket(rows_q), _bucket(capacity))
    common = dict(HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), **call.features)
    packed_tiles = layout == layouts.PACKED and _packed_tiles(batch)
    if packed_tiles:
        common.update(PACKED_TILES=True, BATCH_BLOCK=triton.next_power_of_2(batch))
    cache_bytes = 2 * batch * heads_kv * capacity * head_dim * query.element_size()
    splits = num_splits or split_count(
        batch * heads_kv * triton.cdiv(group * rows_q, DECODE_TILES[0][0]), capacity,
        _multiprocessors(query.device))

    def row_blocks(block_m, rows_per_token):
        """(row blocks, sequences) of the grid: max_seqlen_q's blocks for each sequence,
        or a bound on the real blocks of all of them (PACKED_TILES)."""
        if packed_tiles:
            return triton.cdiv(rows_per_token * call.sizes[3], block_m) + batch, 1
        return triton.cdiv(rows_per_token * rows_q, block_m), batch

    with _launching_on(query.device, False):
        if splits > 1:
            _split_decode(call, sizes, splits, cache_bytes, common, row_blocks)
        elif group > 1:
            DECODE.launch(lambda meta: _cache_grid(row_blocks(meta["BLOCK_M"], group), heads_kv),
                          *tensors, *strides, *sizes, work=cache_bytes, PERSISTENT=False,
                          **common)
        else:
            FWD.launch(lambda meta: _cache_grid(row_blocks(meta["BLOCK_M"], 1), heads_q),
                       *tensors[:5], None, *strides, 0, 0, *sizes, HAS_MASK=False,
                       NEGATIVE_SCALE=scale < 0, USE_TMA=False, PERSISTENT=False,
                       SEQUSED_K=True, work=batch * heads_q * rows_q * capacity, **common)
    return call.out, call.lse


def _cache_grid(row_blocks: tuple[int, int], heads: int, splits: int = 1) -> tuple:
    blocks, sequences = row_blocks
    return blocks * splits, heads, sequences


def _split_decode(call, sizes, splits: int, cache_bytes: int, common: dict, row_blocks) -> None:
    """Split-KV: the decode kernel's programs, ``splits`` per (row block, kv head,
    sequence), write each key range's out and lse (no sink) into fp32 workspaces shaped
    as the out and lse views (BNSD; TND queries are rows of a batch of one) and sized by
    the shapes; attn_decode_combine merges them into call.out and call.lse. row_blocks:
    kvcache_forward's (row blocks, sequences) of the grid."""
    q, k, v, o, lse = call.tensors
    _, heads_q, group = call.sizes[:3]
    rows_shape = o.shape[:3]  # (batch, or 1 with TND; heads_q; query rows)
    head_dim = q.shape[-1]
    device = q.device
    rows = math.prod(rows_shape)
    out_parts = empty((splits, *rows_shape, head_dim), torch.float32, device)
    lse_parts = empty((splits, *rows_shape), torch.float32, device)
    partial = {name: value for name, value in common.items() if name not in ("SINKS", "Sinks")}
    DECODE.launch(lambda meta: _cache_grid(row_blocks(meta["BLOCK_M"], group), call.heads_kv,
                                           splits),
                  q, k, v, out_parts, lse_parts, *call.strides[:12], *out_parts[0].stride(),
                  *sizes, splits=splits, split_stride_o=out_parts.stride(0),
                  split_stride_lse=lse_parts.stride(0), work=cache_bytes, PERSISTENT=False,
                  **partial)
    block_d = common["BLOCK_D"]
    fill = triton.next_power_of_2(triton.cdiv(rows, SLOTS_PER_SM * _multiprocessors(device)))
    block_r = max(1, min(COMBINE_ELEMENTS // block_d, fill))
    kernels.attn_decode_combine[(triton.cdiv(rows, block_r),)](
        out_parts, lse_parts, o, lse, common.get("Sinks"), rows, heads_q, rows_shape[2],
        splits, *o.stride(), HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=block_r,
        SINKS="Sinks" in common)
