"""The Triton backend on Ascend NPUs: the kernels of ``triton_kernels.py`` compiled by
triton-ascend (Huawei's Triton backend; its ``bishengir-compile`` maps each ``tl.dot``
to the cube unit and the softmax to the vector units of an AI core).

What differs from the CUDA host (``triton.py``):
* a persistent grid: one program per AI core (PERSISTENT), each looping over its tiles,
  as the Ascend runtime schedules a program per core rather than per tile;
* no tensor descriptors (USE_TMA False) and no autotuner: the tiles come from
  :data:`TILES`, the largest that bishengir-compile's memory planner accepts;
* inputs whose head_dim stride is not 1 are copied first, so every launch is one of the
  variants the compile check lowers (``flash_cann.backends.triton.ascend_lowering``).

Imported only for NPU tensors, in an environment where ``triton`` is triton-ascend.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import sys

import torch

from ...contract import layout as layouts
from ...contract.variant import PLAIN, Variant
from .buffers import empty

# (kernel, BLOCK_D, dtype) -> (BLOCK_M, BLOCK_N): per kernel, head_dim and dtype the
# largest tile (by area, then BLOCK_M; M and N powers of two from 16 to 128) whose
# heaviest variant (causal, padding mask) bishengir-compile plans for Ascend910B2 with
# no UB/L1/L0 overflow. Found by `python -m flash_cann.backends.triton.ascend_lowering --search` on
# 2026-11-23 with triton-ascend 3.2.0 and ascendnpu-ir 1.2.0 (bishengir-compile 1.2.0);
# tests/test_triton_npu.py lowers every variant with these for the 910B2 and the 910B4.
TILES = {
    ("fwd", 64, "float16"): (64, 128), ("fwd", 64, "bfloat16"): (64, 128),
    ("fwd", 128, "float16"): (64, 64), ("fwd", 128, "bfloat16"): (64, 64),
    ("fwd", 256, "float16"): (32, 128), ("fwd", 256, "bfloat16"): (32, 128),
    ("dkdv", 64, "float16"): (128, 128), ("dkdv", 64, "bfloat16"): (128, 128),
    ("dkdv", 128, "float16"): (64, 64), ("dkdv", 128, "bfloat16"): (64, 64),
    ("dkdv", 256, "float16"): (32, 32), ("dkdv", 256, "bfloat16"): (32, 32),
    ("dq", 64, "float16"): (128, 128), ("dq", 64, "bfloat16"): (128, 128),
    ("dq", 128, "float16"): (128, 128), ("dq", 128, "bfloat16"): (128, 128),
    ("dq", 256, "float16"): (64, 64), ("dq", 256, "bfloat16"): (64, 64),
}
# Rows of the preprocess tile (D = rowsum(dO ∘ O), vector units only; the compile check
# lowers it for every head_dim).
PREPROCESS_ROWS = 64
INSTALL_HINT = ("pip install triton-ascend==3.2.0, in an environment without upstream triton "
                "(both own the `triton` package), with CANN and torch_npu (docs/npu.md)")
BLOCK_DS = (64, 128, 256)  # head_dim is padded to one of these (smaller ones to 64)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: what ``kernel[grid](*args, **constexprs)`` runs."""
    name: str
    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict


def _triton_ascend_missing() -> str | None:
    try:
        found = importlib.util.find_spec("triton.backends.ascend") is not None
    except ImportError:
        found = False
    if not found:
        return ("triton-ascend is not installed (the `triton` here is not Huawei's Ascend "
                f"backend): {INSTALL_HINT}")
    return None


def unavailable_reason() -> str | None:
    """None if Triton can run on an NPU here, else what is missing."""
    missing = _triton_ascend_missing()
    if missing:
        return missing
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is None or not torch_npu.npu.is_available():
        return "torch_npu is not imported or sees no NPU"
    return None


def available() -> bool:
    return unavailable_reason() is None


@functools.lru_cache(maxsize=None)
def ai_cores(device: torch.device) -> int:
    """AI cores (cube units, each with two vector units) of the NPU: the grid size."""
    import triton

    index = device.index if device.index is not None else 0
    return triton.runtime.driver.active.utils.get_device_properties(index)["num_aicore"]


def block_d(head_dim: int) -> int:
    return next(d for d in BLOCK_DS if d >= head_dim)


def tiles(kernel: str, head_dim: int, dtype: torch.dtype) -> dict:
    m, n = TILES[(kernel, block_d(head_dim), str(dtype).removeprefix("torch."))]
    return {"BLOCK_M": m, "BLOCK_N": n}


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _mask_strides(mask):
    return mask.stride() if mask is not None else (0, 0)


def launch(step: Launch) -> None:
    """Run one launch (the stand-in NPU test replaces this with a lowering and a run in
    the interpreter)."""
    step.kernel[step.grid](*step.args, **step.constexprs)


def _plain_only(variant: Variant) -> None:
    """The spec gives this host no feature (backends.triton.also_on_features), so the
    checks refuse them before a call gets here; a caller that bypasses the checks gets
    the same refusal, not a plain result."""
    if not variant.plain:
        raise NotImplementedError("flash_cann: the triton backend on NPUs (triton-ascend) "
                                  "runs plain attention only so far: no window, softcap, "
                                  "ALiBi, dropout, sinks or packed sequences")


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant: Variant = PLAIN):
    from . import kernels

    _plain_only(variant)
    query, key, value = (_unit_last_stride(t) for t in (query, key, value))
    q, k, v = (layouts.to_bnsd(t, layout) for t in (query, key, value))
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    out = empty(query.shape, query.dtype, query.device)
    lse = empty((batch, heads_q, seqlen_q), torch.float32, query.device)
    o = layouts.to_bnsd(out, layout)
    launch(Launch("fwd", kernels.attn_fwd, (ai_cores(query.device),),
                  (q, k, v, o, lse, key_padding_mask, *q.stride(), *k.stride(), *v.stride(),
                   *o.stride(), *_mask_strides(key_padding_mask), batch, heads_q,
                   heads_q // heads_kv, seqlen_q, seqlen_k, scale * math.log2(math.e), 0, 0),
                  dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), CAUSAL=causal,
                       HAS_MASK=key_padding_mask is not None, NEGATIVE_SCALE=scale < 0,
                       USE_TMA=False, PERSISTENT=True, **tiles("fwd", head_dim, query.dtype))))
    return out, lse


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool = False,
             variant: Variant = PLAIN):
    del deterministic  # this backward is always deterministic (no atomic adds)
    from . import kernels

    _plain_only(variant)
    grad_out, query, key, value, out = (_unit_last_stride(t)
                                        for t in (grad_out, query, key, value, out))
    q, k, v, o, do = (layouts.to_bnsd(t, layout) for t in (query, key, value, out, grad_out))
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    device = query.device
    cores = (ai_cores(device),)
    delta = empty((batch, heads_q, seqlen_q), torch.float32, device)
    grads = tuple(empty(t.shape, t.dtype, device) for t in (query, key, value))
    dq, dk, dv = (layouts.to_bnsd(t, layout) for t in grads)
    lse = softmax_lse.contiguous()
    dlse = grad_softmax_lse.contiguous() if grad_softmax_lse is not None else None
    inputs = (q, k, v, do, lse, delta, key_padding_mask)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    scalars = (*_mask_strides(key_padding_mask), batch, heads_q, heads_q // heads_kv, seqlen_q,
               seqlen_k, scale, scale * math.log2(math.e), 0, 0)
    shared = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), CAUSAL=causal,
                  HAS_MASK=key_padding_mask is not None, USE_TMA=False, PERSISTENT=True)
    # Stages as on CUDA: D = rowsum(dO ∘ O) - dLSE; dK, dV per key block; dQ per query block.
    launch(Launch("preprocess", kernels.attn_bwd_preprocess, cores,
                  (o, do, dlse, delta, *o.stride(), *do.stride(), batch, heads_q, seqlen_q),
                  dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), HAS_DLSE=dlse is not None,
                       PERSISTENT=True, BLOCK_M=PREPROCESS_ROWS)))
    launch(Launch("dkdv", kernels.attn_bwd_dkdv, cores,
                  (*inputs, dk, dv, *strides, *dk.stride(), *dv.stride(), *scalars),
                  dict(shared, **tiles("dkdv", head_dim, query.dtype))))
    launch(Launch("dq", kernels.attn_bwd_dq, cores,
                  (*inputs, dq, *strides, *dq.stride(), *scalars),
                  dict(shared, **tiles("dq", head_dim, query.dtype))))
    return (*grads, None)  # grad_sinks: plain attention only here
