"""torch_npu.npu_fusion_attention's masks, in flash_cann's terms.

Huawei's op describes which scores survive with an ``atten_mask`` (True / 1 = masked
OUT), a ``sparse_mode`` and a band ``pre_tockens`` / ``next_tockens``. flash_cann states
the same things as a bottom-right aligned window ``(left, right)`` (-1 = unbounded),
``causal`` and a ``key_padding_mask`` (True = attend). This module translates exactly or
refuses; it never approximates.

Positions: query row i, key column j, and ``d = j - i - (seqlen_k - seqlen_q)``, the
distance right of the bottom-right diagonal. flash_cann's window keeps ``-left <= d <=
right``. A band whose right bound is left of that diagonal (``right < 0``: Huawei's
negative next_tockens, or left-up causal with seqlen_q < seqlen_k) keeps no key beyond
column ``seqlen_k + right - 1``; dropping those keys (a view) moves the diagonal onto
the band's edge, so it becomes window ``(left + right, 0)`` on the shorter key set.
Likewise a band that starts right of the diagonal (``left < 0``: negative pre_tockens,
or sparse_mode 0's top-left band with seqlen_q > seqlen_k) leaves the last ``-left``
query rows without a key: they are dropped from the call and come back as output 0,
lse -inf (what flash_cann gives any row that sees no key), and the rest is window
``(0, right + left)``.

One band needs two calls. flash_cann's window follows flash-attn 2.8, where a bound >=
seqlen_k is no bound (contract.variant.window_bounds); on the right that drops a bound
``seqlen_k <= right < seqlen_q - 1`` that still hides keys from the first rows (Huawei's
left-up causal, right = S1 - S2, with S1 >= 2 * S2; a band whose next_tockens lies in
[S2, S1 - 1); a full top-left causal mask with S1 >= 2 * S2). Row i sees every key once
``i >= seqlen_q - 1 - right``, so the rows are split at ``m = seqlen_q - right``: rows ``[0, m)`` are a call of
their own whose bottom-right diagonal is the band's right edge (``d' = d - right``:
window ``(left + right, 0)``, i.e. causal), and rows ``[m, seqlen_q)`` keep ``d``
unchanged (``m + right = seqlen_q``: the same diagonal) and see every key up to the last:
window ``(left, -1)``. On the left no such case exists: ``d >= -(seqlen_k - 1)`` always,
so a left bound >= seqlen_k - 1 is genuinely no bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# sparse_mode 2, 3, 4, 7 and 8 take this fixed mask instead of a full one: the upper
# triangle (above the diagonal) of a 2048 x 2048 matrix set, i.e. masked out.
COMPRESSED_MASK_SIZE = 2048


@dataclass(frozen=True)
class Band:
    """A problem's visibility as flash_cann calls: keep the first ``queries`` query rows
    and ``keys`` keys (None: all; the rows dropped see no key: output 0, lse -inf), then
    the window ``(window_left, window_right)``. With ``split``, rows ``[0, split)`` are a
    call of their own with the window ``(split_left, 0)`` and the window applies to rows
    ``[split, queries)`` (module docstring)."""

    keys: int | None
    window_left: int
    window_right: int
    queries: int | None = None
    split: int | None = None
    split_left: int = -1

    def op_arguments(self) -> dict:
        """torch.ops.flash_cann.fwd's causal and window (of the rows after ``split``)."""
        return _op_arguments(self.window_left, self.window_right)

    def row_blocks(self, seqlen_q: int) -> list[tuple[int, int, dict]]:
        """``(first_row, rows, op_arguments)`` of each call, in row order; the rows after
        the last block (``seqlen_q - queries``) see no key."""
        rows = seqlen_q if self.queries is None else self.queries
        if self.split is None:
            return [(0, rows, self.op_arguments())]
        return [(0, self.split, _op_arguments(self.split_left, 0)),
                (self.split, rows - self.split, self.op_arguments())]


def _op_arguments(window_left: int, window_right: int) -> dict:
    """A window whose right edge is the diagonal is passed as plain ``causal`` (right
    bound -1): the same scores, and a backend without the window feature still takes it."""
    causal = window_right == 0
    return dict(causal=causal, window_left=window_left,
                window_right=-1 if causal else window_right)


def bottom_right_band(left: int | None, right: int, seqlen_q: int, seqlen_k: int,
                      left_name: str, right_name: str) -> Band:
    """The band ``-left <= d <= right`` (``left`` None: unbounded) as a flash_cann Band.

    A negative ``right`` drops the keys no row sees, a negative ``left`` the last query
    rows, which see no key (module docstring); the band then starts at the new
    bottom-right diagonal."""
    keys = queries = None
    if right < 0:
        keys = seqlen_k + right
        if keys < 1:
            raise ValueError(f"flash_cann: {right_name}={right} hides every key: "
                             f"|{right_name}| must be < the key sequence length {seqlen_k}")
        if left is not None:
            left += right
        right = 0
    elif left is not None and left < 0:
        queries = seqlen_q + left
        if queries < 1:
            raise ValueError(f"flash_cann: {left_name}={left} hides every query row: "
                             f"|{left_name}| must be < the query sequence length {seqlen_q}")
        right += left
        left = 0
    if left is not None and left < 0 or right < 0:
        raise ValueError(f"flash_cann: the band is empty: {left_name} + {right_name} must be "
                         f">= 0 when one of them is negative")
    # A bound at or beyond the matrix's edge is no bound (-1): d lies in
    # [-(keys - 1), queries - 1]. (Huawei's default 2147483647 lands here, and never
    # reaches a kernel's int32; a full causal mask read off a tensor has left = keys - 1.)
    rows, columns = queries or seqlen_q, keys or seqlen_k
    window_left = -1 if left is None or left >= columns - 1 else left
    if right >= rows - 1:
        return Band(keys, window_left, -1, queries)
    if right < columns:
        return Band(keys, window_left, right, queries)
    # columns <= right < rows - 1: flash_cann would read this bound as none; split the
    # rows at m = rows - right (module docstring).
    split = rows - right
    split_left = -1 if left is None or left + right >= columns - 1 else left + right
    return Band(keys, window_left, -1, queries, split, split_left)


def check_compressed_mask(atten_mask: torch.Tensor, sparse_mode: int) -> None:
    """sparse_mode 2-4, 7, 8 read the fixed 2048 x 2048 upper-triangle mask only as a
    template; a different tensor would give wrong results on the NPU, so it is refused
    rather than ignored. (Comparing it costs one device-to-host read.)"""
    size = COMPRESSED_MASK_SIZE
    expected = f"the compressed ({size}, {size}) mask torch.triu(ones, diagonal=1)"
    if tuple(atten_mask.shape) != (size, size):
        raise NotImplementedError(
            f"flash_cann: atten_mask with sparse_mode={sparse_mode} must be {expected} "
            f"(got shape {tuple(atten_mask.shape)}); a full mask goes with sparse_mode 0 or 1")
    upper = torch.ones(size, size, dtype=torch.bool, device=atten_mask.device).triu(1)
    if not torch.equal(atten_mask.bool(), upper):
        raise ValueError(f"flash_cann: atten_mask with sparse_mode={sparse_mode} must be "
                         f"{expected} (True / 1 = masked out); this one differs")


def dense_mask_as_flash_cann(atten_mask: torch.Tensor, batch: int, heads: int,
                             seqlen_q: int, seqlen_k: int, top_left_band=None):
    """A full ``atten_mask`` (sparse_mode 0 or 1; True / 1 = masked out) as flash_cann
    arguments: ``(Band, key_padding_mask or None)``.

    ``top_left_band``: sparse_mode 0's (pre_tockens, next_tockens), which keep
    ``-pre <= j - i <= next`` on top of the mask (Huawei computes nothing outside it).

    flash_cann expresses "a band AND a per-batch key padding": the band is read off the
    visible scores' extreme diagonals, the padding off the columns with any visible
    score, and the result is compared with the whole mask; anything else
    (per-head masks, query padding, arbitrary patterns) is refused. This reads the mask
    on the host: one device-to-host synchronisation per call."""
    accepted = [(seqlen_q, seqlen_k), (1, 1, seqlen_q, seqlen_k), (batch, 1, seqlen_q, seqlen_k),
                (batch, heads, seqlen_q, seqlen_k)]
    if tuple(atten_mask.shape) not in accepted:
        raise ValueError(f"flash_cann: atten_mask must have shape (S1, S2), (1, 1, S1, S2), "
                         f"(B, 1, S1, S2) or (B, N1, S1, S2) = one of {accepted} "
                         f"(got {tuple(atten_mask.shape)})")
    masked = atten_mask.bool()
    if masked.dim() == 2:
        masked = masked.view(1, 1, seqlen_q, seqlen_k)
    if masked.shape[1] > 1 and not bool((masked == masked[:, :1]).all()):
        raise NotImplementedError("flash_cann: an atten_mask that differs between heads is "
                                  "not supported (flash_cann masks keys per batch, not per "
                                  "head); pass a (B, 1, S1, S2) mask")
    visible = ~masked[:, 0]                                         # (B or 1, S1, S2)
    i = torch.arange(seqlen_q, device=atten_mask.device).view(-1, 1)
    j = torch.arange(seqlen_k, device=atten_mask.device).view(1, -1)
    if top_left_band is not None:
        pre, nxt = top_left_band
        visible = visible & ((j - i) >= -pre) & ((j - i) <= nxt)
    d = j - i - (seqlen_k - seqlen_q)
    left = right = 0
    if bool(visible.any()):
        shown = d.expand_as(visible)[visible]
        left, right = -int(shown.min()), int(shown.max())
    keys_seen = visible.any(dim=1)                                  # (B or 1, S2)
    in_band = (d >= -left) & (d <= right)
    if not torch.equal(in_band & keys_seen.unsqueeze(1), visible):
        raise NotImplementedError(
            "flash_cann: this atten_mask cannot be expressed by flash_cann, which supports "
            "masks of the form 'band (causal, sliding window) AND per-batch key padding' "
            "(e.g. a [B, 1, 1, S2]-like padding pattern, torch.triu(ones, 1) causal masks, "
            "bands); per-query, per-head or arbitrary dense masks are refused. Pass key "
            "padding to flash_cann.attention(key_padding_mask=..., True = attend) or use "
            "sparse_mode 2/3/4")
    band = bottom_right_band(left, right, seqlen_q, seqlen_k, "atten_mask", "atten_mask")
    keys_seen = keys_seen[:, :band.keys]
    key_padding_mask = None if bool(keys_seen.all()) else keys_seen.expand(batch, -1)
    return band, key_padding_mask


FULL = Band(None, -1, -1)  # every key of every row: no mask
