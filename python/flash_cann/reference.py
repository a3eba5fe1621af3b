"""The oracle: a materialising attention, for tests and the demo's check only.

It forms the whole seqlen_q x seqlen_k score matrix (O(N^2) memory), computes in
float64 by default, and follows the op contract's conventions: bottom-right causal,
key_padding_mask True = attend, rows that see no key give out = 0, lse = -inf and
zero gradients. Gradients come from autograd through it. ``compute_dtype`` runs the
same arithmetic in another precision: the honest baseline for tolerances.
"""

from __future__ import annotations

import torch

from . import layout as layouts
from .checks import accumulator_dtype


def visible(seqlen_q: int, seqlen_k: int, causal: bool, key_padding_mask=None,
            device=None) -> torch.Tensor:
    """Boolean (batch|1, 1, seqlen_q, seqlen_k): which key each query row may attend."""
    vis = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal:
        vis = torch.ones_like(vis).tril(diagonal=seqlen_k - seqlen_q)
    vis = vis.view(1, 1, seqlen_q, seqlen_k)
    if key_padding_mask is not None:
        vis = vis & key_padding_mask.bool().view(-1, 1, 1, seqlen_k)
    return vis


def attention(query, key, value, key_padding_mask=None, *, scale: float, causal: bool = False,
              layout: str = "BNSD", compute_dtype: torch.dtype = torch.float64):
    """Return (out in query's dtype and layout, lse (batch, heads_q, seqlen_q) in the
    accumulator dtype, as the op does). Differentiable through autograd.

    ``compute_dtype`` float64 gives the oracle. A 16-bit ``compute_dtype`` gives the
    same-precision baseline: every intermediate (scores, probabilities, output) is
    stored in that dtype while products and sums accumulate in float32, as GPU and
    NPU matrix units do."""
    work = torch.promote_types(compute_dtype, torch.float32)

    def stored(t: torch.Tensor) -> torch.Tensor:
        return t.to(compute_dtype).to(work)

    q, k, v = (stored(layouts.to_bnsd(t, layout).to(work)) for t in (query, key, value))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = stored(torch.matmul(q, k.transpose(-1, -2)) * scale)
    vis = visible(q.shape[2], k.shape[2], causal, key_padding_mask, q.device)
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m).detach()
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    l_safe = torch.where(l > 0, l, torch.ones_like(l))  # keeps log's gradient finite
    out = torch.matmul(stored(p / l_safe), v)
    lse = torch.where(l > 0, m + torch.log(l_safe), torch.full_like(l, float("-inf")))
    lse = lse.squeeze(-1).to(accumulator_dtype(query.dtype))
    return layouts.from_bnsd(out.to(query.dtype), layout), lse
