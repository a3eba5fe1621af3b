"""Twin backend: the Ascend C forward kernel (op_kernel/) run on the CPU twin of the
Ascend C API (twin/), through the same op contract.

This is a verification tool, not a fast path: it executes the NPU kernel's exact
sequence of API calls -- data moves, cube fractals, vector instructions, cross-core
flags -- on simulated cores, checking the hardware's rules as it goes. Select it with
``flash_cann.use_backend("twin")``. The kernel is forward only; there is no Ascend
backward kernel yet.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

import torch

from .. import layout as layouts
from .. import native
from ..planner import DTYPES, LAYOUTS

AI_CORES = 0  # 0: the SoC's AI cores (Ascend910B2: 24); tests set other counts


class TwinViolation(RuntimeError):
    """The kernel broke a hardware rule on the twin (or the planner refused)."""


def available() -> bool:
    return True


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(native.artefact("twin/libflash_cann_twin.so")))
    lib.flash_cann_twin_forward.restype = ctypes.c_int
    lib.flash_cann_twin_forward.argtypes = (
        [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 3 + [ctypes.c_double]
        + [ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64])
    lib.flash_cann_twin_drop_sync.restype = None
    lib.flash_cann_twin_drop_sync.argtypes = [ctypes.c_char_p]
    lib.flash_cann_twin_sync_sites.restype = ctypes.c_int64
    lib.flash_cann_twin_sync_sites.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    return lib


# The memory levels of the planner's plan["levels"], in the C ABI's order.
MEMORY_LEVELS = ("L1", "L0A", "L0B", "L0C", "UB")


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            ai_cores: int | None = None, allocated: dict | None = None):
    """Run the forward kernel on the twin; returns (out, softmax_lse).

    ``allocated``, if given, receives the bytes the kernel allocated per memory level
    (every ``InitBuffer``; AIC levels per cube core, UB per vector core), keyed as the
    planner's ``plan["levels"]``.
    """
    b, hq, sq, d = layouts.sizes(query, layout)
    hk, sk = layouts.sizes(key, layout)[1:3]
    q, k, v = (t.contiguous() for t in (query, key, value))  # the kernel reads dense layouts
    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    # Poisoned outputs: an element the kernel never writes shows up as NaN.
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32)
    error = ctypes.create_string_buffer(4096)
    measured = (ctypes.c_uint64 * len(MEMORY_LEVELS))()
    status = _library().flash_cann_twin_forward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr() if mask is not None else None,
        out.data_ptr(), lse.data_ptr(), b, hq, hk, sq, sk, d,
        DTYPES[str(query.dtype).removeprefix("torch.")], LAYOUTS[layout], int(causal),
        float(scale), AI_CORES if ai_cores is None else ai_cores, measured, error, len(error))
    if status != 0:
        raise TwinViolation(f"flash_cann twin: {error.value.decode()}")
    if allocated is not None:
        allocated.update(zip(MEMORY_LEVELS, measured))
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


def backward(*args, **kwargs):
    raise NotImplementedError(
        "flash_cann: the twin backend runs the Ascend forward kernel only (there is no Ascend "
        "backward kernel yet); compute gradients with the cpu backend")
