"""flash-attention-npu's functions (MinghuasLab/flash-attention-npu, whose README documents
them), on flash_cann's: what vllm-ascend's FA3 backend (``vllm_ascend/attention/fa3_v1.py``,
``enable_training_consistency``) and RL frameworks call on Ascend. The ``flash_attn``
alias serves them as its modules:

- ``flash_attn_npu`` (its v2): flash-attn 2's functions (flash_cann's, as the alias's
  ``flash_attn``).
- ``flash_attn_npu_3`` and ``flash_attn_npu_v3`` (the v3 module's name before the
  package's rename, which vllm-ascend imports): FA3's interface (flash_attn_3) with the
  v3 module's one difference in signature, a trailing ``scheduler_metadata=None`` on
  :func:`flash_attn_func` and :func:`flash_attn_varlen_func` (ignored, as FA3's is), and
  one in convention: :func:`flash_attn_with_kvcache` takes ``cu_seqlens_q`` relative to
  its first entry. vllm-ascend's prefill call passes ``query[num_decode_tokens:]`` with
  ``query_start_loc[num_decodes:]``, whose first entry is the number of decode tokens
  before the slice, not 0; its rows are rows ``cu_seqlens_q[b] - cu_seqlens_q[0]`` ..
  of the q it passes (computed on the device, no host read). FA3's own interface keeps
  FA3's rule (cu_seqlens_q[0] = 0).
- ``flash_attn_npu_4`` (its v4): :func:`flash_attn_varlen_func` with FA4's parameters:
  ``page_table``, ``seqused_k``, ``learnable_sink`` (flash_cann's ``sinks``; FA4's bf16 sink
  is taken in float32), ``return_lse``; without cu_seqlens_q, q is (batch, seqlen, nheads,
  headdim). ``min_seqlen_k`` and ``pack_gqa`` are hints (checked, no effect); ``qv``,
  ``seqused_q``, ``gather_kv_indices``, ``score_mod``, ``score_mod_bwd``, ``mask_mod``,
  ``block_sparse_tensors``, ``aux_tensors`` and ``aux_scalars`` are refused by name (the
  v4 module itself refuses most of them on the NPU).
"""

from __future__ import annotations

from ..contract.checks import require_tensor
from . import flash_attn_3, interface
from .interface import _flag


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                    sm_margin=0, return_attn_probs=False, scheduler_metadata=None):
    """flash_attn_npu_3's: FA3's flash_attn_func (scheduler_metadata ignored)."""
    _scheduler_metadata(scheduler_metadata)
    return flash_attn_3.flash_attn_func(q, k, v, softmax_scale, causal, qv, q_descale,
                                        k_descale, v_descale, window_size, attention_chunk,
                                        softcap, num_splits, pack_gqa, deterministic,
                                        sm_margin, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, scheduler_metadata=None):
    """flash_attn_npu_3's: FA3's flash_attn_varlen_func (scheduler_metadata ignored)."""
    _scheduler_metadata(scheduler_metadata)
    return flash_attn_3.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
        softmax_scale, causal, qv, q_descale, k_descale, v_descale, window_size,
        attention_chunk, softcap, num_splits, pack_gqa, deterministic, sm_margin,
        return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """flash_attn_npu_3's: FA3's flash_attn_with_kvcache, cu_seqlens_q relative to its
    first entry (module docstring)."""
    if cu_seqlens_q is not None:
        cu_seqlens_q = require_tensor(cu_seqlens_q, "cu_seqlens_q")
        if cu_seqlens_q.dim() == 1 and cu_seqlens_q.shape[0] > 0:
            cu_seqlens_q = cu_seqlens_q - cu_seqlens_q[:1]
    return flash_attn_3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q,
        rotary_seqlens, q_descale, k_descale, v_descale, softmax_scale, causal, window_size,
        attention_chunk, softcap, rotary_interleaved, scheduler_metadata, num_splits, pack_gqa,
        sm_margin, return_softmax_lse)


def _scheduler_metadata(value) -> None:
    if value is not None:
        require_tensor(value, "scheduler_metadata")


# flash_attn_npu_4's arguments that flash_cann does not compute -> why
_V4_UNSERVED = {
    "qv": "FA4's second query-value product is not computed",
    "seqused_q": "each sequence's query rows are cu_seqlens_q's",
    "gather_kv_indices": "gathered key indices are not taken (flash_attn_npu_4 refuses "
                         "them on the NPU too)",
    "score_mod": "custom score functions are not computed",
    "score_mod_bwd": "custom score functions are not computed",
    "mask_mod": "custom masks are not computed",
    "block_sparse_tensors": "block-sparse attention is not computed",
    "aux_tensors": "they feed score_mod / mask_mod, which are not computed",
    "aux_scalars": "they feed score_mod / mask_mod, which are not computed",
}


def flash_attn_varlen_func_v4(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                              max_seqlen_q=None, max_seqlen_k=None, min_seqlen_k=None,
                              seqused_q=None, seqused_k=None, gather_kv_indices=None,
                              page_table=None, softmax_scale=None, causal=False,
                              window_size=(-1, -1), learnable_sink=None, softcap=0.0,
                              num_splits=0, pack_gqa=None, deterministic=False,
                              score_mod=None, score_mod_bwd=None, mask_mod=None,
                              block_sparse_tensors=None, aux_tensors=None, aux_scalars=None,
                              return_lse=False):
    """flash_attn_npu_4's flash_attn_varlen_func (module docstring). Returns out, or (out,
    softmax_lse) with return_lse."""
    named = dict(qv=qv, seqused_q=seqused_q, gather_kv_indices=gather_kv_indices,
                 score_mod=score_mod, score_mod_bwd=score_mod_bwd, mask_mod=mask_mod,
                 block_sparse_tensors=block_sparse_tensors, aux_tensors=aux_tensors,
                 aux_scalars=aux_scalars)
    for name, value in named.items():
        if value is not None:
            raise NotImplementedError(f"flash_cann: {name} is not supported: "
                                      f"{_V4_UNSERVED[name]}; pass None")
    if min_seqlen_k is not None and (isinstance(min_seqlen_k, bool)
                                     or not isinstance(min_seqlen_k, int)):
        raise TypeError(f"flash_cann: min_seqlen_k must be an int or None (got "
                        f"{min_seqlen_k!r})")
    flash_attn_3.check_hints(pack_gqa, 0, num_splits)
    if cu_seqlens_q is None:
        for name, value in (("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k),
                            ("page_table", page_table)):
            if value is not None:
                raise ValueError(f"flash_cann: {name} needs cu_seqlens_q (packed queries); "
                                 f"without it q, k, v are (batch, seqlen, nheads, headdim)")
    sinks = None if learnable_sink is None else require_tensor(
        learnable_sink, "learnable_sink").float()
    if cu_seqlens_q is None:
        out, lse, _ = interface.flash_attn_func(q, k, v, 0.0, softmax_scale, causal,
                                                window_size, softcap, None, deterministic,
                                                True, sinks=sinks)
    else:
        out, lse = interface.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
            softmax_scale, causal, window_size, softcap, None, deterministic,
            block_table=page_table, seqused_k=seqused_k, return_softmax_lse=True,
            num_splits=num_splits, sinks=sinks)
    return (out, lse) if _flag(return_lse, "return_lse") else out
