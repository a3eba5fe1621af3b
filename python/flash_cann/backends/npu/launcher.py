"""NPU backend: torch.ops.flash_cann on Ascend NPUs, through the installed CANN package.

It needs three things, and imports none of them before it is asked to run
(``import flash_cann`` never imports torch_npu, so a missing or broken torch_npu cannot
break it):

1. torch_npu, importable, seeing an NPU;
2. flash-cann's NPU extension ``flash_cann_npu`` (``framework/``, built on the Ascend
   server): launcher ops that run the package's aclnn API through torch_npu's task queue;
3. the flash-cann CANN package (the ``.run``), whose ``libcust_opapi.so`` is found where
   torch_npu finds custom aclnn ops (:mod:`flash_cann.backends.npu.opp_paths`).

:func:`unavailable_reason` names the first one missing and how to install it; the kernels
raise it for NPU tensors. Outputs are allocated here, with torch_npu's caching allocator
on the current stream, and written by the kernels in place.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from ...contract import layout as layouts
from . import opp_paths
from .aclnn import NAMESPACE, launcher_schema
from ...contract.checks import accumulator_dtype
from ...contract.spec import load
from ...contract.variant import PLAIN, Variant, shared_alibi_slopes

EXTENSION = f"{NAMESPACE}._launcher"  # the library framework/setup.py builds
BUILD_HINT = ("build it on the Ascend server with `pip install --no-build-isolation "
              "./framework` from the flash-cann repository (docs/npu.md)")

_launchers = None  # torch.ops.flash_cann_npu, once loaded and checked against the spec


class _Missing(Exception):
    """Something the NPU backend needs is not here; the message says what to install."""


def _install_hint() -> str:
    return load().backends["npu"].install_hint


def _import_torch_npu():
    # import_module, not a look into sys.modules: it returns an imported torch_npu as is,
    # and turns a None entry (imports of torch_npu blocked) into ModuleNotFoundError.
    try:
        return importlib.import_module("torch_npu")
    except Exception as err:  # without CANN, torch_npu raises more than ImportError
        if isinstance(err, ModuleNotFoundError) and err.name == "torch_npu":
            raise _Missing(f"torch_npu is not installed: {_install_hint()}") from None
        raise _Missing(f"torch_npu does not import ({type(err).__name__}: {err}): "
                       f"{_install_hint()}") from err


def _load_extension():
    try:
        spec = importlib.util.find_spec(EXTENSION)
    except ImportError:
        spec = None
    if spec is None or spec.origin is None:
        raise _Missing(f"flash-cann's NPU extension ({EXTENSION}) is not installed: "
                       f"{BUILD_HINT}")
    try:
        torch.ops.load_library(spec.origin)
    except OSError as err:
        raise _Missing(f"flash-cann's NPU extension {spec.origin} does not load ({err}); "
                       f"rebuild it against this torch and torch_npu: {BUILD_HINT}") from err
    launchers = getattr(torch.ops, NAMESPACE)
    for op in load().cann_ops:
        expected = f"{NAMESPACE}::{launcher_schema(op)}"
        built = str(getattr(launchers, op.name).default._schema)
        if built != expected:
            raise _Missing(f"flash-cann's NPU extension {spec.origin} was built from another "
                           f"op spec ({built} != {expected}); {BUILD_HINT}")
    return launchers


def _load_op_package(launchers) -> None:
    found = opp_paths.candidates()
    if not found:
        raise _Missing(f"the flash-cann CANN package's libcust_opapi.so was not found "
                       f"({opp_paths.describe_search()}): {_install_hint()}")
    try:
        launchers.load_opapi(found)
    except RuntimeError as err:
        raise _Missing(f"{err}\n{_install_hint()}") from err


def _load():
    global _launchers
    if _launchers is None:
        torch_npu = _import_torch_npu()
        if not torch_npu.npu.is_available():
            raise _Missing("torch_npu sees no NPU (torch_npu.npu.is_available() is False)")
        launchers = _load_extension()
        _load_op_package(launchers)
        _launchers = launchers
    return _launchers


def unavailable_reason() -> str | None:
    """None if the NPU backend can run here, else what is missing and how to install it."""
    try:
        _load()
    except _Missing as missing:
        return str(missing)
    return None


def available() -> bool:
    return unavailable_reason() is None


def _launcher_ops():
    try:
        return _load()
    except _Missing as missing:
        raise RuntimeError(f"flash_cann: the NPU backend cannot run: {missing}") from None


def _empty(shape, dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=like.device)


def _features(variant: Variant) -> dict:
    """The CANN op's feature arguments, by their spec names, from the checked variant.

    The window bounds are the normalised ones (a causal call carries window_right -1).
    ALiBi slopes shared by every sequence reach the op as (heads_q,): the checks expand a
    (heads_q,) argument to (batch, heads_q) with batch stride 0 (with batch 1, torch keeps
    the row stride: one row is shared all the same), so row 0 is that argument (a view, no
    copy), and the kernel indexes by head only; real (batch, heads_q) slopes go as they
    are. Packed sequences (layout TND) pass cu_seqlens_q/k as tensors and max_seqlen_q/k
    as the caller gave them. Nothing here reads a device tensor on the host: the kernel
    reads cu_seqlens, the slopes, rng_state and the sink logits from GM."""
    slopes = variant.alibi_slopes
    if slopes is not None and shared_alibi_slopes(slopes) is not None:
        slopes = shared_alibi_slopes(slopes)
    return dict(cu_seqlens_q=variant.cu_seqlens_q, cu_seqlens_k=variant.cu_seqlens_k,
                max_seqlen_q=variant.max_seqlen_q, max_seqlen_k=variant.max_seqlen_k,
                alibi_slopes=slopes, rng_state=variant.rng_state, sinks=variant.sinks,
                window_left=variant.window_left, window_right=variant.window_right,
                softcap=float(variant.softcap), dropout_p=float(variant.dropout_p))


def _lse_shape(query, layout: str) -> tuple:
    """softmax_lse's shape: (batch, heads_q, seqlen_q), or (heads_q, tokens_q) for TND."""
    if layout == "TND":
        return query.shape[1], query.shape[0]
    batch, heads_q, seqlen_q, _ = layouts.sizes(query, layout)
    return batch, heads_q, seqlen_q


# The launchers are called with keywords, the spec's names: an argument the extension's
# schema (generated from the spec) does not have, or lacks, fails loudly, not shifted.
def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant: Variant = PLAIN):
    launchers = _launcher_ops()
    out = _empty(query.shape, query.dtype, query)
    lse = _empty(_lse_shape(query, layout), accumulator_dtype(query.dtype), query)
    launchers.fwd(query=query, key=key, value=value, key_padding_mask=key_padding_mask,
                  scale=scale, causal=causal, layout=layout, **_features(variant),
                  fp16_scores=variant.fp16_scores, out=out, softmax_lse=lse)
    return out, lse


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool,
             variant: Variant = PLAIN):
    if not load().backends["npu"].backward:
        raise NotImplementedError(
            "flash_cann: the spec says the Ascend package has no backward kernel "
            "(backends.npu.backward: false): the NPU backend runs the forward pass only")
    launchers = _launcher_ops()
    grad_query, grad_key, grad_value = (_empty(t.shape, t.dtype, t) for t in (query, key, value))
    # Always an output of the CANN op (fp32 (heads_q,), zeros without sinks); handed back
    # only with sinks, as the backend protocol says.
    grad_sinks = _empty((_lse_shape(query, layout)[-2],), torch.float32, query)
    launchers.bwd(grad_out=grad_out, query=query, key=key, value=value, out=out,
                  softmax_lse=softmax_lse, key_padding_mask=key_padding_mask,
                  grad_softmax_lse=grad_softmax_lse, scale=scale, causal=causal, layout=layout,
                  deterministic=deterministic, **_features(variant),
                  fp16_scores=variant.fp16_scores, grad_query=grad_query,
                  grad_key=grad_key, grad_value=grad_value, grad_sinks=grad_sinks)
    return grad_query, grad_key, grad_value, None if variant.sinks is None else grad_sinks


def kvcache_forward(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, *,
                    scale: float, causal: bool, layout: str = "BSND", cache_leftpad=None,
                    variant: Variant = PLAIN, num_splits: int = 0):
    """fwd_kvcache's decode kernel (FlashCannAttentionKVCache). The contract has appended
    the new keys and values already (contract.kvcache.append: device ops, with the capacity
    guard), so the CANN op gets key = value = None and cache_seqlens = seqlens_k, the keys
    each sequence attends to; block_table, cache_batch_idx, cache_leftpad and the lengths
    are read by the kernel in GM, never here. TND: vLLM's packed query rows, sequence b's
    from variant.cu_seqlens_q (read by the kernel), max_seqlen_q sizing the plan."""
    launchers = _launcher_ops()
    out = _empty(query.shape, query.dtype, query)
    lse = _empty(_lse_shape(query, layout), accumulator_dtype(query.dtype), query)
    features = _features(variant)
    # Not arguments of fwd_kvcache (its keys are the cache's; no dropout).
    for name in ("cu_seqlens_k", "max_seqlen_k", "rng_state", "dropout_p"):
        del features[name]
    launchers.fwd_kvcache(query=query, k_cache=k_cache, v_cache=v_cache, key=None, value=None,
                          cache_seqlens=seqlens_k, cache_batch_idx=cache_batch_idx,
                          block_table=block_table, cache_leftpad=cache_leftpad, scale=scale,
                          causal=causal, layout=layout, num_splits=num_splits, **features,
                          out=out, softmax_lse=lse)
    return out, lse
