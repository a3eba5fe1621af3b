"""flash-attn 2.8's private entry points, which ring-flash-attn, yunchang and other
context-parallel libraries call block by block: ``_flash_attn_forward``,
``_flash_attn_backward``, ``_flash_attn_varlen_forward``, ``_flash_attn_varlen_backward``.

Same names, parameters (names, order, defaults) and returns as
``flash_attn/flash_attn_interface.py`` of flash-attn 2.8 (libraries fill them by name
with ``inspect``), on ``torch.ops.flash_cann.fwd`` / ``.bwd``; the ``flash_attn`` alias
(``flash_cann.install_as_flash_attn()``) serves them as
``flash_attn.flash_attn_interface._flash_attn_*``.

- The forwards return ``(out, softmax_lse, S_dmask, rng_state)``: lse (batch, nheads,
  seqlen_q) fp32, or (nheads, total_q) for varlen; S_dmask an empty tensor unless
  ``return_softmax`` with dropout (then the probabilities, negated where dropped, as
  flash_attn_func's); rng_state the (seed, offset) int64 pair of the dropout mask
  (zeros without dropout), which the backward takes back.
- The backwards write dQ, dK, dV INTO the given ``dq``, ``dk``, ``dv`` (as flash-attn's
  kernels do; None: not returned) and return ``softmax_d`` = rowsum(dout * out) in fp32,
  flash-attn's shape: (batch, nheads, seqlen_q rounded up to 128), or (nheads, total_q +
  128 * batch) for varlen, zero in the padding.
- Neither is differentiable (flash-attn's are custom ops without autograd): they run
  under no_grad.
Unlike flash-attn's, inputs need not be contiguous, and ``softcap=None`` (which
yunchang passes) means 0.
"""

from __future__ import annotations

from typing import Optional

import torch

from .interface import _dropout_probs, _flag, _real, _rng_state, _softmax_scale

_ROUND = 128  # flash-attn pads softmax_d's rows to its kernels' block of 128

# flash-attn's ROCm switch, which its tests import beside _get_block_size_n
# (flash_attn_s_dmask): flash_cann's kernels are not flash-attn's Triton-on-ROCm ones.
USE_TRITON_ROCM = False


def _options(q, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
             softcap) -> dict:
    return dict(scale=_softmax_scale(softmax_scale, q, "softmax_scale"),
                causal=_flag(causal, "causal"),
                window_left=-1 if window_size_left is None else int(window_size_left),
                window_right=-1 if window_size_right is None else int(window_size_right),
                softcap=0.0 if softcap is None else _real(softcap, "softcap"),
                dropout_p=_real(dropout_p, "dropout_p"))


@torch.no_grad()
def _forward(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             alibi_slopes, return_softmax, options):
    dropout_p = options["dropout_p"]
    rng_state = _rng_state(dropout_p, q.device, None) if 0.0 < dropout_p < 1.0 else None
    out, lse = torch.ops.flash_cann.fwd(
        q, k, v, None, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        alibi_slopes=alibi_slopes, rng_state=rng_state, layout=layout,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **options)
    if _flag(return_softmax, "return_softmax") and rng_state is not None:
        s_dmask = _dropout_probs(q, k, v, None, rng_state, cu_seqlens_q, cu_seqlens_k,
                                 alibi_slopes, None, layout=layout, max_seqlen_q=max_seqlen_q,
                                 max_seqlen_k=max_seqlen_k, **options)
    else:
        s_dmask = torch.empty((0,), dtype=q.dtype, device=q.device)
    if rng_state is None:
        rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    return out, lse, s_dmask, rng_state


@torch.no_grad()
def _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, layout, cu_seqlens_q,
              cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, deterministic,
              rng_state, options):
    dropout = 0.0 < options["dropout_p"] < 1.0
    grads = torch.ops.flash_cann.bwd(
        dout, q, k, v, out, softmax_lse, None, None, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, alibi_slopes=alibi_slopes,
        rng_state=rng_state if dropout else None, layout=layout,
        deterministic=_flag(deterministic, "deterministic"), max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, **options)
    for given, grad in zip((dq, dk, dv), grads):
        if given is not None:
            given.copy_(grad)
    rows = (dout.float() * out.float()).sum(-1)  # BSND: (b, s, h); TND: (t, h)
    if layout == "TND":
        batch = cu_seqlens_q.shape[0] - 1
        d = rows.new_zeros(rows.shape[1], rows.shape[0] + _ROUND * batch)
        d[:, :rows.shape[0]] = rows.t()
        return d
    seqlen = rows.shape[1]
    d = rows.new_zeros(rows.shape[0], rows.shape[2], -(-seqlen // _ROUND) * _ROUND)
    d[..., :seqlen] = rows.transpose(1, 2)
    return d


def _flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[torch.Tensor],
    return_softmax: bool,
):
    """q (batch, seqlen_q, nheads, headdim), k, v (batch, seqlen_k, nheads_k, headdim).
    Returns (out, softmax_lse, S_dmask, rng_state); see the module docstring."""
    return _forward(q, k, v, "BSND", None, None, 0, 0, alibi_slopes, return_softmax,
                    _options(q, dropout_p, softmax_scale, causal, window_size_left,
                             window_size_right, softcap))


def _flash_attn_varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_softmax: bool = False,
    block_table: Optional[torch.Tensor] = None,
    leftpad_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
):
    """q (total_q, nheads, headdim), k, v (total_k, nheads_k, headdim), packed as
    flash_attn_varlen_func's. Returns (out, softmax_lse, S_dmask, rng_state).
    block_table, leftpad_k, seqused_k (paged caches) are not supported here: None."""
    for name, value in (("block_table", block_table), ("leftpad_k", leftpad_k),
                        ("seqused_k", seqused_k)):
        if value is not None:
            raise NotImplementedError(f"flash_cann: _flash_attn_varlen_forward does not take "
                                      f"{name} yet (paged caches: flash_attn_with_kvcache); "
                                      f"pass None")
    return _forward(q, k, v, "TND", cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                    int(max_seqlen_k), alibi_slopes, return_softmax,
                    _options(q, dropout_p, softmax_scale, causal, window_size_left,
                             window_size_right, softcap))


def _flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor],
    dk: Optional[torch.Tensor],
    dv: Optional[torch.Tensor],
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[torch.Tensor],
    deterministic: bool,
    rng_state: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Writes the gradients into dq, dk, dv; returns softmax_d (module docstring)."""
    return _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, "BSND", None, None, 0, 0,
                     alibi_slopes, deterministic, rng_state,
                     _options(q, dropout_p, softmax_scale, causal, window_size_left,
                              window_size_right, softcap))


def _flash_attn_varlen_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor],
    dk: Optional[torch.Tensor],
    dv: Optional[torch.Tensor],
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[torch.Tensor],
    deterministic: bool,
    rng_state: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The varlen backward: writes dq, dk, dv; returns softmax_d (module docstring)."""
    return _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, "TND", cu_seqlens_q,
                     cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), alibi_slopes,
                     deterministic, rng_state,
                     _options(q, dropout_p, softmax_scale, causal, window_size_left,
                              window_size_right, softcap))
