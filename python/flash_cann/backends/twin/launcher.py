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
from ...ascend.planner import DTYPES, LAYOUTS

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
        + [ctypes.c_int64] * 2 + [ctypes.c_double] * 2 + [ctypes.c_int32] * 2
        + [ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64])
    lib.flash_cann_twin_backward.restype = ctypes.c_int
    lib.flash_cann_twin_backward.argtypes = (
        [ctypes.c_void_p] * 10 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 7
        + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 3 + [ctypes.c_double]
        + [ctypes.c_int32] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_double] * 2 + [ctypes.c_int32]
        + [ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
           ctypes.c_uint64])
    lib.flash_cann_twin_drop_sync.restype = None
    lib.flash_cann_twin_drop_sync.argtypes = [ctypes.c_char_p]
    lib.flash_cann_twin_sync_sites.restype = ctypes.c_int64
    lib.flash_cann_twin_sync_sites.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    return lib


# The memory levels of the planner's plan["levels"], in the C ABI's order.
MEMORY_LEVELS = ("L1", "L0A", "L0B", "L0C", "UB")


def _pointer(t):
    return None if t is None else t.data_ptr()


def _launch(function, *args, allocated: dict | None, reports: tuple = ()):
    """Call a kernel's C ABI; raise TwinViolation on a broken rule; fill ``allocated``.
    ``reports``: the ABI's further report buffers, between the allocated bytes and the
    error message."""
    error = ctypes.create_string_buffer(4096)
    measured = (ctypes.c_uint64 * len(MEMORY_LEVELS))()
    if function(*args, measured, *reports, error, len(error)) != 0:
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
            variant: Variant = PLAIN, ai_cores: int | None = None, allocated: dict | None = None):
    """Run the forward kernel on the twin; returns (out, softmax_lse).

    ``variant``: the features (packed sequences, window, softcap, ALiBi slopes, dropout_p
    with rng_state, sinks), as the cpu backend takes them. ``allocated``, if given,
    receives the bytes the kernel allocated per memory level (every ``InitBuffer``; AIC
    levels per cube core, UB per vector core), keyed as the planner's ``plan["levels"]``.
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
            AI_CORES if ai_cores is None else ai_cores, allocated=allocated)
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
             allocated: dict | None = None, unordered_atomic_adds: list | None = None):
    """Run the backward kernel on the twin; returns (grad_query, grad_key, grad_value,
    grad_sinks), grad_sinks None when ``variant`` has no sinks (the backend protocol);
    the kernel's output is then checked to be zeros, as the op promises.

    ``variant``: the features (packed sequences, window, softcap, ALiBi, dropout, sinks),
    as the cpu backend's backward takes it.
    ``deterministic`` selects the dQ variant whose result is bitwise the same for every
    run and every split of the work over cores; ``allocated`` as for ``forward``.
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
            float(variant.dropout_p), alibi,
            allocated=allocated, reports=(names, 0 if names is None else len(names)))
    if unordered_atomic_adds is not None:
        unordered_atomic_adds.extend(filter(None, names.value.decode().split(",")))
    if sinks is None:
        # The CANN op always has grad_sinks: the kernel writes zeros without sinks.
        if not torch.all(grad_sinks == 0):
            raise TwinViolation("flash_cann twin: grad_sinks without sinks is not all zero: "
                                f"{grad_sinks.tolist()}")
        return dq, dk, dv, None
    return dq, dk, dv, grad_sinks
