"""The public API: flash-attn's functions, and a CANN-style ``attention``.

Both are thin: they resolve defaults, refuse what is not supported yet, take
zero-copy views, and call ``torch.ops.flash_cann.fwd`` -- whose kernel runs the shared
checks and the backend for the tensors' device, and whose autograd calls
``torch.ops.flash_cann.bwd``.

Causal masking with seqlen_q != seqlen_k is aligned to the bottom-right corner of the
attention matrix, as in flash-attn >= 2.1: query i sees key j iff
j <= i + seqlen_k - seqlen_q. With seqlen_q = 2, seqlen_k = 5 (1 = attend)::

    1 1 1 1 0
    1 1 1 1 1

and with seqlen_q = 5, seqlen_k = 2::

    0 0
    0 0
    0 0
    1 0
    1 1

A query row that sees no key (the first three rows above, or every key padded out)
returns output 0 and softmax_lse -inf, and gets zero gradients -- never NaN.
"""

from __future__ import annotations

import math
import numbers

import torch

from . import layout as layouts
from .checks import key_padding_mask_as_bool, require_tensor


def _not_supported(condition: bool, argument: str, value, supported: str) -> None:
    if condition:
        raise NotImplementedError(f"flash_cann: {argument}={value!r} is not supported yet "
                                  f"(supported: {supported})")


def _flag(value, name: str) -> bool:
    """A bool argument, taken strictly: "no" or None must not turn into True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"flash_cann: {name} must be a bool (got {type(value).__name__} "
                        f"{value!r})")
    return value


def _softmax_scale(scale, q: torch.Tensor, name: str) -> float:
    """1 / sqrt(head_dim) by default. An empty or 0-d q is left for the op's checks."""
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"flash_cann: {name} must be a real number or None (got "
                            f"{type(scale).__name__} {scale!r})")
        return float(scale)
    head_dim = q.shape[-1] if q.dim() else 0
    return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False):
    """dropout_p should be set to 0.0 during evaluation.
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with
    fewer heads than Q. Note that the number of heads in Q must be divisible by the
    number of heads in KV. For example, if Q has 6 heads and K, V have 2 heads, heads
    0, 1, 2 of Q attend to head 0 of K, V, and heads 3, 4, 5 of Q attend to head 1.

    If causal=True, the causal mask is aligned to the bottom right corner of the
    attention matrix (see the module docstring).

    Arguments:
        q: (batch_size, seqlen, nheads, headdim), float16 / bfloat16 (float32 on CPU)
        k: (batch_size, seqlen, nheads_k, headdim)
        v: (batch_size, seqlen, nheads_k, headdim)
        dropout_p: float. Dropout probability. Only 0.0 is supported yet.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for
            auto-regressive modeling).
        window_size: (left, right). Only (-1, -1) (no sliding window) is supported yet.
        softcap: float. Only 0.0 (no soft-capping) is supported yet.
        alibi_slopes: Only None is supported yet.
        deterministic: bool. Whether the backward pass must be bitwise repeatable. The
            CPU and Triton backends always are; on the NPU it selects the Grad kernel's
            deterministic dQ accumulation (per-core partials reduced in a fixed order)
            instead of the faster fp32 atomic adds.
        return_attn_probs: bool. Whether to also return the logsumexp (and, as
            flash-attn does when dropout_p == 0, None for the attention probabilities).
    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen),
            float32. The logsumexp of each row of the matrix QK^T * scaling.
        S_dmask [optional, if return_attn_probs=True]: None (flash-attn returns it only
            when dropout_p > 0).
    """
    _not_supported(dropout_p != 0.0, "dropout_p", dropout_p, "0.0")
    _not_supported(tuple(window_size) != (-1, -1), "window_size", window_size, "(-1, -1)")
    _not_supported(softcap != 0.0, "softcap", softcap, "0.0")
    _not_supported(alibi_slopes is not None, "alibi_slopes", "<tensor>", "None")
    q, k, v = (require_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    out, softmax_lse = torch.ops.flash_cann.fwd(
        q, k, v, None, scale=_softmax_scale(softmax_scale, q, "softmax_scale"),
        causal=_flag(causal, "causal"), layout="BSND",
        deterministic=_flag(deterministic, "deterministic"))
    return (out, softmax_lse, None) if _flag(return_attn_probs, "return_attn_probs") else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """As :func:`flash_attn_func`, with qkv: (batch_size, seqlen, 3, nheads, headdim)."""
    qkv = require_tensor(qkv, "qkv")
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"flash_cann: qkv must have shape (batch_size, seqlen, 3, nheads, "
                         f"headdim) (got {tuple(qkv.shape)})")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """As :func:`flash_attn_func`, with kv: (batch_size, seqlen_k, 2, nheads_k, headdim)."""
    kv = require_tensor(kv, "kv")
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"flash_cann: kv must have shape (batch_size, seqlen_k, 2, nheads_k, "
                         f"headdim) (got {tuple(kv.shape)})")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def attention(q, k, v, *, layout="BNSD", num_heads=None, causal=False, scale=None,
              key_padding_mask=None, return_lse=False, deterministic=False):
    """Attention for CANN-style callers.

    Arguments:
        q: (batch, heads_q, seqlen_q, head_dim) for layout "BNSD",
           (batch, seqlen_q, heads_q, head_dim) for "BSND",
           (batch, seqlen_q, heads_q * head_dim) for "BSH".
        k, v: the same layout with heads_kv heads and seqlen_k; heads_q must be a
           multiple of heads_kv (GQA/MQA). float16 / bfloat16 (float32 on CPU).
        layout: "BNSD", "BSND" or "BSH". BSH is a zero-copy view of BSND.
        num_heads: query heads; required for "BSH" (head_dim = hidden / num_heads,
           heads_kv = k's hidden / head_dim), optional elsewhere (checked if given).
        causal: bottom-right aligned causal mask (see the module docstring).
        scale: softmax scale; default 1 / sqrt(head_dim).
        key_padding_mask: optional bool or integer tensor of shape (batch, seqlen_k) or
           (seqlen_k,). **True / nonzero = ATTEND to that key**, False / 0 = padding.
           This is the flash-attn / InfiniOp polarity, the OPPOSITE of
           torch_npu.npu_fusion_attention's atten_mask (where 1 = masked out).
           Rows with no visible key return 0 (and lse -inf), never NaN.
        return_lse: also return softmax_lse.
        deterministic: a bitwise repeatable backward pass (as in :func:`flash_attn_func`).
    Return:
        out: same shape and layout as q.
        softmax_lse [if return_lse]: (batch, heads_q, seqlen_q), float32.
    """
    q, k, v = (require_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if layout not in (*layouts.LAYOUTS, "BSH"):
        raise ValueError(f"flash_cann: layout must be one of {', '.join(layouts.LAYOUTS)}, BSH "
                         f"(got {layout!r})")
    if layout == "BSH":
        if num_heads is None or int(num_heads) < 1:
            raise ValueError(f"flash_cann: num_heads (a positive int) is required for layout "
                             f"'BSH' (got {num_heads!r})")
        if q.dim() != 3 or q.shape[-1] % int(num_heads):
            raise ValueError(f"flash_cann: q must be (batch, seqlen_q, num_heads * head_dim) "
                             f"with num_heads={num_heads} for layout 'BSH' "
                             f"(got shape {tuple(q.shape)})")
        head_dim = q.shape[-1] // int(num_heads)
        q, k, v = (layouts.bsh_to_bsnd(t, head_dim, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
        op_layout = "BSND"
    else:
        op_layout = layout
    if q.dim() == 4 and k.dim() == 4:
        batch, heads_q = layouts.sizes(q, op_layout)[:2]
        if num_heads is not None and layout != "BSH" and num_heads != heads_q:
            raise ValueError(f"flash_cann: num_heads={num_heads} does not match q's "
                             f"{heads_q} heads in layout {layout}")
        key_padding_mask = key_padding_mask_as_bool(
            key_padding_mask, batch, layouts.sizes(k, op_layout)[2], q.device)
    out, lse = torch.ops.flash_cann.fwd(
        q, k, v, key_padding_mask, scale=_softmax_scale(scale, q, "scale"),
        causal=_flag(causal, "causal"), layout=op_layout,
        deterministic=_flag(deterministic, "deterministic"))
    if layout == "BSH":
        out = out.flatten(-2)
    return (out, lse) if _flag(return_lse, "return_lse") else out
