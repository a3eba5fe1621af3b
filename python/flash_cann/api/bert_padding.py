"""flash-attn 2.8's ``flash_attn.bert_padding``: moving between a padded batch
(batch, seqlen, ...) and the packed tokens (total_nnz, ...) that the varlen functions
take, in plain torch ops (differentiable through indexing; no custom kernels needed).

The attention mask has flash-attn's polarity: True / 1 = a real token, False / 0 =
padding. Tokens are packed in row-major order (sequence 0's tokens, then sequence 1's),
the order ``cu_seqlens`` describes.
"""

from __future__ import annotations

import torch

from ..contract.checks import require_tensor


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``input[indices]`` along the first axis: (first_axis_dim, ...) -> (len(indices),
    ...). The gradient scatters back into the rows that were picked."""
    require_tensor(input, "input")
    require_tensor(indices, "indices")
    if input.dim() < 1 or indices.dim() != 1:
        raise ValueError(f"flash_cann: index_first_axis needs input with at least one axis and "
                         f"1-D indices (got input {tuple(input.shape)}, indices "
                         f"{tuple(indices.shape)})")
    return input.index_select(0, indices)


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor,
                         first_axis_dim: int) -> torch.Tensor:
    """The inverse of :func:`index_first_axis`: a zero tensor (first_axis_dim, ...) with
    ``values`` written at rows ``indices``."""
    require_tensor(values, "values")
    require_tensor(indices, "indices")
    if indices.dim() != 1 or values.dim() < 1 or values.shape[0] != indices.shape[0]:
        raise ValueError(f"flash_cann: index_put_first_axis needs 1-D indices with one entry per "
                         f"row of values (got values {tuple(values.shape)}, indices "
                         f"{tuple(indices.shape)})")
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_put((indices,), values)


def _mask(mask, name: str, hidden_states: torch.Tensor) -> torch.Tensor:
    require_tensor(mask, name)
    if mask.dim() != 2 or tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"flash_cann: {name} must be (batch, seqlen) = "
                         f"{tuple(hidden_states.shape[:2])}, hidden_states' first two axes (got "
                         f"{tuple(mask.shape)})")
    return mask.bool()


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                unused_mask: torch.Tensor | None = None):
    """Pack the real tokens of a padded batch.

    Arguments:
        hidden_states: (batch, seqlen, ...)
        attention_mask: (batch, seqlen), bool / int: 1 = a real token, 0 = padding.
        unused_mask: (batch, seqlen), bool / int, optional: 1 = a slot that is allocated
            but unused; packed with the tokens, not counted in used_seqlens_in_batch.
    Return:
        hidden_states: (total_nnz, ...), the selected tokens.
        indices: (total_nnz,), int64: each token's position in the flattened batch.
        cu_seqlens: (batch + 1,), int32: cumulative lengths, starting with 0.
        max_seqlen_in_batch: int.
        used_seqlens_in_batch: (batch,), int32: the real tokens per sequence.
    """
    require_tensor(hidden_states, "hidden_states")
    if hidden_states.dim() < 2:
        raise ValueError(f"flash_cann: hidden_states must be (batch, seqlen, ...) (got "
                         f"{tuple(hidden_states.shape)})")
    used = _mask(attention_mask, "attention_mask", hidden_states)
    selected = used if unused_mask is None else used | _mask(unused_mask, "unused_mask",
                                                            hidden_states)
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    indices = selected.flatten().nonzero().flatten()
    cu_seqlens = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0  # host sync, as in flash-attn
    return (index_first_axis(hidden_states.flatten(0, 1), indices), indices, cu_seqlens,
            max_seqlen, used.sum(dim=-1, dtype=torch.int32))


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int,
              seqlen: int) -> torch.Tensor:
    """The inverse of :func:`unpad_input`: (total_nnz, ...) -> (batch, seqlen, ...), zeros
    where nothing was packed."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.view(batch, seqlen, *hidden_states.shape[1:])
