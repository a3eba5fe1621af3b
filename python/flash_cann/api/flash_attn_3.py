"""FA3's interface: flash-attn's ``hopper/flash_attn_interface.py`` (the module
``flash_attn_interface`` of its FA3 build, which vLLM and SGLang call), on flash_cann's
functions. The ``flash_attn`` alias serves it as ``flash_attn_interface`` and
``hopper.flash_attn_interface``.

Names, parameters (names, order, defaults) and return conventions are those of FA3 at
flash-attn's main branch:

- ``flash_attn_func``, ``flash_attn_qkvpacked_func``, ``flash_attn_varlen_func`` return
  out, or (out, softmax_lse) with ``return_attn_probs`` (FA3 has no dropout and returns no
  S_dmask). They are differentiable. ``flash_attn_varlen_func``'s ``seqused_q`` /
  ``seqused_k`` (sequence b uses the first seqused_q[b] rows of its cu_seqlens_q segment
  and the first seqused_k[b] of its keys) become three packed sequences per sequence
  (:func:`used_segments`): the used rows with the used keys, the other rows with no key
  (output 0, lse -inf, zero gradients), and no row with the other keys.
- ``flash_attn_with_kvcache`` returns out, or (out, softmax_lse, out_accum,
  softmax_lse_accum) with ``return_softmax_lse``: FA3's split-KV partials, which it
  returns as empty tensors when it does not split, and which are always empty here
  (flash_cann combines its splits inside the call). ``page_table`` is flash-attn 2's
  ``block_table``; ``cu_seqlens_q`` / ``max_seqlen_q`` take ragged queries.
- ``flash_attn_combine`` merges split-KV partials as FA3's ``fwd_combine``: out (batch,
  seqlen, nheads, headdim) in ``out_dtype`` (or into ``out``) and softmax_lse (batch,
  seqlen, nheads), each split weighted by exp(lse_split - lse).
- ``get_scheduler_metadata`` returns an empty int32 tensor: flash_cann's kernels plan each
  call from its shapes, so there is nothing to precompute; ``flash_attn_with_kvcache``
  takes it back (or None) and ignores it.

Hints FA3 tunes with are checked and have no effect: ``pack_gqa`` (None or a bool:
flash_cann packs GQA heads itself), ``sm_margin`` (an int >= 0), ``num_splits`` (an int
>= 0; ``flash_attn_with_kvcache`` passes it on as its split-KV hint).

``q_descale`` / ``k_descale`` / ``v_descale``: FA3 applies them to FP8 inputs only, so
with float16 / bfloat16 inputs they are taken and ignored, as there (vLLM passes them on
every call); FP8 inputs are refused until flash_cann takes quantised inputs.

Refused with an error naming the argument (FA3 features flash_cann does not compute):
``qv``, ``attention_chunk`` other than 0 and ``cu_seqlens_k_new``. FA3's hopper
interface has no sink argument (vLLM's build adds ``s_aux``: flash_cann.api.vllm_flash_attn).
"""

from __future__ import annotations

import torch

from ..contract.checks import reads_values, require_tensor
from . import interface
from .interface import _flag, _num_splits

# argument -> why it is refused (what flash_cann does not compute)
_UNSERVED = {
    "qv": "FA3's second query-value product (MLA's absorbed heads) is not computed; pass "
          "None",
    "cu_seqlens_k_new": "ragged new keys are not appended; pass None (and k, v of shape "
                        "(batch, seqlen_new, nheads_k, headdim) without cu_seqlens_q)",
}


def refuse_unserved(attention_chunk=0, **arguments) -> None:
    """NotImplementedError naming the first argument flash_cann cannot serve."""
    for name, value in arguments.items():
        if value is not None:
            raise NotImplementedError(f"flash_cann: {name} is not supported: {_UNSERVED[name]}")
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int):
        raise TypeError(f"flash_cann: attention_chunk must be an int (got "
                        f"{type(attention_chunk).__name__} {attention_chunk!r})")
    if attention_chunk != 0:
        raise NotImplementedError(f"flash_cann: attention_chunk={attention_chunk} is not "
                                  f"supported: chunked local attention is not computed; pass 0")


def check_descale(q, **descales) -> None:
    """FA3 applies q/k/v_descale to FP8 inputs only and ignores them otherwise (vLLM
    passes them on every call): taken and ignored with float16 / bfloat16 / float32
    inputs; FP8 inputs are refused, naming the scales."""
    for name, value in descales.items():
        if value is not None:
            require_tensor(value, name)
    if isinstance(q, torch.Tensor) and q.dtype in _FP8:
        raise NotImplementedError(f"flash_cann: q is {q.dtype} with q_descale / k_descale / "
                                  f"v_descale: FP8 inputs are not supported yet; pass float16 "
                                  f"/ bfloat16 tensors (the scales are then ignored, as in FA3)")


_FP8 = {getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                          "float8_e5m2fnuz") if hasattr(torch, name)}


def check_hints(pack_gqa=None, sm_margin=0, num_splits=0) -> None:
    """FA3's tuning hints, checked; flash_cann's kernels need none of them."""
    if pack_gqa is not None:
        _flag(pack_gqa, "pack_gqa")
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ValueError(f"flash_cann: sm_margin must be an int >= 0 (got {sm_margin!r})")
    _num_splits(num_splits)


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, num_heads_q + 2 *
    nheads_k, headdim) with num_heads_q (GQA packed along the heads). The rest as
    :func:`flash_attn_func`."""
    qkv = require_tensor(qkv, "qkv")
    if qkv.dim() == 5 and qkv.shape[2] == 3:
        q, k, v = qkv.unbind(2)
    elif qkv.dim() == 4 and isinstance(num_heads_q, int) and not isinstance(num_heads_q, bool):
        heads_k = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_q <= 0 or heads_k <= 0 or num_heads_q + 2 * heads_k != qkv.shape[2]:
            raise ValueError(f"flash_cann: qkv's {qkv.shape[2]} heads must be num_heads_q "
                             f"({num_heads_q}) + 2 * nheads_k")
        q, k, v = qkv.split([num_heads_q, heads_k, heads_k], dim=2)
    else:
        raise ValueError(f"flash_cann: qkv must be (batch, seqlen, 3, nheads, headdim), or "
                         f"(batch, seqlen, num_heads_q + 2 * nheads_k, headdim) with "
                         f"num_heads_q an int (got shape {tuple(qkv.shape)}, num_heads_q="
                         f"{num_heads_q!r})")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale,
                           v_descale, window_size, attention_chunk, softcap,
                           deterministic=deterministic, sm_margin=sm_margin,
                           return_attn_probs=return_attn_probs)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                    sm_margin=0, return_attn_probs=False):
    """FA3's flash_attn_func: as flash_cann.flash_attn_func without dropout and ALiBi.
    Returns out, or (out, softmax_lse) with return_attn_probs."""
    refuse_unserved(attention_chunk, qv=qv)
    check_descale(q, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    check_hints(pack_gqa, sm_margin, num_splits)
    out, lse, _ = interface.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size,
                                            softcap, None, deterministic, True)
    return (out, lse) if _flag(return_attn_probs, "return_attn_probs") else out


def used_segments(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    """(cu_seqlens_q, cu_seqlens_k) of 3 sequences per sequence b of the given ones, on
    the device (no host read): (its first seqused_q[b] rows, its first seqused_k[b] keys),
    (its other rows, no key), (no row, its other keys). None: all of them are used."""
    starts_q, ends_q = cu_seqlens_q[:-1], cu_seqlens_q[1:]
    starts_k, ends_k = cu_seqlens_k[:-1], cu_seqlens_k[1:]
    used_q = ends_q if seqused_q is None else starts_q + seqused_q
    used_k = ends_k if seqused_k is None else starts_k + seqused_k
    if reads_values(used_q) and reads_values(used_k) and bool(
            ((used_q < starts_q) | (used_q > ends_q) | (used_k < starts_k)
             | (used_k > ends_k)).any()):
        raise ValueError("flash_cann: seqused_q / seqused_k must be in [0, the sequence's "
                         "length in cu_seqlens_q / cu_seqlens_k]")
    return (torch.cat((torch.stack((starts_q, used_q, ends_q), 1).flatten(), ends_q[-1:])),
            torch.cat((torch.stack((starts_k, used_k, used_k), 1).flatten(), ends_k[-1:])))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False):
    """FA3's flash_attn_varlen_func: as flash_cann.flash_attn_varlen_func without dropout
    and ALiBi, with seqused_q / seqused_k (module docstring). Returns out, or (out,
    softmax_lse) with return_attn_probs."""
    refuse_unserved(attention_chunk, qv=qv)
    check_descale(q, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    check_hints(pack_gqa, sm_margin, num_splits)
    if seqused_q is not None or seqused_k is not None:
        cu_seqlens_q, cu_seqlens_k = used_segments(
            *(require_tensor(t, n) for t, n in ((cu_seqlens_q, "cu_seqlens_q"),
                                                (cu_seqlens_k, "cu_seqlens_k"))),
            *(None if t is None else require_tensor(t, n)
              for t, n in ((seqused_q, "seqused_q"), (seqused_k, "seqused_k"))))
    out, lse = interface.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, softmax_scale,
        causal, window_size, softcap, None, deterministic, return_softmax_lse=True)
    return (out, lse) if _flag(return_attn_probs, "return_attn_probs") else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """FA3's flash_attn_with_kvcache: flash_cann.flash_attn_with_kvcache with
    page_table as block_table, ragged queries (cu_seqlens_q, max_seqlen_q; nothing
    appended) and rotary_seqlens (the rotary positions' start, default cache_seqlens). Returns out, or (out, softmax_lse, out_accum, softmax_lse_accum) with
    return_softmax_lse, the last two empty (module docstring)."""
    refuse_unserved(attention_chunk, qv=qv, cu_seqlens_k_new=cu_seqlens_k_new)
    check_descale(q, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    check_hints(pack_gqa, sm_margin, num_splits)
    if scheduler_metadata is not None:
        require_tensor(scheduler_metadata, "scheduler_metadata")
    out, lse = interface.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, page_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, None, num_splits, True, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens)
    if not _flag(return_softmax_lse, "return_softmax_lse"):
        return out
    no_partials = torch.empty(0, dtype=torch.float32, device=out.device)
    return out, lse, no_partials, no_partials


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FA3's combine of split-KV partials: out_partial (num_splits, batch, seqlen, nheads,
    headdim) and lse_partial (num_splits, batch, seqlen, nheads), float32. Returns (out,
    softmax_lse): out = sum over splits of exp(lse_split - lse) * out_split in out_dtype
    (default float32; written into ``out`` when given), lse = logsumexp over the splits
    (-inf, with out 0, where every split is -inf)."""
    out_partial = require_tensor(out_partial, "out_partial")
    lse_partial = require_tensor(lse_partial, "lse_partial")
    if (out_partial.dim() != 5 or out_partial.dtype != torch.float32
            or lse_partial.dtype != torch.float32 or lse_partial.shape != out_partial.shape[:4]):
        raise ValueError(f"flash_cann: out_partial must be float32 (num_splits, batch, seqlen, "
                         f"nheads, headdim) and lse_partial float32 (num_splits, batch, "
                         f"seqlen, nheads) (got {out_partial.dtype} "
                         f"{tuple(out_partial.shape)} and {lse_partial.dtype} "
                         f"{tuple(lse_partial.shape)})")
    lse = lse_partial.logsumexp(0)
    weights = torch.exp(lse_partial - lse)
    weights = torch.where(torch.isnan(weights), 0.0, weights)  # every split -inf
    combined = (weights.unsqueeze(-1) * out_partial).sum(0)
    if out is None:
        return combined.to(out_dtype or torch.float32), lse
    out = require_tensor(out, "out")
    if out.shape != combined.shape or (out_dtype is not None and out.dtype != out_dtype):
        raise ValueError(f"flash_cann: out must be {tuple(combined.shape)}"
                         f"{'' if out_dtype is None else f' {out_dtype}'} (got "
                         f"{out.dtype} {tuple(out.shape)})")
    return out.copy_(combined), lse


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q=None, cu_seqlens_k_new=None, cache_leftpad=None,
                           page_size=None, max_seqlen_k_new=0, causal=False,
                           window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0):
    """An empty int32 tensor on cache_seqlens' device: flash_cann's kernels plan each call
    from its shapes, so there is no schedule to precompute (module docstring)."""
    cache_seqlens = require_tensor(cache_seqlens, "cache_seqlens")
    refuse_unserved(attention_chunk, cu_seqlens_k_new=cu_seqlens_k_new)
    check_hints(pack_gqa, sm_margin, num_splits)
    return torch.empty(0, dtype=torch.int32, device=cache_seqlens.device)
