"""The oracle: a materialising attention, for tests, the demo's check and the dropout
debug output (``return_attn_probs``) only.

It forms the whole seqlen_q x seqlen_k score matrix (O(N^2) memory), computes in
float64 by default, and follows the op contract's conventions (flash_cann.contract.variant
states them), written out directly from the definitions, sharing no code with the
backends: bottom-right causal and sliding window, key_padding_mask True = attend,
softcap, ALiBi, dropout by an explicit keep mask, attention sinks (one more logit in
each row's denominator), packed variable-length sequences (layout TND) one sequence at a
time. Rows that see no key give out = 0, lse = -inf (the sink's logit with sinks) and
zero gradients. Gradients come from autograd through it. ``compute_dtype`` runs the
same arithmetic in another precision: the honest baseline for tolerances.
"""

from __future__ import annotations

import torch

from . import layout as layouts
from .checks import accumulator_dtype
from .variant import PLAIN, Variant


def visible(seqlen_q: int, seqlen_k: int, causal: bool, key_padding_mask=None,
            device=None, window=(-1, -1)) -> torch.Tensor:
    """Boolean (batch|1, 1, seqlen_q, seqlen_k): which key each query row may attend."""
    i = torch.arange(seqlen_q, device=device).view(-1, 1)
    j = torch.arange(seqlen_k, device=device).view(1, -1)
    distance = j - (i + seqlen_k - seqlen_q)  # > 0: right of the (bottom-right) diagonal
    left, right = window
    vis = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal or right >= 0:
        vis &= distance <= (0 if causal else right)
    if left >= 0:
        vis &= distance >= -left
    vis = vis.view(1, 1, seqlen_q, seqlen_k)
    if key_padding_mask is not None:
        vis = vis & key_padding_mask.bool().view(-1, 1, 1, seqlen_k)
    return vis


def _scores(q, k, scale, variant: Variant, alibi_slopes, stored):
    """scale * Q Kᵀ, softcapped, ALiBi-biased: (batch, heads, seqlen_q, seqlen_k)."""
    s = stored(torch.matmul(q, k.transpose(-1, -2)) * scale)
    if variant.softcap > 0:
        s = stored(variant.softcap * torch.tanh(s / variant.softcap))
    if alibi_slopes is not None:
        seqlen_q, seqlen_k = s.shape[-2:]
        i = torch.arange(seqlen_q, device=s.device).view(-1, 1)
        j = torch.arange(seqlen_k, device=s.device).view(1, -1)
        distance = (i + seqlen_k - seqlen_q - j).abs().to(s.dtype)
        s = stored(s - alibi_slopes.to(s.dtype).view(*alibi_slopes.shape, 1, 1) * distance)
    return s


def _batched(query, key, value, key_padding_mask, scale, causal, layout, compute_dtype,
             variant: Variant, dropout_mask, probabilities_only=False):
    work = torch.promote_types(compute_dtype, torch.float32)

    def stored(t: torch.Tensor) -> torch.Tensor:
        return t.to(compute_dtype).to(work)

    q, k, v = (stored(layouts.to_bnsd(t, layout).to(work)) for t in (query, key, value))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    alibi = variant.alibi_slopes
    if alibi is not None:
        alibi = alibi.expand(q.shape[0], q.shape[1])
    s = _scores(q, k, scale, variant, alibi, stored)
    vis = visible(q.shape[2], k.shape[2], causal, key_padding_mask, q.device,
                  (variant.window_left, variant.window_right))
    s = s.masked_fill(~vis, float("-inf"))
    # A sequence with no key (packed: seqlen_k 0) has no max: -inf, as a row that sees none.
    m = (s.amax(dim=-1, keepdim=True) if s.shape[-1]
         else s.new_full((*s.shape[:-1], 1), float("-inf")))
    sink = None
    if variant.sinks is not None:
        # The sink: a logit per head that every row sees, with no value.
        sink = variant.sinks.to(work).view(1, -1, 1, 1)  # fp32 in every backend
        m = torch.maximum(m, sink)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m).detach()
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        l = l + torch.exp(sink - m)
    l_safe = torch.where(l > 0, l, torch.ones_like(l))  # keeps log's gradient finite
    probs = p / l_safe
    if probabilities_only:
        return probs
    if dropout_mask is not None:
        probs = probs * dropout_mask.to(work) / (1.0 - variant.dropout_p)
    out = torch.matmul(stored(probs), v)
    lse = torch.where(l > 0, m + torch.log(l_safe), torch.full_like(l, float("-inf")))
    lse = lse.squeeze(-1).to(accumulator_dtype(query.dtype))
    return layouts.from_bnsd(out.to(query.dtype), layout), lse


def _sequences(variant: Variant):
    """(b, query rows, key rows) slices of each packed sequence (TND)."""
    starts_q = variant.cu_seqlens_q.tolist()
    starts_k = variant.cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        yield b, slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])


def _sequence_variant(variant: Variant, b: int) -> Variant:
    slopes = variant.alibi_slopes
    return Variant(window_left=variant.window_left, window_right=variant.window_right,
                   softcap=variant.softcap, dropout_p=variant.dropout_p, sinks=variant.sinks,
                   alibi_slopes=None if slopes is None else slopes.expand(
                       len(variant.cu_seqlens_q) - 1, -1)[b:b + 1])


def attention(query, key, value, key_padding_mask=None, *, scale: float, causal: bool = False,
              layout: str = "BNSD", compute_dtype: torch.dtype = torch.float64,
              variant: Variant = PLAIN, dropout_mask=None):
    """Return (out in query's dtype and layout, lse in the accumulator dtype: (batch,
    heads_q, seqlen_q), or (heads_q, total_q) for TND), as the op does. Differentiable
    through autograd.

    ``variant``: the features (window, softcap, ALiBi slopes, dropout_p, sinks (the
    gradient reaches variant.sinks through autograd), and cu_seqlens for TND);
    ``dropout_mask``: which probabilities dropout keeps -- bool (batch, heads_q,
    seqlen_q, seqlen_k), for TND a list with one (heads_q, seqlen_q, seqlen_k)
    mask per sequence -- given explicitly, so that the oracle does not share the
    backends' random number generator. ``compute_dtype`` float64 gives the oracle; a
    16-bit one gives the same-precision baseline: every intermediate (scores,
    probabilities, output) is stored in that dtype while products and sums accumulate in
    float32, as GPU and NPU matrix units do."""
    if layout != layouts.PACKED:
        return _batched(query, key, value, key_padding_mask, scale, causal, layout,
                        compute_dtype, variant, dropout_mask)
    outs, lses = [], []
    for b, rows, keys in _sequences(variant):
        mask = None if dropout_mask is None else dropout_mask[b].unsqueeze(0)
        out, lse = _batched(query[rows].unsqueeze(0), key[keys].unsqueeze(0),
                            value[keys].unsqueeze(0), None, scale, causal, "BSND",
                            compute_dtype, _sequence_variant(variant, b), mask)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)


def probabilities(query, key, value, key_padding_mask=None, *, scale: float,
                  causal: bool = False, layout: str = "BNSD", variant: Variant = PLAIN,
                  compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The softmax probabilities P, (batch, heads_q, seqlen_q, seqlen_k) (before dropout);
    for TND (batch, heads_q, max_seqlen_q, max_seqlen_k), zero outside each sequence."""
    if layout != layouts.PACKED:
        return _batched(query, key, value, key_padding_mask, scale, causal, layout,
                        compute_dtype, variant, None, probabilities_only=True)
    batch = len(variant.cu_seqlens_q) - 1
    probs = torch.zeros(batch, query.shape[1], variant.max_seqlen_q, variant.max_seqlen_k,
                        dtype=torch.promote_types(compute_dtype, torch.float32),
                        device=query.device)
    for b, rows, keys in _sequences(variant):
        probs[b, :, :rows.stop - rows.start, :keys.stop - keys.start] = _batched(
            query[rows].unsqueeze(0), key[keys].unsqueeze(0), value[keys].unsqueeze(0), None,
            scale, causal, "BSND", compute_dtype, _sequence_variant(variant, b), None,
            probabilities_only=True)[0]
    return probs
