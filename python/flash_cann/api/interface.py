"""The public API: flash-attn 2.8's functions (dense, packed, variable-length, KV cache),
and a CANN-style ``attention``.

All are thin: they resolve defaults, draw the dropout seed, take zero-copy views, and
call ``torch.ops.flash_cann.fwd`` (or ``.fwd_kvcache``) -- whose kernel runs the
shared checks and the backend for the tensors' device, and whose autograd calls
``torch.ops.flash_cann.bwd``. A plain call in eager mode takes a shortcut to the same
kernel functions (flash_cann.contract.eager: no dispatcher, same results). What each feature computes: flash_cann.contract.variant; which
backend has which feature: the spec (a backend without one names itself and the
argument in its error).

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
returns output 0 and softmax_lse -inf (the head's sink logit with ``sinks``), and gets
zero gradients -- never NaN.
"""

from __future__ import annotations

import math
import numbers
import sys

import torch

from ..contract import capture, eager
from ..contract import layout as layouts
from ..contract.checks import (check_fp16_scores, key_padding_mask_as_bool, reads_values,
                               require_tensor)
from ..contract.variant import Variant, keep_mask, window_bounds
from . import flash_attn_s_dmask, rotary


def _is_numpy_bool(value) -> bool:
    # A numpy bool exists only once numpy is imported, so flash_cann never imports it.
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


def _flag(value, name: str) -> bool:
    """A bool argument, taken as flash-attn takes it (its C++ binding converts to bool):
    bool, numpy.bool_, or the int 0 or 1. Anything else is refused: "no", None, 0.5 or 2
    must not silently turn into True or False."""
    if isinstance(value, bool) or _is_numpy_bool(value) or (
            isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"flash_cann: {name} must be a bool (or 0 / 1) (got "
                    f"{type(value).__name__} {value!r})")


def _softmax_scale(scale, q: torch.Tensor, name: str) -> float:
    """1 / sqrt(head_dim) by default. An empty or 0-d q is left for the op's checks."""
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"flash_cann: {name} must be a real number or None (got "
                            f"{type(scale).__name__} {scale!r})")
        return float(scale)
    head_dim = q.shape[-1] if q.dim() else 0
    return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0


def _window(window_size) -> tuple[int, int]:
    """(left, right) from any pair of ints, as flash-attn takes it: a tuple, a list, a
    numpy array, or a tensor of 2 ints (on any device: reading a device tensor is a host
    read, which waits for the device). The bounds' meaning: contract.variant.window_bounds."""
    if isinstance(window_size, torch.Tensor) and not (
            window_size.is_floating_point() or window_size.is_complex()
            or window_size.dtype == torch.bool):
        capture.refuse_host_read(window_size.device,
                                 f"window_size (a tensor on {window_size.device.type})",
                                 "pass the window as a pair of Python ints")
        window_size = window_size.tolist()
    try:
        left, right = window_size
    except (TypeError, ValueError):
        left = right = None
    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
               for x in (left, right)):
        raise TypeError(f"flash_cann: window_size must be a pair of ints (left, right), -1 = "
                        f"unbounded (got {window_size!r})")
    return int(left), int(right)


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"flash_cann: {name} must be a real number (got "
                        f"{type(value).__name__} {value!r})")
    return float(value)


def _rng_state(dropout_p: float, device: torch.device, generator) -> torch.Tensor | None:
    """The (seed, offset) of a dropout call's Philox mask, drawn from ``generator`` (default:
    the device's default generator, so torch.manual_seed makes runs repeatable) on the
    query's device: no host round trip, and the backward reuses it."""
    if dropout_p == 0.0:
        return None
    seed = torch.randint(-2**63, 2**63 - 1, (1,), dtype=torch.int64, device=device,
                         generator=generator)
    return torch.cat((seed, torch.zeros_like(seed)))


def _attention(q, k, v, key_padding_mask, *, layout, softmax_scale, causal, window_size=(-1, -1),
               softcap=0.0, alibi_slopes=None, dropout_p=0.0, deterministic=False,
               generator=None, return_probs=False, cu_seqlens_q=None, cu_seqlens_k=None,
               max_seqlen_q=0, max_seqlen_k=0, sinks=None, fp16_scores=False,
               s_dmask="probabilities", scale_name="softmax_scale"):
    """Every public function's one call of torch.ops.flash_cann.fwd: (out, lse, S_dmask).

    S_dmask (``return_probs`` with dropout): a debug output that materialises
    (batch, heads_q, seqlen_q, seqlen_k) -- for TND max_seqlen_q x max_seqlen_k, zero
    outside each sequence -- holding the softmax probabilities, negated where dropout
    dropped them (test with torch.signbit), as flash-attn's S_dmask marks them; with
    ``s_dmask="flash_attn"`` flash-attn's own layout (flash_attn_s_dmask)."""
    # A plain call (every feature argument its default, strict types) in eager mode:
    # straight to the op's kernel functions (flash_cann.contract.eager), before any other work.
    if (type(causal) is bool and type(deterministic) is bool
            and type(window_size) is tuple and window_size == (-1, -1)
            and type(softcap) is float and softcap == 0.0 and type(dropout_p) is float
            and dropout_p == 0.0 and alibi_slopes is None and cu_seqlens_q is None
            and cu_seqlens_k is None and not (max_seqlen_q or max_seqlen_k) and sinks is None
            and fp16_scores is False and eager.applies(q, k, v, key_padding_mask)):
        return (*eager.attention(q, k, v, key_padding_mask,
                                 _softmax_scale(softmax_scale, q, scale_name), causal, layout,
                                 deterministic), None)
    window_left, window_right = _window(window_size)
    dropout_p = _real(dropout_p, "dropout_p")
    scale = _softmax_scale(softmax_scale, q, scale_name)
    causal = _flag(causal, "causal")
    if alibi_slopes is not None:
        require_tensor(alibi_slopes, "alibi_slopes")
    if sinks is not None:
        require_tensor(sinks, "sinks")
    rng_state = _rng_state(dropout_p, q.device, generator) if 0.0 < dropout_p < 1.0 else None
    options = dict(scale=scale, causal=causal, layout=layout, max_seqlen_q=max_seqlen_q,
                   max_seqlen_k=max_seqlen_k, window_left=window_left, window_right=window_right,
                   softcap=_real(softcap, "softcap"), dropout_p=dropout_p)
    out, lse = torch.ops.flash_cann.fwd(
        q, k, v, key_padding_mask, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        alibi_slopes=alibi_slopes, rng_state=rng_state, sinks=sinks,
        deterministic=_flag(deterministic, "deterministic"),
        fp16_scores=_flag(fp16_scores, "fp16_scores"), **options)
    probs = None
    flash_attn_s_dmask.check_layout(s_dmask)
    if _flag(return_probs, "return_attn_probs") and rng_state is not None:
        capture.refuse_host_read(q.device, "the dropout seed (return_attn_probs=True with "
                                           "dropout builds S_dmask, a debug output, on the host)",
                                 "capture without return_attn_probs")
        probs = _dropout_probs(q, k, v, key_padding_mask, rng_state, cu_seqlens_q,
                               cu_seqlens_k, alibi_slopes, sinks, s_dmask=s_dmask, **options)
    return out, lse, probs


@torch.no_grad()
def _dropout_probs(q, k, v, key_padding_mask, rng_state, cu_seqlens_q, cu_seqlens_k,
                   alibi_slopes, sinks, *, scale, causal, layout, max_seqlen_q, max_seqlen_k,
                   window_left, window_right, softcap, dropout_p,
                   s_dmask="probabilities") -> torch.Tensor:
    """S_dmask (see _attention): the oracle's probabilities, signed by the Philox mask the
    kernels drew (flash_cann.contract.variant.keep_mask, same counter, same seed), in the
    ``s_dmask`` layout (flash_attn_s_dmask)."""
    from ..contract import reference

    heads_q = q.shape[-2] if layout in ("BSND", layouts.PACKED) else q.shape[1]
    batch = len(cu_seqlens_q) - 1 if layout == layouts.PACKED else q.shape[0]
    slopes = None if alibi_slopes is None else alibi_slopes.expand(batch, heads_q)
    seqlen_k = max_seqlen_k if layout == layouts.PACKED else layouts.sizes(k, layout)[2]
    window_left, window_right = window_bounds(window_left, window_right, causal, seqlen_k)
    variant = Variant(window_left=window_left, window_right=window_right, softcap=softcap,
                      alibi_slopes=slopes, dropout_p=dropout_p, rng_state=rng_state,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                      sinks=None if sinks is None else sinks.detach())
    probs = reference.probabilities(q, k, v, key_padding_mask, scale=scale, causal=causal,
                                    layout=layout, variant=variant)
    b, h, i, j = (torch.arange(n, device=q.device) for n in probs.shape)
    keep = keep_mask(rng_state.cpu(), dropout_p, b.view(-1, 1, 1, 1).cpu(),
                     h.view(1, -1, 1, 1).cpu(), i.view(1, 1, -1, 1).cpu(),
                     j.view(1, 1, 1, -1).cpu()).to(q.device)
    if s_dmask == "flash_attn":
        return flash_attn_s_dmask.flash_attn_layout(probs, keep, q.shape[-1], causal).to(q.dtype)
    return torch.where(keep, probs, -probs).to(q.dtype)


def _returned(out, lse, probs, return_attn_probs):
    """flash-attn's return convention: out, or (out, softmax_lse, S_dmask)."""
    return (out, lse, probs) if _flag(return_attn_probs, "return_attn_probs") else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, *, sinks=None,
                    generator=None, fp16_scores=False, s_dmask="probabilities"):
    """dropout_p should be set to 0.0 during evaluation.
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with
    fewer heads than Q. Note that the number of heads in Q must be divisible by the
    number of heads in KV. For example, if Q has 6 heads and K, V have 2 heads, heads
    0, 1, 2 of Q attend to head 0 of K, V, and heads 3, 4, 5 of Q attend to head 1.

    If causal=True, the causal mask is aligned to the bottom right corner of the
    attention matrix (see the module docstring).

    If window_size != (-1, -1), implements sliding window local attention. Query at
    position i will only attend to keys between
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]]
    inclusive.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim), float16 / bfloat16 (float32 on CPU)
        k: (batch_size, seqlen, nheads_k, headdim)
        v: (batch_size, seqlen, nheads_k, headdim)
        dropout_p: float. Dropout probability, in [0, 1).
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool (or numpy bool, or 0 / 1). Whether to apply causal attention mask
            (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local
            attention. A pair of ints: tuple, list or a tensor of 2 ints (a device
            tensor is read on the host: not during a graph capture). As in flash-attn
            2.8, causal=True sets the
            right bound to 0 and a bound >= seqlen_k means unbounded.
        softcap: float. Anything > 0 activates softcapping attention:
            softcap * tanh(scores / softcap), before the ALiBi bias.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of
            (-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added to the attention
            score of query i and key j. Not differentiated.
        deterministic: bool. Whether the backward pass must be bitwise repeatable. The
            CPU and Triton backends always are; on the NPU it selects the Grad kernel's
            deterministic dQ accumulation (per-core partials reduced in a fixed order)
            instead of the faster fp32 atomic adds.
        return_attn_probs: bool. Whether to also return the logsumexp and the attention
            probabilities (testing only: they may not have the right scaling).
        sinks: (nheads,), fp32 (fp64 with fp64 inputs), keyword-only. Learnable attention
            sinks (gpt-oss; vLLM's s_aux): one logit per query head that joins every
            row's softmax denominator, softmax_lse = log(exp(sinks[h]) + sum_j
            exp(score_ij)), so the row's probabilities sum to less than 1 (the sink has
            no value). A row that sees no key gets out 0 and softmax_lse = sinks[h].
            Differentiable: its gradient flows back to sinks.
        generator: torch.Generator on q's device for the dropout mask's seed (flash_cann's
            extension; default: the device's default generator, seeded by
            torch.manual_seed). Under torch.compile leave it None.
        fp16_scores: bool, keyword-only (flash_cann's extension). Permit the backward to
            hold the attention scores S = QK^T in fp16 (the Ascend fast path: the cube
            rounds S - c, c from lse); the forward runs the default fp32-S path (out and
            softmax_lse exactly the default's). Error against exact attention, measured on
            the twin: within 3x the default path's for every output at the tested shapes
            (docs/kernel-backward.md, "The fp16-score fast path"). fp16 inputs only: refused for
            bfloat16 (an 8-bit mantissa rounds scores 8x coarser) and float32. A
            permission: backends without a fast path (cpu, triton) compute at their
            default precision, as torch's allow_fp16_reduced_precision_reduction.
    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen),
            float32. The logsumexp of each row of the matrix QK^T * scaling.
        s_dmask: str, keyword-only (flash_cann's extension). The layout of S_dmask:
            "probabilities" (default) or "flash_attn", flash-attn's kernel's own (the
            unnormalised exp(S - m_j) per key block of _get_block_size_n, m_j the running
            row maximum in its right-to-left block order, padded to multiples of 128; what
            flash-attn's tests re-normalise, and what the ``flash_attn`` alias returns).
        S_dmask [optional, if return_attn_probs=True]: with dropout_p > 0, (batch_size,
            nheads, seqlen, seqlen_k): the softmax probabilities, negative where dropout
            dropped them (torch.signbit; a debug path that materialises), in the s_dmask
            layout; else None.
    """
    q, k, v = (require_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    return _returned(*_attention(
        q, k, v, None, layout="BSND", softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, deterministic=deterministic, generator=generator,
        return_probs=return_attn_probs, sinks=sinks, fp16_scores=fp16_scores,
        s_dmask=s_dmask), return_attn_probs)


def _unpacked(packed, name: str, count: int, shape: str, dim: int):
    packed = require_tensor(packed, name)
    if packed.dim() != dim + 1 or packed.shape[-3] != count:
        raise ValueError(f"flash_cann: {name} must have shape {shape} (got "
                         f"{tuple(packed.shape)})")
    return packed.unbind(-3)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, sinks=None,
                              generator=None, fp16_scores=False, s_dmask="probabilities"):
    """As :func:`flash_attn_func`, with qkv: (batch_size, seqlen, 3, nheads, headdim)."""
    q, k, v = _unpacked(qkv, "qkv", 3, "(batch_size, seqlen, 3, nheads, headdim)", 4)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, sinks=sinks,
                           generator=generator, fp16_scores=fp16_scores, s_dmask=s_dmask)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, sinks=None,
                             generator=None, fp16_scores=False, s_dmask="probabilities"):
    """As :func:`flash_attn_func`, with kv: (batch_size, seqlen_k, 2, nheads_k, headdim)."""
    k, v = _unpacked(kv, "kv", 2, "(batch_size, seqlen_k, 2, nheads_k, headdim)", 4)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, sinks=sinks,
                           generator=generator, fp16_scores=fp16_scores, s_dmask=s_dmask)


def _max_seqlen(value, name: str) -> int:
    """An int; a 0-d integer tensor is read (one host sync): transformers passes
    ``cu_seqlens.diff().max()`` as it is, which flash-attn's int argument accepts. Not
    during a graph capture (contract.capture): the bound sizes the launch, so a captured
    graph needs it as a Python int."""
    if (isinstance(value, torch.Tensor) and value.dim() == 0
            and not value.is_floating_point() and value.dtype != torch.bool):
        capture.refuse_host_read(value.device, f"{name} (a 0-d tensor on {value.device.type})",
                                 f"pass {name} as a Python int, the bound the graph's launches "
                                 f"are sized for")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"flash_cann: {name} must be an int (got {type(value).__name__} "
                        f"{value!r})")
    return value


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           seqused_k=None, return_softmax_lse=False, out=None, num_splits=0,
                           sinks=None, generator=None, fp16_scores=False,
                           s_dmask="probabilities"):
    """As :func:`flash_attn_func`, for a batch of sequences of different lengths packed
    one after another (layout TND; nothing is padded). Also vLLM's call over a paged KV
    cache (block_table, seqused_k): mixed prefill and decode rows in one call, forward
    only.

    Arguments:
        q: (total_q, nheads, headdim), total_q = the number of query tokens in the batch.
        k, v: (total_k, nheads_k, headdim); with block_table, paged caches
            (num_blocks, page_block_size, nheads_k, headdim).
        cu_seqlens_q: (batch_size + 1,), int32, on q's device: the cumulative sequence
            lengths, used to index into q (sequence b is rows cu_seqlens_q[b] ..
            cu_seqlens_q[b + 1] - 1).
        cu_seqlens_k: (batch_size + 1,), int32: the same for k and v. Optional with
            block_table and seqused_k (vLLM passes None).
        max_seqlen_q, max_seqlen_k: int (or a 0-d integer tensor, read on the host; not
            during a graph capture, which needs ints). The longest query / key sequence. On
            an accelerator they are taken on trust (reading cu_seqlens would stall the
            device), as in flash-attn; CPU calls check them.
        block_table: (batch_size, max_num_blocks_per_seq), int32: k and v are paged caches
            and key j of sequence b lies in block block_table[b, j // page_block_size]. The
            sequence's keys are its first seqused_k[b] entries (else cu_seqlens_k[b + 1] -
            cu_seqlens_k[b], computed on the device).
        seqused_k (keyword): (batch_size,), int32: the keys each sequence attends to. Without
            block_table, sequence b's keys are rows cu_seqlens_k[b] .. cu_seqlens_k[b] +
            seqused_k[b] - 1 of k and v.
        With block_table or seqused_k the call reads a KV cache: forward only (inputs that
        require grad are taken, as by flash-attn, but a backward through the output raises
        a RuntimeError naming block_table / seqused_k), no dropout nor return_attn_probs,
        and nothing is appended; causal masks, windows and ALiBi are bottom-right aligned
        to each sequence's key count (vLLM's chunked prefill and decode rows).
        Causal masks, windows and ALiBi positions are per sequence (bottom-right aligned
        to each sequence's own lengths). sinks (nheads,) are shared by every sequence
        (vLLM's s_aux). The rest as in flash_attn_func.
        return_softmax_lse (keyword): also return softmax_lse (vllm_flash_attn's flag).
        out (keyword): (total_q, nheads, headdim) like q: the output is written into it
            (and returned), as vLLM passes its output buffer.
        num_splits (keyword): with block_table or seqused_k, split-KV as in
            flash_attn_with_kvcache (0: the backend chooses); ignored otherwise. Results
            equal the unsplit ones up to rounding.
        fp16_scores (keyword): as in flash_attn_func (with block_table or seqused_k the
            decode kernel holds no S: it is checked, then ignored).
    Return:
        out: (total_q, nheads, headdim).
        softmax_lse [optional, if return_attn_probs or return_softmax_lse]: (nheads,
            total_q), float32.
        S_dmask [optional, if return_attn_probs=True]: with dropout_p > 0, (batch_size,
            nheads, max_seqlen_q, max_seqlen_k), zero outside each sequence; else None.
    """
    q, k, v = (require_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    _num_splits(num_splits)
    max_seqlen_q, max_seqlen_k = (_max_seqlen(max_seqlen_q, "max_seqlen_q"),
                                  _max_seqlen(max_seqlen_k, "max_seqlen_k"))
    if block_table is not None or seqused_k is not None:
        check_fp16_scores(_flag(fp16_scores, "fp16_scores"), q.dtype)
        result = _cache_varlen(
            q, k, v, require_tensor(cu_seqlens_q, "cu_seqlens_q"), cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, seqused_k, block_table, dropout_p=dropout_p,
            return_attn_probs=return_attn_probs, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
            num_splits=num_splits)
        return _varlen_returned(*result, None, out, return_attn_probs, return_softmax_lse)
    result = _attention(
        q, k, v, None, layout=layouts.PACKED, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, deterministic=deterministic, generator=generator,
        return_probs=return_attn_probs, cu_seqlens_q=require_tensor(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=None if cu_seqlens_k is None else require_tensor(cu_seqlens_k,
                                                                       "cu_seqlens_k"),
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, sinks=sinks,
        fp16_scores=fp16_scores, s_dmask=s_dmask)
    return _varlen_returned(*result, out, return_attn_probs, return_softmax_lse)


def _varlen_returned(out, lse, probs, into, return_attn_probs, return_softmax_lse):
    """out (written into ``into`` when given), then flash-attn's (out, softmax_lse,
    S_dmask) with return_attn_probs, or vllm_flash_attn's (out, softmax_lse) with
    return_softmax_lse."""
    if into is not None:
        into = require_tensor(into, "out")
        if into.shape != out.shape or into.dtype != out.dtype or into.device != out.device:
            raise ValueError(f"flash_cann: out must be {_dtype_name(out.dtype)} "
                             f"{tuple(out.shape)} on {out.device}, like q (got "
                             f"{_dtype_name(into.dtype)} {tuple(into.shape)} on "
                             f"{into.device})")
        out = into.copy_(out)
    if _flag(return_attn_probs, "return_attn_probs"):
        return out, lse, probs
    return (out, lse) if _flag(return_softmax_lse, "return_softmax_lse") else out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _num_splits(num_splits) -> None:
    """A performance hint in flash-attn; any int >= 0."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"flash_cann: num_splits must be an int >= 0 (got {num_splits!r})")


def _cache_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                  block_table, *, dropout_p, return_attn_probs, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, sinks, num_splits):
    """flash_attn_varlen_func over a KV cache (block_table or seqused_k): (out, lse) of
    torch.ops.flash_cann.fwd_kvcache with TND queries, nothing appended and no host read.

    Packed keys with seqused_k (no block_table) are a one-row contiguous cache that every
    sequence shares (cache_batch_idx 0) with sequence b's keys from cache_leftpad =
    cu_seqlens_k[b] to cache_seqlens = cu_seqlens_k[b] + seqused_k[b]: the keys are read
    in place, contiguously, and bottom-right alignment makes the absolute positions see
    the same causal diagonal, window and ALiBi distances as the sequence's own."""
    paged = block_table is not None
    what = "block_table" if paged else "seqused_k"
    if _real(dropout_p, "dropout_p") != 0.0:
        raise ValueError(f"flash_cann: dropout_p={dropout_p} is not taken with {what}: a call "
                         f"over a KV cache is inference only (pass dropout_p=0.0)")
    if _flag(return_attn_probs, "return_attn_probs"):
        raise ValueError(f"flash_cann: return_attn_probs=True is not taken with {what} (a KV "
                         f"cache call has no dropout mask to return; use "
                         f"return_softmax_lse=True for the lse)")
    grads = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, sinks))
    batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q.dim() == 1 else -1
    if cu_seqlens_k is not None:
        cu_seqlens_k = _int32_vector(cu_seqlens_k, "cu_seqlens_k", batch + 1, q.device)
    if seqused_k is not None:
        seqused_k = _int32_vector(seqused_k, "seqused_k", batch, q.device)
    if paged:
        if seqused_k is None and cu_seqlens_k is None:
            raise ValueError("flash_cann: block_table needs seqused_k or cu_seqlens_k: each "
                             "sequence's number of keys")
        lengths = seqused_k if seqused_k is not None else cu_seqlens_k.diff()
        cache = dict(cache_seqlens=lengths, cache_batch_idx=None, block_table=block_table,
                     cache_leftpad=None, k_cache=k, v_cache=v)
    else:
        if cu_seqlens_k is None:
            raise ValueError("flash_cann: seqused_k without block_table needs cu_seqlens_k "
                             "(where each sequence's keys start in k and v)")
        if k.dim() != 3 or v.dim() != 3:
            raise ValueError(f"flash_cann: k and v must be (total_k, nheads_k, headdim) with "
                             f"seqused_k and no block_table (got {tuple(k.shape)} and "
                             f"{tuple(v.shape)})")
        starts = cu_seqlens_k[:-1]
        if reads_values(seqused_k) and reads_values(cu_seqlens_k):
            room = cu_seqlens_k.diff()
            if bool(((seqused_k < 0) | (seqused_k > room)).any()):
                raise ValueError(f"flash_cann: seqused_k must be in [0, cu_seqlens_k[b + 1] - "
                                 f"cu_seqlens_k[b]] (got {seqused_k.tolist()[:8]} for "
                                 f"{room.tolist()[:8]})")
        cache = dict(cache_seqlens=starts + seqused_k, cache_leftpad=starts, block_table=None,
                     cache_batch_idx=torch.zeros_like(starts), k_cache=k.unsqueeze(0),
                     v_cache=v.unsqueeze(0))
    # flash-attn normalises the window with max_seqlen_k (the op would use the capacity).
    causal = _flag(causal, "causal")
    window_left, window_right = window_bounds(*_window(window_size), causal, max_seqlen_k)
    if alibi_slopes is not None:
        require_tensor(alibi_slopes, "alibi_slopes")
    with torch.no_grad():  # the KV cache op has no backward
        out, lse = torch.ops.flash_cann.fwd_kvcache(
            q, cache["k_cache"], cache["v_cache"], None, None, cache["cache_seqlens"],
            cache["cache_batch_idx"], cache["block_table"], cache["cache_leftpad"],
            scale=_softmax_scale(softmax_scale, q, "softmax_scale"), causal=causal,
            layout="TND", cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            alibi_slopes=alibi_slopes,
            sinks=None if sinks is None else require_tensor(sinks, "sinks"),
            window_left=window_left, window_right=window_right,
            softcap=_real(softcap, "softcap"), num_splits=num_splits)
    return (_NoBackward.apply(out, what, q, k, v, sinks) if grads else out), lse


class _NoBackward(torch.autograd.Function):
    """The output of a forward-only call made with inputs that require grad, as
    flash-attn's paged varlen forward runs then: the forward is served, and a backward
    through it raises, naming the argument that made the call forward only."""

    @staticmethod
    def forward(ctx, out, what, *inputs):
        ctx.what = what
        return out.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"flash_cann: flash_attn_varlen_func with {ctx.what} (a KV cache "
                           f"read) has no backward: it ran forward only. Pass cu_seqlens_k "
                           f"without block_table / seqused_k to train")


def _int32_vector(t, name: str, length: int, device) -> torch.Tensor:
    """An int32 (length,) tensor on ``device`` (checked here: the API computes with it
    before the op's checks run)."""
    t = require_tensor(t, name)
    if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != length or t.device != device:
        raise ValueError(f"flash_cann: {name} must be int32 ({length},) on {device}, batch "
                         f"being len(cu_seqlens_q) - 1 (got {_dtype_name(t.dtype)} "
                         f"{tuple(t.shape)} on {t.device})")
    return t


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, sinks=None, generator=None,
                                     fp16_scores=False, s_dmask="probabilities"):
    """As :func:`flash_attn_varlen_func`, with qkv: (total, 3, nheads, headdim) and one
    cu_seqlens / max_seqlen for queries and keys."""
    q, k, v = _unpacked(qkv, "qkv", 3, "(total, 3, nheads, headdim)", 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs,
                                  sinks=sinks, generator=generator, fp16_scores=fp16_scores,
                                  s_dmask=s_dmask)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, sinks=None, generator=None,
                                    fp16_scores=False, s_dmask="probabilities"):
    """As :func:`flash_attn_varlen_func`, with kv: (total_k, 2, nheads_k, headdim)."""
    k, v = _unpacked(kv, "kv", 2, "(total_k, 2, nheads_k, headdim)", 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  sinks=sinks, generator=generator, fp16_scores=fp16_scores,
                                  s_dmask=s_dmask)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, sinks=None, cu_seqlens_q=None,
                            max_seqlen_q=None, rotary_seqlens=None):
    """Attention over a KV cache, for decoding (forward only), as flash-attn's.

    If k and v are given, they are written into k_cache and v_cache IN PLACE, after each
    sequence's cache_seqlens entries; then q attends to entries cache_leftpad ..
    cache_seqlens + seqlen_new - 1 of its sequence's cache (causal and windows
    bottom-right aligned to cache_seqlens + seqlen_new).

    With rotary_cos / rotary_sin, the new k is rotated (rotary embeddings) at positions
    cache_seqlens, cache_seqlens + 1, ... before it is stored, and so is q if causal or
    local (window_size != (-1, -1)); otherwise every token of q is rotated at position
    cache_seqlens (flash-attn's rule). Positions are absolute cache positions: as in
    flash-attn, cache_leftpad does not shift them.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim) without block_table,
            or (num_blocks, page_block_size, nheads_k, headdim) with one (paged cache).
        v_cache: the same shape as k_cache.
        k, v [optional]: (batch_size, seqlen_new, nheads_k, headdim): the new entries.
        rotary_cos, rotary_sin [optional]: (seqlen_ro, rotary_dim / 2), rotary_dim <=
            headdim (even; channels past it pass through). Only with k and v (and
            cache_seqlens); seqlen_ro must cover cache_seqlens + seqlen_new (checked on
            CPU; on an accelerator taken on trust, as in flash-attn).
        cache_seqlens: int, or (batch_size,) int32 on q's device: the cache's filled
            length per sequence (None: the whole cache).
        cache_batch_idx: (batch_size,) int32: the cache row of each sequence (default:
            its batch index). Not with block_table.
        cache_leftpad [optional]: (batch_size,) int32: the first cache entry each sequence
            attends to (the entries before it are left padding); 0 <= cache_leftpad <=
            cache_seqlens + seqlen_new (checked on CPU; clamped into it on an
            accelerator).
        block_table: (batch_size, max_num_blocks_per_seq) int32: key j of sequence b lies
            in block block_table[b, j // page_block_size].
        softmax_scale, causal, window_size, softcap, alibi_slopes, sinks: as in
            flash_attn_func (sinks: keyword-only, not differentiated here: forward only).
        rotary_interleaved: rotate channel pairs (0, 1), (2, 3), ... (GPT-J style); False:
            (i, i + rotary_dim / 2) (GPT-NeoX style). Only meaningful with rotary_cos/sin.
        num_splits: split-KV, as flash-attn's: 0 (default) lets the backend choose from
            the shapes (the Triton backend on CUDA splits when batch x nheads_k cannot
            fill the GPU, e.g. one long sequence), 1 never splits, n > 1 splits each
            sequence's keys into n ranges whose partial results are combined in a fixed
            order. The result equals the unsplit one up to rounding and repeats bitwise;
            the CPU backend and the Triton backend on NPUs ignore it.
        return_softmax_lse: also return the logsumexp (batch_size, nheads, seqlen), fp32.
        cu_seqlens_q, max_seqlen_q (keyword-only; FA3's ragged queries): q is (total_q,
            nheads, headdim), sequence b's rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1
            ((batch_size + 1,) int32), max_seqlen_q an int >= the longest (or a 0-d
            integer tensor, read on the host). cache_seqlens is then required and nothing
            is appended (no k, v: ragged new keys are FA3's cu_seqlens_k_new, not taken);
            out is (total_q, nheads, headdim) and lse (nheads, total_q).
        rotary_seqlens (keyword-only; FA3's): (batch_size,) int32: each sequence's first
            rotary position, in place of cache_seqlens (only with rotary_cos / rotary_sin).
    Return:
        out: (batch_size, seqlen, nheads, headdim); with return_softmax_lse, (out, lse).
    """
    _num_splits(num_splits)
    interleaved = _flag(rotary_interleaved, "rotary_interleaved")
    q, k_cache, v_cache = (require_tensor(t, n) for t, n in
                           ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")))
    packed = {}
    if cu_seqlens_q is not None:
        cu_seqlens_q = require_tensor(cu_seqlens_q, "cu_seqlens_q")
        packed = dict(layout="TND", cu_seqlens_q=cu_seqlens_q,
                      max_seqlen_q=_max_seqlen(max_seqlen_q, "max_seqlen_q"))
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    window_left, window_right = _window(window_size)
    causal = _flag(causal, "causal")
    if rotary_cos is not None or rotary_sin is not None:
        first_positions = cache_seqlens if rotary_seqlens is None else _int32_vector(
            rotary_seqlens, "rotary_seqlens", q.shape[0], q.device)
        q, k = _rotated(q, k, v, k_cache, rotary_cos, rotary_sin, first_positions,
                        block_table, interleaved, causal, window_left, window_right)
    out, lse = torch.ops.flash_cann.fwd_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, cache_leftpad,
        alibi_slopes=alibi_slopes, sinks=None if sinks is None else require_tensor(sinks, "sinks"),
        scale=_softmax_scale(softmax_scale, q, "softmax_scale"), causal=causal,
        window_left=window_left, window_right=window_right, softcap=_real(softcap, "softcap"),
        num_splits=num_splits, **packed)
    return (out, lse) if _flag(return_softmax_lse, "return_softmax_lse") else out


def _rotated(q, k, v, k_cache, cos, sin, cache_seqlens, block_table, interleaved: bool,
             causal: bool, window_left: int, window_right: int):
    """(q, k) with flash-attn's rotary embeddings for a KV cache step (see
    flash_attn_with_kvcache): positions from cache_seqlens (or FA3's rotary_seqlens) on the
    device, no host read."""
    if cos is None or sin is None:
        raise ValueError("flash_cann: rotary_cos and rotary_sin must be given together")
    if k is None or v is None:
        raise ValueError("flash_cann: rotary_cos / rotary_sin rotate the new keys: they need k "
                         "and v (the entries to append), as in flash-attn")
    if not isinstance(cache_seqlens, torch.Tensor):
        raise ValueError("flash_cann: rotary_cos / rotary_sin need cache_seqlens (the position "
                         "of each sequence's first new token)")
    k = require_tensor(k, "k")
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"flash_cann: {name} must be (batch_size, seqlen, nheads, headdim) "
                             f"(got shape {tuple(t.shape)})")
    rotary.check_tables(require_tensor(cos, "rotary_cos"), require_tensor(sin, "rotary_sin"),
                        q.shape[-1])
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if t.device != q.device:
            raise ValueError(f"flash_cann: {name} must be on the same device as q (got "
                             f"{t.device} and {q.device})")
    # flash-attn: causal or local calls rotate each query token at its own position; the
    # others rotate all of them at cache_seqlens (its window normalised as the op does).
    capacity = (block_table.shape[1] * k_cache.shape[1]
                if isinstance(block_table, torch.Tensor) and block_table.dim() == 2
                else k_cache.shape[1])
    left, right = window_bounds(window_left, window_right, causal, capacity)
    per_token = causal or left >= 0 or right >= 0
    first = cache_seqlens.long().unsqueeze(1)
    positions_k = first + torch.arange(k.shape[1], device=q.device)
    positions_q = (first + torch.arange(q.shape[1], device=q.device) if per_token
                   else first.expand(q.shape[0], q.shape[1]))
    for positions in (positions_k, positions_q):
        rotary.check_positions(positions, cos)
    return (rotary.rotate(q, cos, sin, positions_q, interleaved),
            rotary.rotate(k, cos, sin, positions_k, interleaved))


def attention(q, k, v, *, layout="BNSD", num_heads=None, causal=False, scale=None,
              key_padding_mask=None, return_lse=False, deterministic=False,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
              sinks=None, generator=None, fp16_scores=False):
    """Attention for CANN-style callers.

    Arguments:
        q: (batch, heads_q, seqlen_q, head_dim) for layout "BNSD",
           (batch, seqlen_q, heads_q, head_dim) for "BSND",
           (batch, seqlen_q, heads_q * head_dim) for "BSH",
           (total_q, heads_q, head_dim) for "TND" (packed sequences, as
           npu_fusion_attention's TND with actual_seq_qlen; see cu_seqlens_q).
        k, v: the same layout with heads_kv heads and seqlen_k; heads_q must be a
           multiple of heads_kv (GQA/MQA). float16 / bfloat16 (float32 on CPU).
        layout: "BNSD", "BSND", "BSH" or "TND". BSH is a zero-copy view of BSND.
        num_heads: query heads; required for "BSH" (head_dim = hidden / num_heads,
           heads_kv = k's hidden / head_dim), optional elsewhere (checked if given).
        causal: bottom-right aligned causal mask (see the module docstring).
        scale: softmax scale; default 1 / sqrt(head_dim).
        key_padding_mask: optional bool or integer tensor of shape (batch, seqlen_k) or
           (seqlen_k,). **True / nonzero = ATTEND to that key**, False / 0 = padding.
           This is the flash-attn / InfiniOp polarity, the OPPOSITE of
           torch_npu.npu_fusion_attention's atten_mask (where 1 = masked out).
           Rows with no visible key return 0 (and lse -inf), never NaN. Not with TND.
        return_lse: also return softmax_lse.
        deterministic: a bitwise repeatable backward pass (as in :func:`flash_attn_func`).
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: for "TND" only, as in
           :func:`flash_attn_varlen_func` (cumulative offsets: [0, len_0, len_0 + len_1,
           ...], not npu_fusion_attention's actual_seq_qlen which omits the leading 0).
        window_size, softcap, alibi_slopes, dropout_p, sinks, generator, fp16_scores: as
           in :func:`flash_attn_func`.
    Return:
        out: same shape and layout as q.
        softmax_lse [if return_lse]: (batch, heads_q, seqlen_q), float32; (heads_q,
           total_q) for TND.
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
    if layout == layouts.PACKED:
        if q.dim() == 3 and num_heads is not None and num_heads != q.shape[1]:
            raise ValueError(f"flash_cann: num_heads={num_heads} does not match q's "
                             f"{q.shape[1]} heads in layout TND")
    elif q.dim() == 4 and k.dim() == 4:
        batch, heads_q = layouts.sizes(q, op_layout)[:2]
        if num_heads is not None and layout != "BSH" and num_heads != heads_q:
            raise ValueError(f"flash_cann: num_heads={num_heads} does not match q's "
                             f"{heads_q} heads in layout {layout}")
        key_padding_mask = key_padding_mask_as_bool(
            key_padding_mask, batch, layouts.sizes(k, op_layout)[2], q.device)
    out, lse, _ = _attention(
        q, k, v, key_padding_mask, layout=op_layout, softmax_scale=scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, deterministic=deterministic, generator=generator,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=0 if max_seqlen_q is None else max_seqlen_q,
        max_seqlen_k=0 if max_seqlen_k is None else max_seqlen_k, sinks=sinks,
        fp16_scores=fp16_scores,
        scale_name="scale")
    if layout == "BSH":
        out = out.flatten(-2)
    return (out, lse) if _flag(return_lse, "return_lse") else out
