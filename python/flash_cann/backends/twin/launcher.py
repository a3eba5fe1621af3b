"""Twin backend: the Ascend C kernels (op_kernel/), forward and backward, run on the CPU
twin of the Ascend C API (twin/), through the same op contract.

This is a verification tool, not a fast path: it executes the NPU kernels' exact
sequence of API calls -- data moves, cube fractals, vector instructions, cross-core
flags, SyncAll, atomic adds -- on simulated cores, checking the hardware's rules as it
goes. Select it with ``flash_cann.use_backend("twin")``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

import torch

from ...contract import layout as layouts
from ...contract.variant import PLAIN, Variant, shared_alibi_slopes
from ...ascend import native
from ...ascend.planner import DTYPES, LAYOUTS, DecodeProblem, Variant as PlanVariant
from . import timing as timing_mode
from .timing import Timing

AI_CORES = 0  # 0: the SoC's AI cores (Ascend910B2: 24); tests set other counts


class TwinViolation(RuntimeError):
    """The kernel broke a hardware rule on the twin (or the planner refused)."""


def unavailable_reason() -> str | None:
    return native.unavailable_reason()


def available() -> bool:
    return unavailable_reason() is None


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(native.artefact("twin/libflash_cann_twin.so")))
    lib.flash_cann_twin_forward.restype = ctypes.c_int
    lib.flash_cann_twin_forward.argtypes = (
        [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 5
        + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 3 + [ctypes.c_double]
        + [ctypes.c_int64] * 2 + [ctypes.c_double] * 2 + [ctypes.c_int32] * 3
        + [ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64])
    lib.flash_cann_twin_backward.restype = ctypes.c_int
    lib.flash_cann_twin_backward.argtypes = (
        [ctypes.c_void_p] * 10 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 7
        + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 3 + [ctypes.c_double]
        + [ctypes.c_int32] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_double] * 2 + [ctypes.c_int32] * 2
        + [ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
           ctypes.c_uint64])
    lib.flash_cann_twin_kvcache.restype = ctypes.c_int
    lib.flash_cann_twin_kvcache.argtypes = (
        [ctypes.POINTER(DecodeProblem), ctypes.POINTER(PlanVariant)] + [ctypes.c_void_p] * 12
        + [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_uint64),
           ctypes.c_char_p, ctypes.c_uint64])
    lib.flash_cann_twin_cube_passes.restype = None
    lib.flash_cann_twin_cube_passes.argtypes = [ctypes.c_int32]
    lib.flash_cann_twin_device_cores.restype = None
    lib.flash_cann_twin_device_cores.argtypes = [ctypes.c_int32]
    lib.flash_cann_twin_drop_sync.restype = None
    lib.flash_cann_twin_drop_sync.argtypes = [ctypes.c_char_p]
    lib.flash_cann_twin_sync_sites.restype = ctypes.c_int64
    lib.flash_cann_twin_sync_sites.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    timing_mode.declare(lib)
    return lib


# The memory levels of the planner's plan["levels"], in the C ABI's order.
MEMORY_LEVELS = ("L1", "L0A", "L0B", "L0C", "UB")


def _pointer(t):
    return None if t is None else t.data_ptr()


def _launch(function, *args, allocated: dict | None, reports: tuple = (),
            timing: Timing | None = None):
    """Call a kernel's C ABI; raise TwinViolation on a broken rule; fill ``allocated``,
    and with ``timing`` time the launch (timing.py). ``reports``: the ABI's further report
    buffers, between the allocated bytes and the error message."""
    error = ctypes.create_string_buffer(4096)
    measured = (ctypes.c_uint64 * len(MEMORY_LEVELS))()
    with timing_mode.timed(_library(), timing):
        failed = function(*args, measured, *reports, error, len(error)) != 0
    if failed:
        raise TwinViolation(f"flash_cann twin: {error.value.decode()}")
    if allocated is not None:
        allocated.update(zip(MEMORY_LEVELS, measured))


# VariantTiling.alibi: how the kernel indexes the slopes.
ALIBI_NONE, ALIBI_PER_HEAD, ALIBI_PER_BATCH_HEAD = 0, 1, 2


def _alibi_slopes(slopes: torch.Tensor | None) -> tuple[torch.Tensor | None, int]:
    """The slopes as the kernel reads them, and VariantTiling.alibi: slopes every sequence
    shares as one (heads_q,) row, per head; others per (batch, head)."""
    if slopes is None:
        return None, ALIBI_NONE
    shared = shared_alibi_slopes(slopes)
    if shared is not None:
        return shared.to(torch.float32).contiguous(), ALIBI_PER_HEAD
    return slopes.to(torch.float32).contiguous(), ALIBI_PER_BATCH_HEAD


class _Problem:
    """A call's sizes as the kernels' C ABI takes them: (batch, heads_q, heads_kv,
    seqlen_q, seqlen_k, head_dim), and with layout TND the int32 cu_seqlens (batch + 1
    sequences' offsets) and the packed token counts: batch is then the number of
    sequences, seqlen_q/k are max_seqlen_q/k (what the planner sizes buffers from; the
    kernel reads the offsets on the device)."""

    def __init__(self, query, key, layout: str, variant: Variant):
        self.packed = layout == "TND"
        if self.packed:
            self.tokens_q, self.heads_q, self.head_dim = query.shape
            self.tokens_k, self.heads_kv = key.shape[:2]
            self.cu_q = variant.cu_seqlens_q.to(torch.int32).contiguous()
            self.cu_k = variant.cu_seqlens_k.to(torch.int32).contiguous()
            self.batch = self.cu_q.shape[0] - 1
            self.seqlen_q, self.seqlen_k = variant.max_seqlen_q, variant.max_seqlen_k
            self.lse_shape = (self.heads_q, self.tokens_q)
        else:
            self.batch, self.heads_q, self.seqlen_q, self.head_dim = layouts.sizes(query, layout)
            self.heads_kv, self.seqlen_k = layouts.sizes(key, layout)[1:3]
            self.cu_q = self.cu_k = None
            self.tokens_q = self.tokens_k = 0
            self.lse_shape = (self.batch, self.heads_q, self.seqlen_q)

    def sizes(self) -> tuple:
        return (self.batch, self.heads_q, self.heads_kv, self.seqlen_q, self.seqlen_k,
                self.head_dim)

    def packing(self) -> tuple:
        """cu_seqlens_q/k pointers and tokens_q/k, as the C ABI takes them."""
        return _pointer(self.cu_q), _pointer(self.cu_k), self.tokens_q, self.tokens_k


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant: Variant = PLAIN, ai_cores: int | None = None, allocated: dict | None = None,
            timing: Timing | None = None):
    """Run the forward kernel on the twin; returns (out, softmax_lse).

    ``variant``: the features (packed sequences, window, softcap, ALiBi slopes, dropout_p
    with rng_state, sinks), as the cpu backend takes them; ``fp16_scores`` reaches the
    planner (which refuses it for non-fp16 inputs) and changes nothing else: the forward
    keeps fp32 S. ``allocated``, if given,
    receives the bytes the kernel allocated per memory level (every ``InitBuffer``; AIC
    levels per cube core, UB per vector core), keyed as the planner's ``plan["levels"]``.
    ``timing``, if given, times the launch and receives its report (timing.py).
    """
    p = _Problem(query, key, layout, variant)
    q, k, v = (t.contiguous() for t in (query, key, value))  # the kernel reads dense layouts
    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    # Poisoned outputs: an element the kernel never writes shows up as NaN.
    out = torch.full_like(q, float("nan"))
    lse = torch.full(p.lse_shape, float("nan"), dtype=torch.float32)
    slopes, alibi = _alibi_slopes(variant.alibi_slopes)
    rng = None
    if variant.dropout_p > 0:
        rng = variant.rng_state.to(torch.int64).contiguous()
    sinks = variant.sinks
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
    _launch(_library().flash_cann_twin_forward,
            q.data_ptr(), k.data_ptr(), v.data_ptr(), _pointer(mask), *p.packing(),
            _pointer(slopes), _pointer(rng), _pointer(sinks), out.data_ptr(), lse.data_ptr(),
            *p.sizes(), DTYPES[str(query.dtype).removeprefix("torch.")],
            LAYOUTS[layout], int(causal), float(scale), variant.window_left,
            variant.window_right, float(variant.softcap), float(variant.dropout_p), alibi,
            int(variant.fp16_scores), AI_CORES if ai_cores is None else ai_cores,
            allocated=allocated, timing=timing)
    return out, lse


def _int32(t):
    return None if t is None else t.to(torch.int32).contiguous()


def decode_problem(query, k_cache, seqlens_k, cache_batch_idx, block_table, *, scale: float,
                   causal: bool, variant: Variant = PLAIN, cache_leftpad=None,
                   cu_seqlens_q=None, max_seqlen_q: int = 0, splits: int = 0):
    """The decode planner's view of a kvcache_forward call (op_host/planner/c_api.h's
    flash_cann_decode_problem and flash_cann_variant): what the twin plans with, and what
    tests plan with to compare the kernel's allocations with the plan."""
    tnd = cu_seqlens_q is not None
    if tnd:
        tokens, hq, d = query.shape
        batch, seqlen_q = cu_seqlens_q.shape[0] - 1, max_seqlen_q
    else:
        batch, seqlen_q, hq, d = query.shape
        tokens = 0
    problem = DecodeProblem(
        batch=batch, heads_q=hq, heads_kv=k_cache.shape[2], seqlen_q=seqlen_q, tokens_q=tokens,
        head_dim=d, cache_batch=k_cache.shape[0], cache_seqlen=k_cache.shape[1],
        max_blocks=0 if block_table is None else block_table.shape[1],
        dtype=DTYPES[str(query.dtype).removeprefix("torch.")], tnd=int(tnd), causal=int(causal),
        has_batch_idx=int(cache_batch_idx is not None), has_leftpad=int(cache_leftpad is not None),
        splits=splits, scale=float(scale))
    features = PlanVariant(variant.window_left, variant.window_right, float(variant.softcap), 0.0,
                           _alibi_slopes(variant.alibi_slopes)[1], int(variant.sinks is not None))
    return problem, features


def kvcache_forward(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, *,
                    scale: float, causal: bool, layout: str = "BSND", cache_leftpad=None,
                    variant: Variant = PLAIN, num_splits: int = 0,
                    ai_cores: int | None = None, allocated: dict | None = None,
                    splits_used: list | None = None, timing: Timing | None = None):
    """Run the decode kernel on the twin; returns (out, softmax_lse), as the cpu backend's
    kvcache_forward.

    query: (batch, seqlen_q, heads_q, head_dim), or with layout TND (tokens, heads_q,
    head_dim), sequence b's rows from ``variant.cu_seqlens_q`` with
    ``variant.max_seqlen_q`` bounding the rows per sequence; the caches
    contiguous (batch_cache, seqlen_cache, heads_kv, head_dim) with ``cache_batch_idx``, or
    paged (num_blocks, page_size, heads_kv, head_dim) through ``block_table``;
    ``seqlens_k`` int32 (batch,): the keys each sequence attends to (the new keys already
    appended by contract.kvcache.append); ``cache_leftpad``: the first visible key.
    ``num_splits`` > 0 forces the split of each tile's keys over cores (flash-attn's hint;
    0: the planner chooses); ``splits_used``, if given, receives the plan's split count;
    ``allocated`` and ``timing`` as for ``forward``.
    """
    cu_seqlens_q = variant.cu_seqlens_q if layout == "TND" else None
    problem, features = decode_problem(
        query, k_cache, seqlens_k, cache_batch_idx, block_table, scale=scale, causal=causal,
        variant=variant, cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=variant.max_seqlen_q, splits=num_splits)
    q, kc, vc = (t.contiguous() for t in (query, k_cache, v_cache))
    out = torch.full_like(q, float("nan"))
    lse_shape = ((problem.heads_q, problem.tokens_q) if problem.tnd else
                 (problem.batch, problem.heads_q, problem.seqlen_q))
    lse = torch.full(lse_shape, float("nan"), dtype=torch.float32)
    slopes = _alibi_slopes(variant.alibi_slopes)[0]
    sinks = None if variant.sinks is None else variant.sinks.to(torch.float32).contiguous()
    lengths, batch_idx, table, leftpad, cu = (_int32(t) for t in (
        seqlens_k, cache_batch_idx, block_table, cache_leftpad, cu_seqlens_q))
    used = ctypes.c_int32(0)
    _launch(_library().flash_cann_twin_kvcache, ctypes.byref(problem), ctypes.byref(features),
            q.data_ptr(), kc.data_ptr(), vc.data_ptr(), lengths.data_ptr(), _pointer(batch_idx),
            _pointer(table), _pointer(leftpad), _pointer(cu), _pointer(slopes), _pointer(sinks),
            out.data_ptr(), lse.data_ptr(), AI_CORES if ai_cores is None else ai_cores,
            ctypes.byref(used), allocated=allocated, timing=timing)
    if splits_used is not None:
        splits_used.append(used.value)
    return out, lse


def sync_sites() -> list[str]:
    """The sync call sites ("kind file:line") the last twin launch executed."""
    capacity = 1 << 14
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        length = _library().flash_cann_twin_sync_sites(buffer, capacity)
        if length >= 0:
            return buffer.value.decode().splitlines()
        capacity = -length


@contextlib.contextmanager
def cube_passes(mode: int):
    """Launches inside the block plan with the planner's ``cube_passes`` (1: the 256-row tile
    in two cube row passes wherever it fits, -1: never; 0, the default, lets the schedule
    model choose), as ``planner.variant(cube_passes=...)`` plans."""
    _library().flash_cann_twin_cube_passes(mode)
    try:
        yield
    finally:
        _library().flash_cann_twin_cube_passes(0)


@contextlib.contextmanager
def device_cores(cores: int):
    """Launches inside the block run on a device of ``cores`` AI cores, whatever the
    planner planned for (tests: a plan with more blocks than the device's cores; the twin
    reports a SyncAll kernel launched so)."""
    _library().flash_cann_twin_device_cores(cores)
    try:
        yield
    finally:
        _library().flash_cann_twin_device_cores(0)


@contextlib.contextmanager
def dropped_sync(site: str):
    """Mutation testing: launches inside the block run without the happens-before edge of
    the sync call site ``site`` ("file:line"); its bookkeeping still runs."""
    _library().flash_cann_twin_drop_sync(site.encode())
    try:
        yield
    finally:
        _library().flash_cann_twin_drop_sync(b"")


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool = False,
             variant: Variant = PLAIN, ai_cores: int | None = None,
             allocated: dict | None = None, unordered_atomic_adds: list | None = None,
             timing: Timing | None = None):
    """Run the backward kernel on the twin; returns (grad_query, grad_key, grad_value,
    grad_sinks), grad_sinks None when ``variant`` has no sinks (the backend protocol);
    the kernel's output is then checked to be zeros, as the op promises.

    ``variant``: the features (packed sequences, window, softcap, ALiBi, dropout, sinks),
    as the cpu backend's backward takes it; with ``fp16_scores`` the fast path's kernel
    (S in fp16).
    ``deterministic`` selects the dQ variant whose result is bitwise the same for every
    run and every split of the work over cores; ``allocated`` and ``timing`` as for
    ``forward``.
    ``unordered_atomic_adds``, if given, receives the names of the tensors the kernel
    writes ("grad_query", ..., "workspace") where some element got atomic adds from
    two cores with no happens-before order between them, an order the hardware does not
    fix (needs the race detector, on unless FLASH_CANN_TWIN_RACE_CHECK=0).
    """
    p = _Problem(query, key, layout, variant)
    do, q, k, v, o = (t.contiguous() for t in (grad_out, query, key, value, out))
    lse = softmax_lse.to(torch.float32).contiguous()
    dlse = None if grad_softmax_lse is None else grad_softmax_lse.to(torch.float32).contiguous()
    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    # Poisoned outputs: an element the kernel never writes shows up as NaN.
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    grad_sinks = torch.full((p.heads_q,), float("nan"), dtype=torch.float32)
    slopes, alibi = _alibi_slopes(variant.alibi_slopes)
    sinks = variant.sinks
    sinks = None if sinks is None else sinks.to(torch.float32).contiguous()
    rng = None if variant.rng_state is None else variant.rng_state.to(torch.int64).contiguous()
    names = None if unordered_atomic_adds is None else ctypes.create_string_buffer(1024)
    _launch(_library().flash_cann_twin_backward,
            do.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
            _pointer(mask), _pointer(dlse), *p.packing(), _pointer(slopes), _pointer(rng),
            _pointer(sinks), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), grad_sinks.data_ptr(),
            *p.sizes(), DTYPES[str(query.dtype).removeprefix("torch.")], LAYOUTS[layout],
            int(causal), float(scale), int(deterministic), AI_CORES if ai_cores is None else ai_cores,
            variant.window_left, variant.window_right, float(variant.softcap),
            float(variant.dropout_p), alibi, int(variant.fp16_scores),
            allocated=allocated, reports=(names, 0 if names is None else len(names)),
            timing=timing)
    if unordered_atomic_adds is not None:
        unordered_atomic_adds.extend(filter(None, names.value.decode().split(",")))
    if sinks is None:
        # The CANN op always has grad_sinks: the kernel writes zeros without sinks (a
        # timing-only launch computes no values).
        computed = timing is None or not timing.timing_only
        if computed and not torch.all(grad_sinks == 0):
            raise TwinViolation("flash_cann twin: grad_sinks without sinks is not all zero: "
                                f"{grad_sinks.tolist()}")
        return dq, dk, dv, None
    return dq, dk, dv, grad_sinks
