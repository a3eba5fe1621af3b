"""Hugging Face transformers: ``attn_implementation="fa_cann"``.

    import flash_cann  # registers "fa_cann" once transformers' modeling code is imported
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fa_cann")

Not "flash_cann": transformers treats every implementation name containing "flash" as a
flash-attn kernel to load (``utils/generic.py`` ``is_flash_attention_requested``, then
``lazy_import_flash_attention``), which fails for any other function.

``import flash_cann`` does not import transformers: it asks
(flash_cann.integrations.post_import) to run :func:`register_attention` when
``transformers.modeling_utils`` (home of ``AttentionInterface``) is imported and
:func:`register_mask` when ``transformers.masking_utils`` is, or at once if they already
are. The mask is transformers' own flash-attention mask: the 2-D padding mask
(batch, kv_length), True = attend, or None when nothing is padded -- flash_cann's
``key_padding_mask``.

:func:`flash_cann_attention_forward` takes what transformers' flash path takes, with its
meaning: causality from the module (bottom-right aligned, as the KV cache needs), a
``sliding_window`` of W keys (the query and the W - 1 before it; both sides when not
causal), ``softcap``, ``dropout`` (transformers passes 0 in eval mode), and packed
sequences either as ``cu_seq_lens_q/k`` + ``max_length_q/k`` kwargs or as
``position_ids`` that restart within one row (a padding-free collator), and attention
sinks (``s_aux``: gpt-oss's per-head ``sinks`` parameter, flash_cann's ``sinks``, its
gradient included). GQA/MQA pass the key/value heads as they are (no repeat_kv), on
whichever backend serves the tensors' device. Masks other than a padding mask are
refused.
"""

from __future__ import annotations

import torch

from ..api.interface import attention, flash_attn_varlen_func

NAME = "fa_cann"  # see the module docstring: no "flash" in it


def _refuse(condition: bool, what: str) -> None:
    if condition:
        raise NotImplementedError(f"flash_cann (transformers attn_implementation={NAME!r}): "
                                  f"{what}")


def _window(sliding_window: int | None, causal: bool) -> tuple[int, int]:
    """transformers' sliding_window counts the query itself (W keys, so W - 1 to the
    left), as in its eager masks; without causality the window is symmetric, as its
    flash path makes it. Passed even when it covers every key here: the op reads such a
    bound as unbounded itself, and under context parallelism the keys here are one
    shard of a longer sequence (flash_cann.distributed)."""
    if sliding_window is None:
        return (-1, -1)
    return (sliding_window - 1, 0 if causal else sliding_window - 1)


def _packed_cu_seqlens(position_ids: torch.Tensor | None, batch: int, length: int):
    """(cu_seqlens, max_seqlen) of the sequences packed in one row, where the positions
    restart (a padding-free collator's position_ids), or None if the row is one sequence.
    Reads the positions: one host sync, as transformers' own check."""
    if position_ids is None or batch != 1 or length == 1:
        return None
    positions = position_ids.reshape(-1)
    starts = (positions == positions.min()).nonzero().flatten()
    if len(starts) == 1:
        return None
    cu_seqlens = torch.cat((starts, starts.new_tensor([positions.numel()]))).to(torch.int32)
    return cu_seqlens, int(cu_seqlens.diff().max())


def _varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_q, max_k, **options):
    """(batch, heads, seq, dim) tensors whose tokens form packed sequences: flash-attn's
    varlen call on the flattened tokens, returned as (batch, seq, heads, dim)."""
    q, k, v = (t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])
               for t in (query, key, value))
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q.to(torch.int32),
                                 cu_seqlens_k.to(torch.int32), int(max_q), int(max_k), **options)
    return out.view(query.shape[0], query.shape[2], *out.shape[-2:])


def flash_cann_attention_forward(module: torch.nn.Module, query: torch.Tensor,
                                 key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: torch.Tensor | None, scaling: float | None = None,
                                 dropout: float = 0.0, sliding_window: int | None = None,
                                 softcap: float | None = None, s_aux=None, **kwargs):
    """transformers' attention-function contract: query (batch, heads, q_len, head_dim),
    key/value (batch, kv_heads, kv_len, head_dim), the padding mask of
    ``flash_attention_mask``; returns (batch, q_len, heads, head_dim) and no weights."""
    _refuse(attention_mask is not None and attention_mask.dim() != 2,
            f"only padding masks (batch, kv_len) are supported, got a "
            f"{attention_mask.dim() if attention_mask is not None else 0}-D mask")
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
    # The sinks are a parameter in the model's dtype; the op takes them in the accumulator
    # dtype (float32), and the cast passes their gradient back.
    sinks = None if s_aux is None else s_aux.to(torch.promote_types(query.dtype, torch.float32))
    options = dict(softmax_scale=scaling, causal=causal, dropout_p=float(dropout),
                   window_size=_window(sliding_window, causal),
                   softcap=0.0 if softcap is None else float(softcap), sinks=sinks)
    # transformers' precedence: a padding mask, then explicit cu_seq_lens, then positions.
    if attention_mask is None:
        packed = (kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k"),
                  kwargs.get("max_length_q"), kwargs.get("max_length_k"))
        if all(x is not None for x in packed):
            return _varlen(query, key, value, *packed, **options), None
        from_positions = _packed_cu_seqlens(kwargs.get("position_ids"), query.shape[0],
                                            query.shape[2])
        if from_positions is not None:
            cu_seqlens, max_seqlen = from_positions
            return _varlen(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                           **options), None
    out = attention(query, key, value, layout="BNSD", causal=causal, scale=scaling,
                    key_padding_mask=attention_mask, window_size=options["window_size"],
                    softcap=options["softcap"], dropout_p=options["dropout_p"], sinks=sinks)
    return out.transpose(1, 2), None


def register_attention(modeling_utils) -> None:
    """Register the attention function with ``modeling_utils.AttentionInterface``."""
    modeling_utils.AttentionInterface.register(NAME, flash_cann_attention_forward)


def register_mask(masking_utils) -> None:
    """Register transformers' flash-attention mask (a padding mask) under the same name."""
    masking_utils.AttentionMaskInterface.register(NAME, masking_utils.flash_attention_mask)


def register() -> None:
    """Register both now, importing transformers' modules (``import flash_cann`` does it
    lazily; this is for code that wants it explicit)."""
    import transformers.masking_utils
    import transformers.modeling_utils

    register_attention(transformers.modeling_utils)
    register_mask(transformers.masking_utils)
