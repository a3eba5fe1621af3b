"""The Triton backend on Ascend NPUs: the kernels of ``triton_kernels.py`` compiled by
triton-ascend (Huawei's Triton backend; its ``bishengir-compile`` maps each ``tl.dot``
to the cube unit and the softmax to the vector units of an AI core).

Every feature of the CUDA host (``cuda.py``) runs here too: windows, softcap, ALiBi,
dropout, attention sinks, packed sequences and KV caches (the decode kernel for GQA
groups). What
differs from it:
* a persistent grid: one program per AI core (PERSISTENT), each looping over its tiles,
  as the Ascend runtime schedules a program per core rather than per tile;
* no tensor descriptors (USE_TMA False) and no autotuner: the tiles come from
  :data:`TILES` (plain calls) and :data:`FEATURE_TILES` (calls with features, whose
  extra score-sized tiles need room in the vector units' memory), the largest that
  bishengir-compile's memory planner accepts;
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
from .arguments import cache_call, feature_arguments, packed_views, sink_arguments
from .buffers import empty

# (kernel, BLOCK_D, dtype) -> (BLOCK_M, BLOCK_N): per kernel, head_dim and dtype the
# largest tile (by area, then BLOCK_M; M and N powers of two from 16 to 128) whose
# heaviest variant (causal, padding mask) bishengir-compile plans for Ascend910B2 with
# no UB/L1/L0 overflow. Found by `python -m flash_cann.backends.triton.ascend_lowering --search` on
# 2026-11-23 with triton-ascend 3.2.0 and ascendnpu-ir 1.2.0 (bishengir-compile 1.2.0);
# tests/test_triton_npu.py lowers every variant with these for the 910B2, and a covering
# part of the grid for the 910B4 (whose planning limits differ only in core counts).
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
    # The decode kernel (KV caches with GQA), sized on a paged cache (its heaviest plain
    # variant) and capped at the forward's tile: `--search` 2026-11-25, float16.
    ("decode", 64, "float16"): (64, 128), ("decode", 64, "bfloat16"): (64, 128),
    ("decode", 128, "float16"): (64, 32), ("decode", 128, "bfloat16"): (64, 32),
    ("decode", 256, "float16"): (32, 32), ("decode", 256, "bfloat16"): (32, 32),
}
# The feature variants' tiles, per tile_class. UB (the vector units' memory: 1572864
# bits on the 910B) is what runs out: at the plain tiles bishengir-compile reports dQ
# (128 x 128, head_dim 64/128) needing 1896448 bits with ALiBi, 2121728 with a left
# window bound and 2380288 with softcap (a padding mask and causal on), and the forward
# (64 x 128, head_dim 64) 3832832 with dropout (Philox4x32-10's uint32 words are four
# more score-sized tiles, live through ten rounds). "scores": the largest tile (by
# area, then BLOCK_M; neither side larger than the plain tile) whose heaviest variant
# (causal, a left window bound, softcap, ALiBi, a padding mask) plans for Ascend910B2
# with no overflow, not even one bishengir-compile recovers from by turning code motion
# off: `python -m flash_cann.backends.triton.ascend_lowering --search --table scores`,
# 2026-11-25, same versions (float16; bfloat16 takes the same, as in TILES, and is
# lowered in CI). "cache": the same search (`--table cache`) for the forward and decode
# kernels over a paged KV cache with a left window bound, softcap, ALiBi and sinks.
# "dropout": 32 x 32 everywhere, not searched (each candidate costs
# bishengir-compile ~35 s of CPU with dropout): 32 x 64 overflows the forward at
# head_dim 64 with dropout alone (recovered without code motion only); 32 x 32 plans with
# every feature on (dropout, window, softcap, ALiBi, packed, sinks) for the forward,
# dK/dV and dQ at head_dim 128 (float16, both targets, CI) and at 64 and 256 (float16,
# Ascend910B2, by hand on 2026-11-25).
FEATURE_TILES = {
    "scores": {
        ("fwd", 64, "float16"): (64, 64), ("fwd", 64, "bfloat16"): (64, 64),
        ("fwd", 128, "float16"): (64, 64), ("fwd", 128, "bfloat16"): (64, 64),
        ("fwd", 256, "float16"): (32, 128), ("fwd", 256, "bfloat16"): (32, 128),
        ("dkdv", 64, "float16"): (128, 64), ("dkdv", 64, "bfloat16"): (128, 64),
        ("dkdv", 128, "float16"): (64, 64), ("dkdv", 128, "bfloat16"): (64, 64),
        ("dkdv", 256, "float16"): (32, 32), ("dkdv", 256, "bfloat16"): (32, 32),
        ("dq", 64, "float16"): (128, 32), ("dq", 64, "bfloat16"): (128, 32),
        ("dq", 128, "float16"): (32, 128), ("dq", 128, "bfloat16"): (32, 128),
        ("dq", 256, "float16"): (64, 32), ("dq", 256, "bfloat16"): (64, 32),
    },
    "cache": {
        ("fwd", 64, "float16"): (64, 64), ("fwd", 64, "bfloat16"): (64, 64),
        ("fwd", 128, "float16"): (64, 32), ("fwd", 128, "bfloat16"): (64, 32),
        ("fwd", 256, "float16"): (32, 64), ("fwd", 256, "bfloat16"): (32, 64),
        ("decode", 64, "float16"): (64, 64), ("decode", 64, "bfloat16"): (64, 64),
        ("decode", 128, "float16"): (64, 32), ("decode", 128, "bfloat16"): (64, 32),
        ("decode", 256, "float16"): (32, 32), ("decode", 256, "bfloat16"): (32, 32),
    },
    "dropout": {key: (32, 32) for key in TILES if key[0] != "decode"},
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


def tile_class(features: dict) -> str:
    """Which tile table serves a launch with these feature arguments
    (arguments.feature_arguments, arguments.cache_arguments): "dropout" (the Philox
    draw's uint32 words dominate the vector units' memory), "scores" (a left window
    bound, softcap or ALiBi: a few more score-sized tiles), "cache" (those over a KV
    cache, whose key rows are gathered through the block table or cut at each
    sequence's filled length), else "plain" (a right bound alone is the causal mask;
    packed sequences, sinks and a KV cache alone add only index arithmetic)."""
    if features.get("DROPOUT"):
        return "dropout"
    if features.get("LEFT_BOUNDED") or features.get("SOFTCAP") or features.get("ALIBI"):
        return "cache" if "SeqUsedK" in features else "scores"
    return "plain"


def tiles(kernel: str, head_dim: int, dtype: torch.dtype, features: dict) -> dict:
    """BLOCK_M and BLOCK_N of a launch."""
    table = tile_class(features)
    key = (kernel, block_d(head_dim), str(dtype).removeprefix("torch."))
    m, n = TILES[key] if table == "plain" else FEATURE_TILES[table][key]
    return {"BLOCK_M": m, "BLOCK_N": n}


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _mask_strides(mask):
    return mask.stride() if mask is not None else (0, 0)


def launch(step: Launch) -> None:
    """Run one launch (the stand-in NPU test replaces this with a lowering and a run in
    the interpreter)."""
    step.kernel[step.grid](*step.args, **step.constexprs)


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant: Variant = PLAIN):
    from . import kernels

    packed = layout == layouts.PACKED
    query, key, value = (_unit_last_stride(t) for t in (query, key, value))
    out = empty(query.shape, query.dtype, query.device)
    if packed:
        q, k, v, o = packed_views(query, key, value, out)
        batch = variant.cu_seqlens_q.shape[0] - 1
    else:
        q, k, v, o = (layouts.to_bnsd(t, layout) for t in (query, key, value, out))
        batch = q.shape[0]
    _, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    lse = empty((q.shape[0], heads_q, seqlen_q), torch.float32, query.device)
    features = feature_arguments(variant, causal)
    features.update(sink_arguments(variant))
    if packed:
        features.update(VARLEN=True, CuSeqQ=variant.cu_seqlens_q, CuSeqK=variant.cu_seqlens_k,
                        max_seqlen_q=variant.max_seqlen_q)
    launch(Launch("fwd", kernels.attn_fwd, (ai_cores(query.device),),
                  (q, k, v, o, lse, key_padding_mask, *q.stride(), *k.stride(), *v.stride(),
                   *o.stride(), *_mask_strides(key_padding_mask), batch, heads_q,
                   heads_q // heads_kv, seqlen_q, seqlen_k, scale * math.log2(math.e), 0, 0),
                  dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim),
                       HAS_MASK=key_padding_mask is not None, NEGATIVE_SCALE=scale < 0,
                       USE_TMA=False, PERSISTENT=True, **features,
                       **tiles("fwd", head_dim, query.dtype, features))))
    return out, (lse[0] if packed else lse)


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool = False,
             variant: Variant = PLAIN):
    del deterministic  # this backward is always deterministic (no atomic adds)
    from . import kernels

    packed = layout == layouts.PACKED
    grad_out, query, key, value, out = (_unit_last_stride(t)
                                        for t in (grad_out, query, key, value, out))
    device = query.device
    grads = tuple(empty(t.shape, t.dtype, device) for t in (query, key, value))
    tensors = (query, key, value, out, grad_out, *grads)
    lse = softmax_lse.contiguous()
    dlse = grad_softmax_lse.contiguous() if grad_softmax_lse is not None else None
    if packed:
        q, k, v, o, do, dq, dk, dv = packed_views(*tensors)
        batch = variant.cu_seqlens_q.shape[0] - 1
        lse = lse.unsqueeze(0)
        dlse = None if dlse is None else dlse.unsqueeze(0)
    else:
        q, k, v, o, do, dq, dk, dv = (layouts.to_bnsd(t, layout) for t in tensors)
        batch = q.shape[0]
    _, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1:3]
    cores = (ai_cores(device),)
    delta = empty((q.shape[0], heads_q, seqlen_q), torch.float32, device)
    inputs = (q, k, v, do, lse, delta, key_padding_mask)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    scalars = (*_mask_strides(key_padding_mask), batch, heads_q, heads_q // heads_kv, seqlen_q,
               seqlen_k, scale, scale * math.log2(math.e), 0, 0)
    features = feature_arguments(variant, causal)
    shared = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim),
                  HAS_MASK=key_padding_mask is not None, USE_TMA=False, PERSISTENT=True,
                  **features)
    varlen = dict(VARLEN=True, CuSeqQ=variant.cu_seqlens_q, CuSeqK=variant.cu_seqlens_k) \
        if packed else {}
    # The sinks' gradient: one partial sum per preprocess tile, added here in a fixed order.
    sinks = {}
    if variant.sinks is not None:
        parts = (q.shape[0], heads_q, math.ceil(seqlen_q / PREPROCESS_ROWS))
        sinks = dict(SINKS=True, Lse=lse, Sinks=variant.sinks.contiguous(),
                     DSinkParts=empty(parts, torch.float32, device))
    # Stages as on CUDA: D = rowsum(dO ∘ O) - dLSE (row by row: packed sequences need no
    # bounds); dK, dV per key block; dQ per query block.
    launch(Launch("preprocess", kernels.attn_bwd_preprocess, cores,
                  (o, do, dlse, delta, *o.stride(), *do.stride(), q.shape[0], heads_q, seqlen_q),
                  dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), HAS_DLSE=dlse is not None,
                       PERSISTENT=True, BLOCK_M=PREPROCESS_ROWS, **sinks)))
    launch(Launch("dkdv", kernels.attn_bwd_dkdv, cores,
                  (*inputs, dk, dv, *strides, *dk.stride(), *dv.stride(), *scalars),
                  dict(shared, **varlen, **({"max_seqlen_k": variant.max_seqlen_k} if packed
                                           else {}),
                       **tiles("dkdv", head_dim, query.dtype, features))))
    launch(Launch("dq", kernels.attn_bwd_dq, cores,
                  (*inputs, dq, *strides, *dq.stride(), *scalars),
                  dict(shared, **varlen, **({"max_seqlen_q": variant.max_seqlen_q} if packed
                                           else {}),
                       **tiles("dq", head_dim, query.dtype, features))))
    grad_sinks = sinks["DSinkParts"].sum((0, 2)) if sinks else None
    return (*grads, grad_sinks)


def kvcache_forward(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, *,
                    scale: float, causal: bool, layout: str = "BSND", cache_leftpad=None,
                    variant: Variant = PLAIN, num_splits: int = 0):
    """As the CUDA host's (cuda.kvcache_forward: the cache read in place, GQA groups packed
    into the decode kernel's tiles, TND queries, cache_leftpad), with persistent grids and
    the NPU tile table. num_splits is a hint this host does not take yet: it never splits
    the keys (the combine kernel is not among the variants test_triton_npu.py lowers)."""
    from . import kernels

    del num_splits

    query = _unit_last_stride(query)
    call = cache_call(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table,
                      scale=scale, causal=causal, variant=variant, layout=layout,
                      cache_leftpad=cache_leftpad)
    head_dim, features = query.shape[-1], call.features
    tensors, strides = call.tensors, call.strides
    sizes = (*call.sizes, 0, 0)
    common = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), PERSISTENT=True, **features)
    cores = (ai_cores(query.device),)
    if call.group > 1:
        launch(Launch("decode", kernels.attn_decode, cores, (*tensors, *strides, *sizes),
                      dict(common, **tiles("decode", head_dim, query.dtype, features))))
    else:
        launch(Launch("fwd", kernels.attn_fwd, cores, (*tensors, None, *strides, 0, 0, *sizes),
                      dict(common, HAS_MASK=False, NEGATIVE_SCALE=scale < 0, USE_TMA=False,
                           SEQUSED_K=True, **tiles("fwd", head_dim, query.dtype, features))))
    return call.out, call.lse
