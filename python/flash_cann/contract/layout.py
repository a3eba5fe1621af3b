"""Tensor layouts of the op contract.

The op takes ``BNSD`` (batch, heads, seqlen, head_dim) or ``BSND`` (batch, seqlen,
heads, head_dim) tensors, or ``TND`` (tokens, heads, head_dim): sequences of different
lengths packed one after another, delimited by cu_seqlens (flash-attn's varlen). Backends that compute on a strided view use
:func:`to_bnsd`, which is a zero-copy permute; ``BSH`` is handled by the Python API
as a view of ``BSND`` (see :func:`bsh_to_bsnd`).
"""

from __future__ import annotations

import torch

from .spec import load

# Position of (batch, heads, seqlen, head_dim) in each batched (4-D) layout of the spec.
_AXES = {name: tuple(dims.index(axis) for axis in ("batch", "heads", "seqlen", "head_dim"))
         for name, dims in load().layouts.items() if "batch" in dims}
BATCHED = tuple(_AXES)
LAYOUTS = tuple(load().layouts)
PACKED = "TND"  # (tokens, heads, head_dim); not a view of a batched layout


def sizes(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(batch, heads, seqlen, head_dim) of a 4-D tensor in ``layout``."""
    return tuple(t.shape[a] for a in _AXES[layout])  # type: ignore[return-value]


def to_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (batch, heads, seqlen, head_dim) view of ``t``; never copies."""
    return t.permute(*_AXES[layout])


def from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The inverse of :func:`to_bnsd`: a ``layout`` view of a BNSD tensor."""
    axes = _AXES[layout]
    return t.permute(*sorted(range(4), key=axes.__getitem__))


def bsh_to_bsnd(t: torch.Tensor, head_dim: int, name: str) -> torch.Tensor:
    """View a (batch, seqlen, heads*head_dim) tensor as (batch, seqlen, heads, head_dim)."""
    if t.dim() != 3:
        raise ValueError(f"flash_cann: {name} must be 3-D (batch, seqlen, hidden) for layout "
                         f"'BSH' (got shape {tuple(t.shape)})")
    if t.shape[-1] % head_dim:
        raise ValueError(f"flash_cann: {name} hidden size must be a multiple of head_dim "
                         f"{head_dim} for layout 'BSH' (got {t.shape[-1]})")
    return t.unflatten(-1, (t.shape[-1] // head_dim, head_dim))
