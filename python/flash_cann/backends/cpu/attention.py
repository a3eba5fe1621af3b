"""CPU backend: FlashAttention-2 written with PyTorch tensor ops.

The algorithm is FA2's (Dao, 2023), vectorised over batch and heads:

forward, per query block:   m = -inf, l = 0, acc = 0        (fp32 running state;
                                                             with sinks m = sink, l = 1)
    per visible key block:  S = scores(Q Kᵀ), masked        (see "scores" below)
                            m' = max(m, rowmax S);  P = exp(S - m')
                            l = l * exp(m - m') + rowsum P
                            acc = acc * exp(m - m') + (P ∘ Z) V
    epilogue:               out = acc / l,  lse = m + log l

backward, per key block:    (dK, dV accumulated for the block)
    per visible query block: P = exp(S - lse)                (recomputed, never stored)
                            dV += (P ∘ Z)ᵀ dO;  dP = (dO Vᵀ) ∘ Z
                            dS = P * (dP - D) * S',  D = rowsum(dO * O) - dLSE
                            dQ += scale * dS K;  dK += scale * dSᵀ Q
    sinks:                  dsink_h = -Σ_{b,i} exp(sink_h - lse_bhi) * D_bhi

scores (flash_cann.contract.variant states each feature): S = scale * Q Kᵀ, softcapped
(c * tanh(S / c); S' = 1 - tanh² is its derivative, else 1), minus the ALiBi distance
penalty, -inf where the key is hidden (causal / sliding window / padding). Z = the
dropout keep mask / (1 - p) (1 without dropout), drawn per tile from the counter-based
Philox of variant.keep_mask, so the backward regenerates it. Key blocks a query block
cannot see (and query blocks that cannot see a key block) are never visited: the cost of
a causal or windowed call follows the visible band.

Extra memory is O(seqlen): the outputs, the fp32 dQ accumulator and one
(block_q x block_k) score tile per (batch, head); the seqlen_q x seqlen_k matrix is
never formed. GQA folds the query heads of a group into the rows of a tile, so K and
V are read, never copied per head. Rows that see no key keep m = -inf and produce
out = 0, lse = -inf and zero gradients. Packed variable-length sequences (layout TND)
and KV caches run the same code one sequence at a time, on views (nothing is padded).

Threads: a call runs thousands of tile-sized ops. Left to torch's intra-op OpenMP team,
each op is a parallel region, and between regions the team's threads spin-wait; beside a
busy process on a small machine a spinning thread holds the core its sibling needs (fwd +
bwd at (1, 8, 4096, 64) went from 1.5 s to 15-22 s when torch, loaded before flash_cann,
kept OpenMP's default wait policy). So the backend does not depend on OpenMP's wait
policy: for the duration of a call, torch runs each op on one thread
(``torch.set_num_threads(1)``, restored afterwards; it is process-wide, so other Python
threads' ops run single-threaded meanwhile), and the backend spreads the blocks over
its own pool of ``torch.get_num_threads()`` worker threads, which block, never spin,
when idle (torch ops release the GIL). Forward: query blocks, the costliest first, each taken by
whichever worker is free (a worker slowed by another process does less). Backward: key
blocks, interleaved over the workers (a fixed assignment: each worker accumulates its
own dQ and the partial sums are added in worker order, so the result is bitwise
repeatable for a given thread count). benchmarks/cpu_contention.py measures it.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ...contract import layout as layouts
from ...contract.checks import accumulator_dtype
from ...contract.variant import PLAIN, Variant, keep_mask

BLOCK_Q = 128
BLOCK_K = 256
_NEG_INF = float("-inf")


def available() -> bool:
    return True


# ---------------------------------------------------------------------------------------
# Threads (see the module docstring)
# ---------------------------------------------------------------------------------------

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0


def _one_thread_per_op() -> None:
    torch.set_num_threads(1)


@contextlib.contextmanager
def _own_threads():
    """For the duration of a call: torch's ops on one thread each; yields the number of
    workers the call may spread its blocks over (torch's thread count before the call)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def _parts(threads: int, length: int, block: int) -> int:
    """How many workers share ``length`` rows in blocks: no more than there are blocks
    (at least one, which handles an empty sequence)."""
    return max(1, min(threads, -(-length // block)))


def _on_workers(work, parts: int) -> list:
    """[work(0, parts), ..., work(parts - 1, parts)], part 0 on the calling thread, the
    others on the pool's threads (their OpenMP settings are per thread, so each sets one
    thread per op when it starts)."""
    global _POOL, _POOL_SIZE
    if parts == 1:
        return [work(0, 1)]
    if _POOL_SIZE < parts - 1:  # torch.set_num_threads raised the count: a larger pool
        if _POOL is not None:
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(parts - 1, thread_name_prefix="flash_cann_cpu",
                                   initializer=_one_thread_per_op)
        _POOL_SIZE = parts - 1
    # Grad and inference mode are per thread: the workers take the caller's (a kernel
    # records nothing for autograd, and writes into inference tensors under inference_mode).
    inference = torch.is_inference_mode_enabled()

    def as_the_caller(part: int):
        with torch.inference_mode(inference), torch.no_grad():
            return work(part, parts)

    others = [_POOL.submit(as_the_caller, part) for part in range(1, parts)]
    return [work(0, parts)] + [future.result() for future in others]


def _grouped(t: torch.Tensor, layout: str, heads_kv: int) -> torch.Tensor:
    """(batch, heads_kv, group, seqlen, head_dim) view of a query-shaped tensor."""
    return layouts.to_bnsd(t, layout).unflatten(1, (heads_kv, -1))


# ---------------------------------------------------------------------------------------
# The score pipeline of one call (one sequence or one batch of equal-length sequences)
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Scores:
    """Everything a tile's scores depend on besides Q and K.

    ``batch_ids``: the batch (or sequence) index of each batch row, for ALiBi and the
    dropout counter; ``slopes``: ALiBi slopes (batch, heads_kv, group) or None; ``left``
    / ``right``: the window's bounds (-1 = none; causal makes right 0); ``sinks``: the
    sink logits (heads_kv, group) or None."""

    scale: float
    seqlen_q: int
    seqlen_k: int
    heads_kv: int
    group: int
    left: int
    right: int
    softcap: float
    slopes: torch.Tensor | None
    key_padding_mask: torch.Tensor | None
    dropout_p: float
    rng_state: torch.Tensor | None
    batch_ids: torch.Tensor
    sinks: torch.Tensor | None = None

    @property
    def diagonal(self) -> int:
        return self.seqlen_k - self.seqlen_q

    def key_span(self, i0: int, i1: int) -> tuple[int, int]:
        """Keys [lo, hi) that some query row of [i0, i1) may see."""
        lo = max(0, i0 + self.diagonal - self.left) if self.left >= 0 else 0
        hi = min(self.seqlen_k, i1 + self.diagonal + self.right) if self.right >= 0 \
            else self.seqlen_k
        return lo, hi

    def query_span(self, j0: int, j1: int) -> tuple[int, int]:
        """Query rows [lo, hi) that may see some key of [j0, j1)."""
        lo = max(0, j0 - self.diagonal - self.right) if self.right >= 0 else 0
        hi = min(self.seqlen_q, j1 - self.diagonal + self.left) if self.left >= 0 \
            else self.seqlen_q
        return lo, hi

    def _hidden(self, i0, i1, j0, j1) -> torch.Tensor | None:
        """Boolean 'hidden' tile broadcastable to (batch, heads_kv, group, bq, bk), or
        None when the tile is wholly visible."""
        hidden = None
        # A key's distance right of its row's diagonal: j - (i + diagonal).
        widest_right = (j1 - 1) - (i0 + self.diagonal)
        widest_left = j0 - (i1 - 1 + self.diagonal)
        if (self.right >= 0 and widest_right > self.right) or \
                (self.left >= 0 and widest_left < -self.left):
            distance = (torch.arange(j0, j1).unsqueeze(0)
                        - torch.arange(i0, i1).unsqueeze(1) - self.diagonal)
            hidden = torch.zeros(i1 - i0, j1 - j0, dtype=torch.bool)
            if self.right >= 0:
                hidden |= distance > self.right
            if self.left >= 0:
                hidden |= distance < -self.left
        if self.key_padding_mask is not None:
            padded = ~self.key_padding_mask[:, j0:j1].view(-1, 1, 1, 1, j1 - j0)
            hidden = padded if hidden is None else hidden | padded
        return hidden

    def tile(self, q_tile, k_tile, i0, i1, j0, j1):
        """(S, S') of a tile: the scores (batch, heads_kv, group * bq, bk), hidden ones
        -inf, and the softcap's derivative (None without softcap)."""
        s = torch.matmul(q_tile, k_tile.transpose(-1, -2)).mul_(self.scale)
        slope = None
        if self.softcap > 0:
            s = s.div_(self.softcap).tanh_()
            slope = 1.0 - s * s
            s = s.mul_(self.softcap)
        view = s.view(s.shape[0], self.heads_kv, self.group, i1 - i0, j1 - j0)
        if self.slopes is not None:
            rows = torch.arange(i0, i1, dtype=s.dtype).unsqueeze(1)
            cols = torch.arange(j0, j1, dtype=s.dtype).unsqueeze(0)
            penalty = (rows + self.diagonal - cols).abs_()
            view.sub_(self.slopes.to(s.dtype)[..., None, None] * penalty)
        hidden = self._hidden(i0, i1, j0, j1)
        if hidden is not None:
            view.masked_fill_(hidden, _NEG_INF)
        return s, slope

    def row_start(self, batch: int, rows: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, l) of the online softmax before the first key, (batch, heads_kv, group *
        rows): (-inf, 0), or with sinks (sink, 1): the sink is the first "key" every row
        sees, with no value."""
        shape = (batch, self.heads_kv, self.group * rows)
        if self.sinks is None:
            return torch.full(shape, _NEG_INF, dtype=dtype), torch.zeros(shape, dtype=dtype)
        m = self.sinks.to(dtype).view(1, self.heads_kv, self.group, 1).expand(
            batch, -1, -1, rows).reshape(shape)
        return m, torch.ones(shape, dtype=dtype)

    def keep(self, i0, i1, j0, j1, dtype) -> torch.Tensor | None:
        """Z of a tile: keep / (1 - p), (batch, heads_kv, group * bq, bk); None without
        dropout. The counter is (column, row, query head, batch index + offset)."""
        if self.dropout_p == 0:
            return None
        heads = torch.arange(self.heads_kv * self.group).view(1, self.heads_kv, self.group, 1, 1)
        kept = keep_mask(self.rng_state, self.dropout_p, self.batch_ids.view(-1, 1, 1, 1, 1),
                         heads, torch.arange(i0, i1).view(1, 1, 1, -1, 1),
                         torch.arange(j0, j1).view(1, 1, 1, 1, -1))
        return (kept.to(dtype) / (1 - self.dropout_p)).flatten(2, 3)


def _scores(scale, causal, variant: Variant, seqlen_q, seqlen_k, heads_kv, group,
            key_padding_mask, batch_ids, slopes) -> _Scores:
    if slopes is not None:
        slopes = slopes.reshape(-1, heads_kv, group)
    sinks = None if variant.sinks is None else variant.sinks.view(heads_kv, group)
    return _Scores(scale, seqlen_q, seqlen_k, heads_kv, group, variant.window_left,
                   0 if causal else variant.window_right, variant.softcap, slopes,
                   key_padding_mask, variant.dropout_p, variant.rng_state, batch_ids, sinks)


# ---------------------------------------------------------------------------------------
# Forward and backward of one batch of equal-length sequences (BNSD views)
# ---------------------------------------------------------------------------------------

def _forward_core(q, k, v, out_g, lse_g, sc: _Scores, block_q: int, block_k: int,
                  starts) -> None:
    """q, out_g: (batch, heads_kv, group, seqlen_q, head_dim); k, v: (batch, heads_kv,
    seqlen_k, head_dim); lse_g: (batch, heads_kv, group, seqlen_q). Writes out and lse
    of the query blocks starting at ``starts`` (each block's rows are its own, so
    workers may share one iterator of them)."""
    b, hk, g, sq, d = q.shape
    acc_dtype = lse_g.dtype
    for i0 in starts:
        i1 = min(i0 + block_q, sq)
        bq = i1 - i0
        lo, hi = sc.key_span(i0, i1)
        m, l = sc.row_start(b, bq, acc_dtype)
        if hi <= lo:
            # No query row of this block sees a key: out 0, lse -inf (the sink's logit
            # with sinks: m + log 1).
            out_g[:, :, :, i0:i1] = 0
            lse_g[:, :, :, i0:i1] = m.view(b, hk, g, bq)
            continue
        # Stage: load the query tile once, heads of a group folded into rows.
        q_tile = q[:, :, :, i0:i1].to(acc_dtype).reshape(b, hk, g * bq, d)
        acc = torch.zeros(b, hk, g * bq, d, dtype=acc_dtype)
        for j0 in range(lo, hi, block_k):
            j1 = min(j0 + block_k, hi)
            v_tile = v[:, :, j0:j1].to(acc_dtype)
            # Stage: scores, masked in place.
            s, _ = sc.tile(q_tile, k[:, :, j0:j1].to(acc_dtype), i0, i1, j0, j1)
            # Stage: online softmax; a row with no visible key so far keeps m = -inf.
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(m_new == _NEG_INF, 0.0, m_new)
            p = s.sub_(m_safe.unsqueeze(-1)).exp_()
            alpha = torch.exp(m - m_safe)
            l.mul_(alpha).add_(p.sum(dim=-1))
            keep = sc.keep(i0, i1, j0, j1, acc_dtype)
            acc.mul_(alpha.unsqueeze(-1)).add_(torch.matmul(p if keep is None else p * keep,
                                                            v_tile))
            m = m_new
        # Epilogue: normalise once; rows with l == 0 saw no key.
        seen = l > 0
        acc.div_(torch.where(seen, l, 1.0).unsqueeze(-1))
        out_g[:, :, :, i0:i1] = acc.view(b, hk, g, bq, d)
        lse_g[:, :, :, i0:i1] = torch.where(seen, m + torch.log(l), _NEG_INF).view(b, hk, g, bq)


def _backward_core(q, k, v, do, lse, delta, dq, dk_h, dv_h, sc: _Scores, block_q: int,
                   block_k: int, part: int = 0, parts: int = 1) -> None:
    """q, do: (batch, heads_kv, group, seqlen_q, head_dim); lse (+inf for rows that saw
    no key), delta: (batch, heads_kv, group, seqlen_q); dq: fp32 like q (accumulated);
    dk_h, dv_h: (batch, heads_kv, seqlen_k, head_dim) (written) -- for key blocks part,
    part + parts, ..."""
    b, hk, g, sq, d = q.shape
    sk = k.shape[2]
    acc_dtype = dq.dtype
    for j0 in range(part * block_k, sk, parts * block_k):
        j1 = min(j0 + block_k, sk)
        k_tile, v_tile = k[:, :, j0:j1].to(acc_dtype), v[:, :, j0:j1].to(acc_dtype)
        dk_acc = torch.zeros(b, hk, j1 - j0, d, dtype=acc_dtype)
        dv_acc = torch.zeros(b, hk, j1 - j0, d, dtype=acc_dtype)
        lo, hi = sc.query_span(j0, j1)
        for i0 in range(lo, hi, block_q):
            i1 = min(i0 + block_q, hi)
            bq = i1 - i0
            q_tile = q[:, :, :, i0:i1].to(acc_dtype).reshape(b, hk, g * bq, d)
            # contiguous(): dO is often an expanded (stride-0) gradient, which bmm
            # would otherwise walk element by element.
            do_tile = do[:, :, :, i0:i1].to(acc_dtype).contiguous().view(b, hk, g * bq, d)
            # Stage: recompute P = exp(S - lse) from the saved lse.
            s, cap_slope = sc.tile(q_tile, k_tile, i0, i1, j0, j1)
            p = s.sub_(lse[:, :, :, i0:i1].reshape(b, hk, g * bq, 1)).exp_()
            keep = sc.keep(i0, i1, j0, j1, acc_dtype)
            # Stage: dV += (P ∘ Z)ᵀ dO (the group's rows sum into the shared kv head).
            dv_acc.add_(torch.matmul((p if keep is None else p * keep).transpose(-1, -2),
                                     do_tile))
            # Stage: dS = P * ((dO Vᵀ) ∘ Z - D) * S'.
            dp = torch.matmul(do_tile, v_tile.transpose(-1, -2))
            if keep is not None:
                dp.mul_(keep)
            ds = p.mul_(dp.sub_(delta[:, :, :, i0:i1].reshape(b, hk, g * bq, 1)))
            if cap_slope is not None:
                ds.mul_(cap_slope)
            # Stage: dQ += scale * dS K;  dK += scale * dSᵀ Q.
            dq[:, :, :, i0:i1] += torch.matmul(ds, k_tile).view(b, hk, g, bq, d).mul_(sc.scale)
            dk_acc.add_(torch.matmul(ds.transpose(-1, -2), q_tile), alpha=sc.scale)
        dk_h[:, :, j0:j1] = dk_acc
        dv_h[:, :, j0:j1] = dv_acc


# ---------------------------------------------------------------------------------------
# The backend's entry points (called by flash_cann.contract.ops after the shared checks)
# ---------------------------------------------------------------------------------------

def _sequences(variant: Variant):
    """(index, query rows, key rows) of each packed sequence (layout TND)."""
    starts_q = variant.cu_seqlens_q.tolist()
    starts_k = variant.cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        yield b, slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])


def _as_batch(t: torch.Tensor) -> torch.Tensor:
    """A (tokens, heads, head_dim) slice as a batch of one, BSND."""
    return t.unsqueeze(0)


def forward(query, key, value, key_padding_mask, *, scale: float, causal: bool, layout: str,
            variant: Variant = PLAIN, block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    acc_dtype = accumulator_dtype(query.dtype)
    if layout == layouts.PACKED:
        lse = torch.empty(query.shape[1], query.shape[0], dtype=acc_dtype)
        for b, rows, keys in _sequences(variant):
            _forward_batch(_as_batch(query[rows]), _as_batch(key[keys]), _as_batch(value[keys]),
                           _as_batch(out[rows]), lse[:, rows].unsqueeze(0), None, scale, causal,
                           "BSND", variant, torch.tensor([b]), block_q, block_k)
        return out, lse
    batch, heads_q, seqlen_q, _ = layouts.sizes(query, layout)
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=acc_dtype)
    _forward_batch(query, key, value, out, lse, key_padding_mask, scale, causal, layout, variant,
                   torch.arange(batch), block_q, block_k)
    return out, lse


def _forward_batch(query, key, value, out, lse, key_padding_mask, scale, causal, layout,
                   variant, batch_ids, block_q, block_k):
    """One batch of equal-length sequences in ``layout``; out and lse (batch, heads_q,
    seqlen_q) are written."""
    _, heads_q, seqlen_q, _ = layouts.sizes(query, layout)
    heads_kv, seqlen_k = layouts.sizes(key, layout)[1:3]
    slopes = None if variant.alibi_slopes is None else variant.alibi_slopes[batch_ids]
    sc = _scores(scale, causal, variant, seqlen_q, seqlen_k, heads_kv, heads_q // heads_kv,
                 key_padding_mask, batch_ids, slopes)
    views = (_grouped(query, layout, heads_kv), layouts.to_bnsd(key, layout),
             layouts.to_bnsd(value, layout), _grouped(out, layout, heads_kv),
             lse.unflatten(1, (heads_kv, -1)))
    # The blocks with the most visible keys first, taken by whichever worker is free:
    # a worker slowed by another process does less of the work.
    starts = sorted(range(0, seqlen_q, block_q), key=lambda i0: -_span_length(
        sc.key_span(i0, min(i0 + block_q, seqlen_q))))
    shared = iter(starts)
    with _own_threads() as threads:
        _on_workers(lambda part, parts: _forward_core(*views, sc, block_q, block_k, shared),
                    _parts(threads, seqlen_q, block_q))


def _span_length(span: tuple[int, int]) -> int:
    return max(0, span[1] - span[0])


def backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask, grad_softmax_lse,
             *, scale: float, causal: bool, layout: str, deterministic: bool = False,
             variant: Variant = PLAIN, block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    """(grad_query, grad_key, grad_value, grad_sinks or None without sinks)."""
    del deterministic  # this backward is always deterministic (no atomics)
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                  for t in (query, key, value))
    if layout == layouts.PACKED:
        # Each sequence's sink gradient (heads_q,), summed in sequence order.
        grad_sinks = []
        for b, rows, keys in _sequences(variant):
            dlse = None if grad_softmax_lse is None else grad_softmax_lse[:, rows].unsqueeze(0)
            grad_sinks.append(_backward_batch(
                *(_as_batch(t[rows]) for t in (grad_out, query)),
                *(_as_batch(t[keys]) for t in (key, value)), _as_batch(out[rows]),
                softmax_lse[:, rows].unsqueeze(0), None, dlse,
                _as_batch(grads[0][rows]), *(_as_batch(t[keys]) for t in grads[1:]),
                scale, causal, "BSND", variant, torch.tensor([b]), block_q, block_k))
        grad_sinks = None if variant.sinks is None else torch.stack(grad_sinks).sum(0)
        return (*grads, grad_sinks)
    grad_sinks = _backward_batch(grad_out, query, key, value, out, softmax_lse,
                                 key_padding_mask, grad_softmax_lse, *grads, scale, causal,
                                 layout, variant, torch.arange(query.shape[0]), block_q,
                                 block_k)
    return (*grads, grad_sinks)


def _backward_batch(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
                    grad_softmax_lse, grad_query, grad_key, grad_value, scale, causal, layout,
                    variant, batch_ids, block_q, block_k):
    """One batch of equal-length sequences in ``layout``; the gradients are written and
    the sinks' gradient (heads_q,) is returned (None without sinks)."""
    _, heads_q, seqlen_q, d = layouts.sizes(query, layout)
    heads_kv, seqlen_k = layouts.sizes(key, layout)[1:3]
    group = heads_q // heads_kv
    acc_dtype = accumulator_dtype(query.dtype)
    b = query.shape[0]
    # Preprocess: D = rowsum(dO * O) - dLSE, and an lse that turns unseen rows' P into 0.
    delta = layouts.to_bnsd((grad_out.to(acc_dtype) * out.to(acc_dtype)).sum(-1, keepdim=True),
                            layout).squeeze(-1)  # (b, hq, sq)
    if grad_softmax_lse is not None:
        delta = delta - grad_softmax_lse
    lse = torch.where(softmax_lse == _NEG_INF, float("inf"), softmax_lse)
    slopes = None if variant.alibi_slopes is None else variant.alibi_slopes[batch_ids]
    sc = _scores(scale, causal, variant, seqlen_q, seqlen_k, heads_kv, group, key_padding_mask,
                 batch_ids, slopes)
    dk_h, dv_h = (layouts.to_bnsd(t, layout) for t in (grad_key, grad_value))
    views = (_grouped(query, layout, heads_kv), layouts.to_bnsd(key, layout),
             layouts.to_bnsd(value, layout), _grouped(grad_out, layout, heads_kv),
             lse.reshape(b, heads_kv, group, seqlen_q),
             delta.reshape(b, heads_kv, group, seqlen_q))

    def key_blocks(part: int, parts: int) -> torch.Tensor:
        dq = torch.zeros(b, heads_kv, group, seqlen_q, d, dtype=acc_dtype)
        _backward_core(*views, dq, dk_h, dv_h, sc, block_q, block_k, part, parts)
        return dq

    with _own_threads() as threads:
        partial_dq = _on_workers(key_blocks, _parts(threads, seqlen_k, block_k))
        dq = partial_dq[0]
        for more in partial_dq[1:]:  # in worker order: bitwise repeatable
            dq += more
    _grouped(grad_query, layout, heads_kv).copy_(dq)
    if variant.sinks is None:
        return None
    # P_sink = exp(sink - lse) of each row; dsink = -Σ P_sink * D (its dP term is 0: the
    # sink has no value). Summed over rows, then over the batch in order. A sink of -inf
    # (a head without one) in a row that sees no key has lse -inf too: P_sink 0, not NaN.
    p_sink = torch.exp(variant.sinks.view(1, -1, 1) - softmax_lse)
    p_sink = torch.where(softmax_lse == _NEG_INF, 0.0, p_sink)
    return -(p_sink * delta).sum(-1).sum(0)


def _cached_keys(cache, b: int, first: int, length: int, cache_batch_idx,
                 block_table) -> torch.Tensor:
    """Entries [first, length) of sequence b's cache, (1, length - first, heads_kv,
    head_dim) (a view without paging, a gather of its blocks with)."""
    if block_table is None:
        row = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
        return cache[row, first:length].unsqueeze(0)
    page = cache.shape[1]
    blocks = block_table[b, :(length + page - 1) // page].long()
    return cache[blocks].flatten(0, 1)[first:length].unsqueeze(0)


def kvcache_forward(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, *,
                    scale: float, causal: bool, layout: str = "BSND", cache_leftpad=None,
                    variant: Variant = PLAIN, num_splits: int = 0, block_q: int = BLOCK_Q,
                    block_k: int = BLOCK_K):
    """Attention of query (batch, seqlen_q, heads_q, head_dim) -- or TND: (total_q,
    heads_q, head_dim), sequence b's rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 --
    to entries cache_leftpad[b] (default 0) .. seqlens_k[b] - 1 of each sequence's
    cache, one sequence at a time.

    The keys before cache_leftpad are cut off rather than masked: causal, window and
    ALiBi positions are bottom-right aligned, so a sequence of keys [first, length) seen
    from its own start has the same diagonal, (length - first) - seqlen_q, relative to
    its keys as the absolute positions have to length. num_splits (a GPU performance
    hint) changes nothing here: the reference walks each sequence's keys in one pass."""
    del num_splits
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    acc_dtype = accumulator_dtype(query.dtype)
    lengths = seqlens_k.tolist()
    firsts = ([0] * len(lengths) if cache_leftpad is None
              else [min(max(x, 0), n) for x, n in zip(cache_leftpad.tolist(), lengths)])
    if layout == layouts.PACKED:
        starts = variant.cu_seqlens_q.tolist()
        rows = [slice(starts[b], starts[b + 1]) for b in range(len(lengths))]
        lse = torch.empty(query.shape[1], query.shape[0], dtype=acc_dtype)
        # (1, rows, heads, head_dim) views of each sequence's query, out and lse rows.
        views = [(_as_batch(query[r]), _as_batch(out[r]), lse[:, r].unsqueeze(0)) for r in rows]
    else:
        lse = torch.empty(query.shape[0], query.shape[2], query.shape[1], dtype=acc_dtype)
        views = [(query[b:b + 1], out[b:b + 1], lse[b:b + 1]) for b in range(len(lengths))]
    for b, ((q, o, l), first, length) in enumerate(zip(views, firsts, lengths)):
        keys, values = (_cached_keys(cache, b, first, length, cache_batch_idx, block_table)
                        for cache in (k_cache, v_cache))
        _forward_batch(q, keys, values, o, l, None, scale, causal, "BSND", variant,
                       torch.tensor([b]), block_q, block_k)
    return out, lse
