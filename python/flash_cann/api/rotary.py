"""flash-attn 2.8's ``flash_attn.layers.rotary.apply_rotary_emb``: rotary position
embeddings in plain torch ops (autograd differentiates them; no custom kernel).

Each pair of channels (x1, x2) of the first ``rotary_dim`` channels turns by the angle
of the token's position: (x1 cos - x2 sin, x1 sin + x2 cos). The pairs are
(i, i + rotary_dim / 2) by default (GPT-NeoX style) or (2i, 2i + 1) when ``interleaved``
(GPT-J style); channels past rotary_dim pass through.
"""

from __future__ import annotations

import torch

from ..contract.checks import reads_values, require_tensor


def _positions(x, cos, seqlen_offsets, cu_seqlens, max_seqlen) -> torch.Tensor:
    """Each token's row of cos / sin: (batch, seqlen) or, packed, (total,)."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        positions = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
        offsets = seqlen_offsets
        if isinstance(offsets, torch.Tensor):
            offsets = offsets.view(-1, 1)
    else:
        require_tensor(cu_seqlens, "cu_seqlens")
        starts = cu_seqlens[:-1].long()
        lengths = cu_seqlens.diff().long()
        sequence = torch.repeat_interleave(torch.arange(len(lengths), device=x.device),
                                           lengths, output_size=x.shape[0])
        positions = torch.arange(x.shape[0], device=x.device) - starts[sequence]
        offsets = seqlen_offsets
        if isinstance(offsets, torch.Tensor):
            offsets = offsets.long()[sequence]
        if max_seqlen is not None and x.shape[0] and reads_values(lengths) and \
                int(lengths.max()) > max_seqlen:
            raise ValueError(f"flash_cann: max_seqlen={max_seqlen} is shorter than the longest "
                             f"sequence in cu_seqlens ({int(lengths.max())})")
    positions = positions + offsets
    check_positions(positions, cos)
    return positions


def check_positions(positions: torch.Tensor, cos: torch.Tensor) -> None:
    """Every position has a row of cos / sin. Read only where that costs no device
    synchronisation (CPU tensors, not while tracing); on an accelerator the table's
    length is the caller's promise, as in flash-attn (rotate clamps, so nothing is read
    out of range)."""
    if positions.numel() and reads_values(positions) and int(positions.max()) >= cos.shape[0]:
        raise ValueError(f"flash_cann: cos / sin have {cos.shape[0]} rows, too few for position "
                         f"{int(positions.max())} (seqlen + seqlen_offsets must be <= "
                         f"seqlen_rotary)")


def check_tables(cos, sin, head_dim: int) -> None:
    """cos and sin are (seqlen_rotary, rotary_dim / 2) with rotary_dim <= head_dim."""
    cos, sin = require_tensor(cos, "cos"), require_tensor(sin, "sin")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"flash_cann: cos and sin must both be (seqlen_rotary, rotary_dim / 2) "
                         f"(got {tuple(cos.shape)} and {tuple(sin.shape)})")
    if 2 * cos.shape[1] > head_dim:
        raise ValueError(f"flash_cann: rotary_dim = 2 * cos.shape[1] = {2 * cos.shape[1]} must be "
                         f"<= headdim {head_dim}")


def rotate(x, cos, sin, positions: torch.Tensor, interleaved: bool, inplace: bool = False):
    """x (..., seqlen, nheads, headdim) with each token turned by the angle of its row of
    cos / sin (``positions``: x's shape without the last two dims), as apply_rotary_emb
    describes; no host read (positions past the table are clamped to its last row:
    check_positions refuses them where it can read them)."""
    half = cos.shape[1]
    rotary_dim = 2 * half
    positions = positions.clamp(0, cos.shape[0] - 1)
    # (..., 1, half): one angle per token, shared by the heads; math in x's dtype as
    # flash-attn's kernel loads cos / sin in it.
    cos_t = cos[positions].unsqueeze(-2).to(x.dtype)
    sin_t = sin[positions].unsqueeze(-2).to(x.dtype)
    rotated = x[..., :rotary_dim]
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    else:
        x1, x2 = rotated[..., :half], rotated[..., half:]
    out1, out2 = x1 * cos_t - x2 * sin_t, x1 * sin_t + x2 * cos_t
    turned = (torch.stack((out1, out2), dim=-1).flatten(-2) if interleaved
              else torch.cat((out1, out2), dim=-1))
    if inplace:
        x[..., :rotary_dim] = turned
        return x
    return torch.cat((turned, x[..., rotary_dim:]), dim=-1)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """
    Arguments:
        x: (batch_size, seqlen, nheads, headdim) if cu_seqlens is None,
            else (total_seqlen, nheads, headdim).
        cos, sin: (seqlen_rotary, rotary_dim / 2); rotary_dim <= headdim, even.
        interleaved: rotate pairs of even and odd channels (GPT-J style) instead of the
            1st and 2nd halves (GPT-NeoX style).
        inplace: write the result into x (and return it).
        seqlen_offsets: int or (batch_size,) tensor: each sequence starts at this row of
            cos / sin (inference with a KV cache).
        cu_seqlens: (batch + 1,) int32, optional: x holds packed sequences, each starting
            at position 0 (plus its offset).
        max_seqlen: int, optional with cu_seqlens: the longest sequence (checked).
    Return:
        out: the shape of x.
    """
    x, cos, sin = (require_tensor(t, n) for t, n in ((x, "x"), (cos, "cos"), (sin, "sin")))
    if x.dim() != (3 if cu_seqlens is not None else 4):
        raise ValueError(f"flash_cann: x must be (batch_size, seqlen, nheads, headdim), or "
                         f"(total_seqlen, nheads, headdim) with cu_seqlens (got "
                         f"{tuple(x.shape)})")
    check_tables(cos, sin, x.shape[-1])
    if isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, (int, torch.Tensor)):
        raise TypeError(f"flash_cann: seqlen_offsets must be an int or a (batch_size,) tensor "
                        f"(got {type(seqlen_offsets).__name__})")
    positions = _positions(x, cos, seqlen_offsets, cu_seqlens, max_seqlen)
    return rotate(x, cos, sin, positions, interleaved, inplace)
