"""Argument checks of the op contract, shared by every backend.

Each op kernel (and each fake kernel, so ``torch.compile`` reports the same errors at
trace time) calls :func:`check_fwd` / :func:`check_bwd` before computing anything.
Messages name the argument, the rule and what was received. Non-contiguous inputs are
accepted by the contract: every backend reads strided tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import layout as layouts
from .spec import BackendSpec, load


@dataclass(frozen=True)
class Problem:
    """The sizes of one attention call, as the checks established them."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: torch.dtype
    layout: str
    causal: bool
    has_mask: bool

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 = MHA, heads_q = MQA)."""
        return self.heads_q // self.heads_kv


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The spec's "accumulator" dtype: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _prefix(msg: str) -> str:
    return f"flash_cann: {msg}"


def require_tensor(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(_prefix(f"{name} must be a torch.Tensor (got {type(t).__name__})"))
    return t


def _same_device(tensors: dict[str, torch.Tensor], ref: str) -> None:
    device = tensors[ref].device
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(_prefix(f"{name} must be on the same device as {ref} "
                                     f"(got {t.device} and {device})"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_dtype(query: torch.Tensor, backend: BackendSpec | None) -> None:
    name = _dtype_name(query.dtype)
    if backend is not None and name not in backend.dtypes:
        raise TypeError(_prefix(
            f"query dtype {name} is not supported on device type '{backend.device_type}' "
            f"(backend '{backend.name}' supports {', '.join(backend.dtypes)})"))
    if backend is None and not query.is_floating_point():
        raise TypeError(_prefix(f"query must be a floating-point tensor (got {name})"))


def check_fwd(query, key, value, key_padding_mask, scale: float, causal: bool, layout: str,
              backend: BackendSpec | None = None) -> Problem:
    """Validate the forward op's arguments; return the problem sizes."""
    spec = load()
    tensors = {n: require_tensor(t, n) for n, t in
               (("query", query), ("key", key), ("value", value))}
    if key_padding_mask is not None:
        tensors["key_padding_mask"] = require_tensor(key_padding_mask, "key_padding_mask")
    if layout not in spec.layouts:
        raise ValueError(_prefix(f"layout must be one of {', '.join(spec.layouts)} "
                                 f"(got {layout!r})"))
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(_prefix(f"softmax scale must be a finite number (got {scale!r})"))
    _same_device(tensors, "query")
    for name in ("key", "value"):
        if tensors[name].dtype != query.dtype:
            raise TypeError(_prefix(f"query, key and value must have the same dtype "
                                    f"(got query {_dtype_name(query.dtype)}, "
                                    f"{name} {_dtype_name(tensors[name].dtype)})"))
    _check_dtype(query, backend)
    dims = ", ".join(spec.layouts[layout])
    for name in ("query", "key", "value"):
        t = tensors[name]
        if t.dim() != 4:
            raise ValueError(_prefix(f"{name} must be 4-D ({dims}) for layout {layout} "
                                     f"(got {t.dim()}-D shape {tuple(t.shape)})"))
        if t.numel() == 0:
            raise ValueError(_prefix(f"{name} must not be empty (got shape {tuple(t.shape)})"))
    b, hq, sq, d = layouts.sizes(query, layout)
    bk, hk, sk, dk = layouts.sizes(key, layout)
    bv, hv, sv, dv = layouts.sizes(value, layout)
    if not (b == bk == bv):
        raise ValueError(_prefix(f"query, key and value must have the same batch size "
                                 f"(got {b}, {bk}, {bv})"))
    if dk != d or dv != d:
        raise ValueError(_prefix(f"query, key and value must have the same head_dim "
                                 f"(got {d}, {dk}, {dv})"))
    if not spec.head_dim_min <= d <= spec.head_dim_max:
        raise ValueError(_prefix(f"head_dim must be in [{spec.head_dim_min}, "
                                 f"{spec.head_dim_max}] (got {d})"))
    if sv != sk:
        raise ValueError(_prefix(f"key and value must have the same seqlen (got {sk} and {sv})"))
    if hv != hk:
        raise ValueError(_prefix(f"key and value must have the same number of heads "
                                 f"(got {hk} and {hv})"))
    if hq % hk:
        raise ValueError(_prefix(f"query heads ({hq}) must be a multiple of key/value heads "
                                 f"({hk}) for GQA/MQA"))
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(_prefix(f"key_padding_mask must be torch.bool here (got "
                                    f"{_dtype_name(key_padding_mask.dtype)}); the public API "
                                    f"converts integer masks"))
        if tuple(key_padding_mask.shape) != (b, sk):
            raise ValueError(_prefix(f"key_padding_mask must have shape (batch, seqlen_k) = "
                                     f"{(b, sk)} (got {tuple(key_padding_mask.shape)})"))
    return Problem(b, hq, hk, sq, sk, d, query.dtype, layout, bool(causal),
                   key_padding_mask is not None)


def check_bwd(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
              grad_softmax_lse, scale: float, causal: bool, layout: str,
              backend: BackendSpec | None = None) -> Problem:
    """Validate the backward op's arguments; return the problem sizes."""
    p = check_fwd(query, key, value, key_padding_mask, scale, causal, layout, backend)
    extra = {n: require_tensor(t, n) for n, t in
             (("grad_out", grad_out), ("out", out), ("softmax_lse", softmax_lse))}
    if grad_softmax_lse is not None:
        extra["grad_softmax_lse"] = require_tensor(grad_softmax_lse, "grad_softmax_lse")
    _same_device({"query": query, **extra}, "query")
    for name in ("grad_out", "out"):
        t = extra[name]
        if t.shape != query.shape or t.dtype != query.dtype:
            raise ValueError(_prefix(
                f"{name} must match query in shape and dtype (got {tuple(t.shape)} "
                f"{_dtype_name(t.dtype)}, query {tuple(query.shape)} "
                f"{_dtype_name(query.dtype)})"))
    lse_shape = (p.batch, p.heads_q, p.seqlen_q)
    lse_dtype = accumulator_dtype(query.dtype)
    for name in ("softmax_lse", "grad_softmax_lse"):
        t = extra.get(name)
        if t is not None and (tuple(t.shape) != lse_shape or t.dtype != lse_dtype):
            raise ValueError(_prefix(
                f"{name} must be {_dtype_name(lse_dtype)} of shape (batch, heads_q, seqlen_q) "
                f"= {lse_shape} (got {_dtype_name(t.dtype)} {tuple(t.shape)})"))
    return p


def key_padding_mask_as_bool(mask, batch: int, seqlen_k: int,
                             device: torch.device) -> torch.Tensor | None:
    """The public API's mask normalisation: bool/integer, (batch, seqlen_k) or (seqlen_k,)
    -> torch.bool (batch, seqlen_k), True (nonzero) = attend."""
    if mask is None:
        return None
    mask = require_tensor(mask, "key_padding_mask")
    if mask.dtype != torch.bool and (mask.is_floating_point() or mask.is_complex()):
        raise TypeError(_prefix(f"key_padding_mask must be a bool or integer tensor "
                                f"(True/nonzero = attend); got {_dtype_name(mask.dtype)}"))
    if mask.device != device:
        raise ValueError(_prefix(f"key_padding_mask must be on the same device as query "
                                 f"(got {mask.device} and {device})"))
    if tuple(mask.shape) == (seqlen_k,):
        mask = mask.unsqueeze(0).expand(batch, seqlen_k)
    elif tuple(mask.shape) != (batch, seqlen_k):
        raise ValueError(_prefix(f"key_padding_mask must have shape (batch, seqlen_k) = "
                                 f"{(batch, seqlen_k)} or (seqlen_k,) = ({seqlen_k},) "
                                 f"(got {tuple(mask.shape)})"))
    return mask if mask.dtype == torch.bool else mask != 0
