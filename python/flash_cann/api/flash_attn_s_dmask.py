"""flash-attn 2's S_dmask layout: what its kernel returns with ``return_attn_probs=True``
and dropout, which flash-attn's own tests (tests/test_flash_attn.py) re-normalise.

flash-attn's forward kernel walks the keys in blocks of :func:`_get_block_size_n`
columns from the last block to the first, keeping each row's running maximum m of the
scaled scores; for key block j it stores exp(S - m_j), m_j being the maximum over blocks
j, j + 1, ..., last (the running maximum once block j is in). Dropped entries are
negated. The tensor is (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to
128); the rows and columns past the sequence are padding (zeros here).

flash_cann's own functions return the normalised probabilities P = exp(S - lse) instead
(``s_dmask="probabilities"``, the default). Both are derived from P here: with
M_j = max(P over blocks j..last), exp(S - m_j) = P / M_j, so the layout needs no scores.
"""

from __future__ import annotations

import torch

# flash-attn pads S_dmask's rows and columns to its kernels' multiple of 128.
_ROUND = 128
LAYOUTS = ("probabilities", "flash_attn")


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """flash-attn 2.8's key-block size of its forward kernel (its tests split S_dmask's
    columns by it): the table of flash_attn_interface._get_block_size_n, whose only device
    dependence is sm86 / sm89 (compute capability 8.x, x > 0) at head_dim 97..128. Any
    device other than such a CUDA GPU (cpu, npu, sm80, sm90) takes the other branch."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not 0 < head_dim <= 256:
        raise ValueError(f"flash_cann: _get_block_size_n: head_dim must be an int in [1, 256] "
                         f"(got {head_dim!r})")
    device = torch.device(device) if isinstance(device, (str, int)) else device
    is_sm8x = False
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        is_sm8x = major == 8 and minor > 0
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        if is_sm8x:
            return 64 if (not is_dropout and is_causal) else 32
        return 32 if is_dropout else 64
    return 64


def check_layout(s_dmask) -> str:
    if s_dmask not in LAYOUTS:
        raise ValueError(f"flash_cann: s_dmask must be one of {', '.join(map(repr, LAYOUTS))} "
                         f"(got {s_dmask!r})")
    return s_dmask


def flash_attn_layout(probs: torch.Tensor, keep: torch.Tensor, head_dim: int,
                      causal: bool) -> torch.Tensor:
    """flash-attn's S_dmask (module docstring) from the probabilities ``probs`` (batch,
    heads, seqlen_q, seqlen_k), >= 0, and the dropout ``keep`` mask of the same shape."""
    block = _get_block_size_n(probs.device, head_dim, True, causal)
    *lead, seqlen_q, seqlen_k = probs.shape
    blocks = -(-seqlen_k // block)
    tiles = torch.nn.functional.pad(probs, (0, blocks * block - seqlen_k)).view(
        *lead, seqlen_q, blocks, block)
    # M_j: the maximum over blocks j..last (the kernel walks the blocks right to left)
    running = tiles.amax(-1).flip(-1).cummax(-1).values.flip(-1)
    # a block whose running maximum is 0 sees no key from there on: it stores 0
    scaled = tiles / torch.where(running > 0, running, 1.0).unsqueeze(-1)
    unnormalised = scaled.flatten(-2)[..., :seqlen_k]
    signed = torch.where(keep, unnormalised, -unnormalised)
    rows, cols = (-(-n // _ROUND) * _ROUND for n in (seqlen_q, seqlen_k))
    return torch.nn.functional.pad(signed, (0, cols - seqlen_k, 0, rows - seqlen_q))
