"""vLLM's flash-attention adapter (``vllm/vllm_flash_attn/flash_attn_interface.py``: one
``flash_attn_varlen_func`` in front of FA2, FA3 and FA4, chosen by ``fa_version``), on
flash_cann's functions, with its parameters (names, order, defaults) and return
convention: out, or (out, softmax_lse) with ``return_softmax_lse``. The ``flash_attn``
alias serves it as the module ``vllm_flash_attn`` (the standalone package's name, as older
vLLM releases import it), with ``get_scheduler_metadata`` (FA3's, as flash_attn_3, in vLLM's
parameter list) and vLLM's version probes.

The arguments vLLM's attention backend passes, and what they do here:

- ``out``: the output is written into it and it is returned (vLLM's output buffer).
- ``s_aux``: learnable sinks, one logit per query head (gpt-oss): flash_cann's ``sinks``,
  taken in float32.
- ``fa_version``: 2, 3 or 4, all the same flash_cann computation (the versions' feature
  gaps, such as FA2 without s_aux, do not apply); anything else is refused, as vLLM does.
- ``scheduler_metadata``: a tensor (from get_scheduler_metadata) or None, ignored: the
  kernels plan each call from its shapes.
- ``q_descale`` / ``k_descale`` / ``v_descale``: FA3 applies them to FP8 inputs only, and vLLM
  passes them on every call: taken and ignored with float16 / bfloat16 inputs; FP8 inputs
  are refused (flash_attn_3.check_descale).
- ``num_splits``: the split-KV hint of a KV cache call (int >= 0).
- ``block_table`` with ``seqused_k``: the paged cache read (forward only), as
  flash_cann.flash_attn_varlen_func.

Refused by name (vLLM features flash_cann does not compute): ``q_v``, ``output_scale``
(FA4's fused FP8 output), ``cp_world_size`` > 1 / ``cp_rank`` / ``cp_tot_seqused_k`` (decode
context parallelism), ``mask_mod``, ``block_sparse_tensors``, ``aux_tensors``,
``aux_tensor_leading_dims``, ``dynamic_causal``.
"""

from __future__ import annotations

import torch

from ..contract.checks import require_tensor
from . import flash_attn_3, interface
from .interface import _flag

DEFAULT_FA_VERSION = 2
FA_VERSIONS = (2, 3, 4)

# argument -> why it is refused
_UNSERVED = {
    "q_v": "FA3's second query-value product (MLA) is not computed",
    "output_scale": "FA4's fused FP8 output is not produced",
    "cp_tot_seqused_k": "decode context parallelism is not served (flash_cann.distributed "
                        "shards training attention)",
    "mask_mod": "custom masks are not computed",
    "block_sparse_tensors": "block-sparse attention is not computed",
    "aux_tensors": "they feed mask_mod, which is not computed",
    "aux_tensor_leading_dims": "they feed mask_mod, which is not computed",
    "dynamic_causal": "a per-call causal tensor is not taken; pass causal as a bool",
}


def is_fa_version_supported(fa_version: int) -> bool:
    """vLLM's probe: every version it names is served by flash_cann."""
    _fa_version(fa_version)
    return True


def fa_version_unsupported_reason(fa_version: int) -> str | None:
    """vLLM's probe: None (supported) for every version it names."""
    _fa_version(fa_version)
    return None


def _fa_version(fa_version) -> None:
    if fa_version not in FA_VERSIONS or isinstance(fa_version, bool):
        raise ValueError(f"flash_cann: fa_version must be one of {FA_VERSIONS} (vLLM's "
                         f"versions; got {fa_version!r})")


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens: torch.Tensor, qkv_dtype=torch.bfloat16,
                           headdim_v=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
                           cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                           causal=False, window_size=(-1, -1), has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0):
    """vLLM's parameter list of FA3's get_scheduler_metadata: flash_attn_3's (an empty
    int32 tensor)."""
    return flash_attn_3.get_scheduler_metadata(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
        cache_seqlens, qkv_dtype, headdim_v, cu_seqlens_q, cu_seqlens_k_new, cache_leftpad,
        page_size, max_seqlen_k_new, causal, window_size, 0, has_softcap, num_splits,
        pack_gqa, sm_margin)


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k,
                           cu_seqlens_k=None, seqused_k=None, q_v=None, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=None, softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False,
                           block_table=None, return_softmax_lse=False, out=None,
                           scheduler_metadata=None, q_descale=None, k_descale=None,
                           v_descale=None, num_splits: int = 0, output_scale=None,
                           fa_version: int = DEFAULT_FA_VERSION, s_aux=None, cp_world_size=1,
                           cp_rank=0, cp_tot_seqused_k=None, mask_mod=None,
                           block_sparse_tensors=None, aux_tensors=None,
                           aux_tensor_leading_dims=None, dynamic_causal=None):
    """vLLM's flash_attn_varlen_func (module docstring): q (total_q, nheads, headdim); k, v
    packed (total_k, nheads_k, headdim) with cu_seqlens_k, or paged caches with
    block_table and seqused_k. window_size None means (-1, -1). Returns out, or (out,
    softmax_lse) with return_softmax_lse (return_attn_probs is checked and, as in vLLM's
    adapter, returns nothing more)."""
    _fa_version(fa_version)
    named = dict(q_v=q_v, output_scale=output_scale, cp_tot_seqused_k=cp_tot_seqused_k,
                 mask_mod=mask_mod, block_sparse_tensors=block_sparse_tensors,
                 aux_tensors=aux_tensors, aux_tensor_leading_dims=aux_tensor_leading_dims,
                 dynamic_causal=dynamic_causal)
    for name, value in named.items():
        if value is not None:
            raise NotImplementedError(f"flash_cann: {name} is not supported: "
                                      f"{_UNSERVED[name]}; pass None")
    if (cp_world_size, cp_rank) != (1, 0):
        raise NotImplementedError(f"flash_cann: cp_world_size={cp_world_size!r}, cp_rank="
                                  f"{cp_rank!r}: {_UNSERVED['cp_tot_seqused_k']}; pass 1 and 0")
    if (cu_seqlens_k is None) == (seqused_k is None):
        raise ValueError("flash_cann: pass exactly one of cu_seqlens_k (packed keys) and "
                         "seqused_k (a KV cache read), as vLLM's adapter requires")
    if block_table is not None and seqused_k is None:
        raise ValueError("flash_cann: block_table needs seqused_k (each sequence's keys), as "
                         "vLLM's adapter requires")
    flash_attn_3.check_descale(q, q_descale=q_descale, k_descale=k_descale,
                               v_descale=v_descale)
    if scheduler_metadata is not None:
        require_tensor(scheduler_metadata, "scheduler_metadata")
    _flag(return_attn_probs, "return_attn_probs")
    sinks = None if s_aux is None else require_tensor(s_aux, "s_aux").float()
    out, lse = interface.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, (-1, -1) if window_size is None else window_size, softcap,
        alibi_slopes, deterministic, False, block_table, seqused_k=seqused_k,
        return_softmax_lse=True, out=out, num_splits=num_splits, sinks=sinks)
    return (out, lse) if _flag(return_softmax_lse, "return_softmax_lse") else out
