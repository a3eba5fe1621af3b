"""CPU backend: FlashAttention-2 written with PyTorch tensor ops.

The algorithm is FA2's (Dao, 2023), vectorised over batch and heads:

forward, per query block:   m = -inf, l = 0, acc = 0        (fp32 running state)
    per key block:          S = scale * Q Kᵀ, masked
                            m' = max(m, rowmax S);  P = exp(S - m')
                            l = l * exp(m - m') + rowsum P
                            acc = acc * exp(m - m') + P V
    epilogue:               out = acc / l,  lse = m + log l

backward, per key block:    (dK, dV accumulated for the block)
    per query block:        P = exp(S - lse)                  (recomputed, never stored)
                            dV += Pᵀ dO;  dP = dO Vᵀ
                            dS = P * (dP - D),  D = rowsum(dO * O) - dLSE
                            dQ += scale * dS K;  dK += scale * dSᵀ Q

Extra memory is O(seqlen): the outputs, the fp32 dQ accumulator and one
(block_q x block_k) score tile per (batch, head); the seqlen_q x seqlen_k matrix is
never formed. GQA folds the query heads of a group into the rows of a tile, so K and
V are read, never copied per head. Rows that see no key keep m = -inf and produce
out = 0, lse = -inf and zero gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import layout as layouts
from ..checks import accumulator_dtype

BLOCK_Q = 128
BLOCK_K = 256
_NEG_INF = float("-inf")


def available() -> bool:
    return True


def _grouped(t: torch.Tensor, layout: str, heads_kv: int) -> torch.Tensor:
    """(batch, heads_kv, group, seqlen, head_dim) view of a query-shaped tensor."""
    return layouts.to_bnsd(t, layout).unflatten(1, (heads_kv, -1))


def _block_mask(key_padding_mask, causal: bool, offset: int,
                i0: int, i1: int, j0: int, j1: int) -> torch.Tensor | None:
    """Boolean 'masked out' tile broadcastable to (batch, heads_kv, group, bq, bk),
    or None when every score of the tile is visible."""
    masked = None
    if causal and j1 - 1 > i0 + offset:  # the tile crosses the causal diagonal
        rows = torch.arange(i0, i1).unsqueeze(1)
        cols = torch.arange(j0, j1).unsqueeze(0)
        masked = cols > rows + offset
    if key_padding_mask is not None:
        padded = ~key_padding_mask[:, j0:j1].view(-1, 1, 1, 1, j1 - j0)
        masked = padded if masked is None else masked | padded
    return masked


class _Sizes(NamedTuple):
    b: int       # batch
    hq: int      # query heads
    hk: int      # key/value heads
    g: int       # query heads per key/value head
    sq: int      # query rows
    sk: int      # keys
    d: int       # head_dim
    offset: int  # sk - sq: query i sees key j iff j <= i + offset (causal)
    acc: torch.dtype


def _sizes(query, key, layout: str) -> _Sizes:
    b, hq, sq, d = layouts.sizes(query, layout)
    hk, sk = layouts.sizes(key, layout)[1:3]
    return _Sizes(b, hq, hk, hq // hk, sq, sk, d, sk - sq, accumulator_dtype(query.dtype))


def _key_range(causal: bool, offset: int, i1: int, seqlen_k: int) -> int:
    """End of the keys visible to query rows < i1 (bottom-right aligned causal)."""
    return min(seqlen_k, i1 + offset) if causal else seqlen_k


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant=None, block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    b, hq, hk, g, sq, sk, d, offset, acc_dtype = _sizes(query, key, layout)
    q = _grouped(query, layout, hk)
    k = layouts.to_bnsd(key, layout)
    v = layouts.to_bnsd(value, layout)
    out = torch.zeros_like(query, memory_format=torch.contiguous_format)
    lse = torch.full((b, hq, sq), _NEG_INF, dtype=acc_dtype)
    out_g, lse_g = _grouped(out, layout, hk), lse.view(b, hk, g, sq)

    for i0 in range(0, sq, block_q):
        i1 = min(i0 + block_q, sq)
        bq = i1 - i0
        k_end = _key_range(causal, offset, i1, sk)
        if k_end <= 0:
            continue  # no query row of this block sees a key: out 0, lse -inf
        # Stage: load the query tile once, heads of a group folded into rows.
        q_tile = q[:, :, :, i0:i1].to(acc_dtype).reshape(b, hk, g * bq, d)
        m = torch.full((b, hk, g * bq), _NEG_INF, dtype=acc_dtype)
        l = torch.zeros(b, hk, g * bq, dtype=acc_dtype)
        acc = torch.zeros(b, hk, g * bq, d, dtype=acc_dtype)
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, k_end)
            v_tile = v[:, :, j0:j1].to(acc_dtype)
            # Stage: scores S = scale * Q Kᵀ, masked in place.
            s = torch.matmul(q_tile, k[:, :, j0:j1].to(acc_dtype).transpose(-1, -2)).mul_(scale)
            masked = _block_mask(key_padding_mask, causal, offset, i0, i1, j0, j1)
            if masked is not None:
                s.view(b, hk, g, bq, j1 - j0).masked_fill_(masked, _NEG_INF)
            # Stage: online softmax; a row with no visible key so far keeps m = -inf.
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(m_new == _NEG_INF, 0.0, m_new)
            p = s.sub_(m_safe.unsqueeze(-1)).exp_()
            alpha = torch.exp(m - m_safe)
            l.mul_(alpha).add_(p.sum(dim=-1))
            acc.mul_(alpha.unsqueeze(-1)).add_(torch.matmul(p, v_tile))
            m = m_new
        # Epilogue: normalise once; rows with l == 0 saw no key.
        seen = l > 0
        acc.div_(torch.where(seen, l, 1.0).unsqueeze(-1))
        out_g[:, :, :, i0:i1] = acc.view(b, hk, g, bq, d)
        lse_g[:, :, :, i0:i1] = torch.where(seen, m + torch.log(l), _NEG_INF).view(b, hk, g, bq)
    return out, lse


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool = False,
             variant=None, block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    del deterministic  # this backward is always deterministic (no atomics)
    b, hq, hk, g, sq, sk, d, offset, acc_dtype = _sizes(query, key, layout)
    q, do = _grouped(query, layout, hk), _grouped(grad_out, layout, hk)
    k = layouts.to_bnsd(key, layout)
    v = layouts.to_bnsd(value, layout)
    # Preprocess: D = rowsum(dO * O) - dLSE, and an lse that turns unseen rows' P into 0.
    delta = (grad_out.to(acc_dtype) * out.to(acc_dtype)).sum(-1)
    delta = layouts.to_bnsd(delta.unsqueeze(-1), layout).squeeze(-1)  # (b, hq, sq)
    if grad_softmax_lse is not None:
        delta = delta - grad_softmax_lse
    lse = torch.where(softmax_lse == _NEG_INF, float("inf"), softmax_lse)
    delta, lse = delta.reshape(b, hk, g, sq), lse.reshape(b, hk, g, sq)

    dq = torch.zeros(b, hk, g, sq, d, dtype=acc_dtype)
    dk = torch.empty_like(key, memory_format=torch.contiguous_format)
    dv = torch.empty_like(value, memory_format=torch.contiguous_format)
    dk_h, dv_h = layouts.to_bnsd(dk, layout), layouts.to_bnsd(dv, layout)

    for j0 in range(0, sk, block_k):
        j1 = min(j0 + block_k, sk)
        k_tile, v_tile = k[:, :, j0:j1].to(acc_dtype), v[:, :, j0:j1].to(acc_dtype)
        dk_acc = torch.zeros(b, hk, j1 - j0, d, dtype=acc_dtype)
        dv_acc = torch.zeros(b, hk, j1 - j0, d, dtype=acc_dtype)
        # Causal: query rows i < j0 - offset see none of these keys.
        first_q = max(0, j0 - offset) if causal else 0
        for i0 in range(first_q - first_q % block_q, sq, block_q):
            i1 = min(i0 + block_q, sq)
            bq = i1 - i0
            q_tile = q[:, :, :, i0:i1].to(acc_dtype).reshape(b, hk, g * bq, d)
            # contiguous(): dO is often an expanded (stride-0) gradient, which bmm
            # would otherwise walk element by element.
            do_tile = do[:, :, :, i0:i1].to(acc_dtype).contiguous().view(b, hk, g * bq, d)
            # Stage: recompute P = exp(scale * Q Kᵀ - lse) from the saved lse.
            s = torch.matmul(q_tile, k_tile.transpose(-1, -2)).mul_(scale)
            masked = _block_mask(key_padding_mask, causal, offset, i0, i1, j0, j1)
            if masked is not None:
                s.view(b, hk, g, bq, j1 - j0).masked_fill_(masked, _NEG_INF)
            p = s.sub_(lse[:, :, :, i0:i1].reshape(b, hk, g * bq, 1)).exp_()
            # Stage: dV += Pᵀ dO (the group's rows sum into the shared kv head).
            dv_acc.add_(torch.matmul(p.transpose(-1, -2), do_tile))
            # Stage: dS = P * (dO Vᵀ - D).
            dp = torch.matmul(do_tile, v_tile.transpose(-1, -2))
            ds = p.mul_(dp.sub_(delta[:, :, :, i0:i1].reshape(b, hk, g * bq, 1)))
            # Stage: dQ += scale * dS K;  dK += scale * dSᵀ Q.
            dq[:, :, :, i0:i1] += torch.matmul(ds, k_tile).view(b, hk, g, bq, d).mul_(scale)
            dk_acc.add_(torch.matmul(ds.transpose(-1, -2), q_tile), alpha=scale)
        dk_h[:, :, j0:j1] = dk_acc
        dv_h[:, :, j0:j1] = dv_acc
    dq_out = torch.empty_like(query, memory_format=torch.contiguous_format)
    _grouped(dq_out, layout, hk).copy_(dq)
    return dq_out, dk, dv
