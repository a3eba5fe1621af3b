"""Twin backend: the Ascend C forward kernel (op_kernel/) run on the CPU twin of the
Ascend C API (twin/), through the same op contract.

This is a verification tool, not a fast path: it executes the NPU kernel's exact
sequence of API calls -- data moves, cube fractals, vector instructions, cross-core
flags -- on simulated cores, checking the hardware's rules as it goes. Select it with
``flash_cann.use_backend("twin")``. The kernel is forward only; there is no Ascend
backward kernel yet.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .. import layout as layouts
from .. import native
from ..planner import DTYPES, LAYOUTS

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
        [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 3 + [ctypes.c_double]
        + [ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
    return lib


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            ai_cores: int | None = None):
    b, hq, sq, d = layouts.sizes(query, layout)
    hk, sk = layouts.sizes(key, layout)[1:3]
    q, k, v = (t.contiguous() for t in (query, key, value))  # the kernel reads dense layouts
    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    # Poisoned outputs: an element the kernel never writes shows up as NaN.
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32)
    error = ctypes.create_string_buffer(4096)
    status = _library().flash_cann_twin_forward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr() if mask is not None else None,
        out.data_ptr(), lse.data_ptr(), b, hq, hk, sq, sk, d,
        DTYPES[str(query.dtype).removeprefix("torch.")], LAYOUTS[layout], int(causal),
        float(scale), AI_CORES if ai_cores is None else ai_cores, error, len(error))
    if status != 0:
        raise TwinViolation(f"flash_cann twin: {error.value.decode()}")
    return out, lse


def backward(*args, **kwargs):
    raise NotImplementedError(
        "flash_cann: the twin backend runs the Ascend forward kernel only (there is no Ascend "
        "backward kernel yet); compute gradients with the cpu backend")
