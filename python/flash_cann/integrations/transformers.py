"""Hugging Face transformers: ``attn_implementation="fa_cann"``.

    import flash_cann.integrations.transformers  # registers "fa_cann"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fa_cann")

Not "flash_cann": transformers treats every implementation name containing "flash" as a
flash-attn kernel to load (``utils/generic.py`` ``is_flash_attention_requested``, then
``lazy_import_flash_attention``), which fails for any other function.

Importing this module registers the attention function with transformers'
``AttentionInterface`` and, under the same name, the mask its models build with
``AttentionMaskInterface``: transformers' own flash-attention mask, i.e. the 2-D padding
mask (batch, kv_length) with True = attend, or None when nothing is padded. That is
flash_cann's ``key_padding_mask``; causality comes from the attention module
(``module.is_causal``), aligned bottom-right as transformers' KV cache needs (new queries
are the last keys). GQA/MQA pass the key/value heads as they are (no repeat_kv), on
whichever backend serves the tensors' device (CPU, CUDA via Triton, NPU).

Refused, with the reason: dropout > 0 (flash_cann has no dropout: use ``model.eval()`` or
``attention_dropout=0``), a sliding window shorter than the keys, soft-capping, attention
sinks, and masks that are not a padding mask (4-D masks, packed sequences). The function
has no data-dependent Python branches, so ``torch.compile`` traces it whole.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from ..api.interface import attention

NAME = "fa_cann"  # see the module docstring: no "flash" in it


def _refuse(condition: bool, what: str) -> None:
    if condition:
        raise NotImplementedError(f"flash_cann (transformers attn_implementation={NAME!r}): "
                                  f"{what}")


def flash_cann_attention_forward(module: torch.nn.Module, query: torch.Tensor,
                                 key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: torch.Tensor | None, scaling: float | None = None,
                                 dropout: float = 0.0, sliding_window: int | None = None,
                                 softcap: float | None = None, s_aux=None, **kwargs):
    """transformers' attention-function contract: query (batch, heads, q_len, head_dim),
    key/value (batch, kv_heads, kv_len, head_dim), the padding mask of
    :func:`flash_attention_mask`; returns (batch, q_len, heads, head_dim) and no weights."""
    _refuse(dropout != 0.0, f"attention dropout {dropout} is not supported (flash_cann has no "
                            f"dropout): call model.eval() or set attention_dropout=0")
    _refuse(sliding_window is not None and key.shape[2] > sliding_window,
            f"a sliding window of {sliding_window} over {key.shape[2]} keys is not supported")
    _refuse(softcap is not None, "logit soft-capping is not supported")
    _refuse(s_aux is not None, "attention sinks (s_aux) are not supported")
    _refuse(attention_mask is not None and attention_mask.dim() != 2,
            f"only padding masks (batch, kv_len) are supported, got a "
            f"{attention_mask.dim() if attention_mask is not None else 0}-D mask")
    _refuse(kwargs.get("cu_seq_lens_q") is not None,
            "packed sequences (cu_seq_lens) are not supported")
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    out = attention(query, key, value, layout="BNSD", causal=bool(causal), scale=scaling,
                    key_padding_mask=attention_mask)
    return out.transpose(1, 2), None


def _register() -> None:
    AttentionInterface.register(NAME, flash_cann_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


_register()
