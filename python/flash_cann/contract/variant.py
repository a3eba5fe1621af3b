"""What an attention call computes beyond plain softmax(scale * Q Kᵀ) V: the one
statement of the features' semantics, which every backend and the oracle follow.

For one sequence of ``seqlen_q`` queries and ``seqlen_k`` keys (per sequence with
packed variable-length batches and KV caches), ``diagonal = seqlen_k - seqlen_q``:

visible (i, j)   j < seqlen_k, the key is not padding, and, with a sliding window
                 ``(left, right)`` (-1 = unbounded on that side; ``causal`` means
                 right = 0), ``i + diagonal - left <= j <= i + diagonal + right``:
                 flash-attn's bottom-right aligned window, its bounds normalised as
                 flash-attn 2.8 does (:func:`window_bounds`).
score (i, j)     s = scale * q_i · k_j
                 softcap > 0:   s = softcap * tanh(s / softcap)      (Gemma 2)
                 ALiBi:         s = s - slope[b, h] * |i + diagonal - j|
P                softmax over the visible keys of row i; lse = log Σ_visible exp(s).
                 A row that sees no key: out 0, lse -inf, zero gradients.
sinks            learnable attention sinks (gpt-oss; vLLM's ``s_aux``): one logit
                 sink[h] per query head joins every row's denominator,
                 lse = log(exp(sink[h]) + Σ_visible exp(s)), P = exp(s - lse), so
                 the row's probabilities sum to less than 1 (the sink takes the rest
                 and contributes no value). A row that sees no key: out 0, lse =
                 sink[h]. Gradient: d sink[h] = -Σ_{b, i} exp(sink[h] - lse_bhi) *
                 D_bhi, D = rowsum(dO * O) - dlse (the backward's D).
dropout          out_i = Σ_j P_ij * keep_ij / (1 - dropout_p) * v_j; lse is not
                 affected. keep_ij is :func:`keep_mask` (below): a counter-based
                 Philox draw, so the backward regenerates the mask from ``rng_state``
                 instead of storing it.

flash-attn's causal ALiBi kernel adds ``slope * j`` instead of ``-slope * |i + diagonal -
j|``; on visible keys the two differ by a per-row constant, so P, out and the gradients
are the same and only flash-attn's lse is shifted. flash_cann's lse is the true one.

Packed variable-length batches (layout ``TND``): q is (total_q, heads_q, head_dim), k
and v (total_k, heads_kv, head_dim); sequence b holds rows cu_seqlens_q[b] ..
cu_seqlens_q[b+1] - 1 of q (likewise k, v with cu_seqlens_k); softmax_lse is (heads_q,
total_q). Sequences never attend across their boundaries.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

# The features a backend may or may not have; the spec lists each backend's.
FEATURES = ("varlen", "window", "softcap", "alibi", "dropout", "kvcache", "sinks")


@dataclass(frozen=True, eq=False)
class Variant:
    """The op arguments beyond plain attention, as the checks normalised them.

    alibi_slopes: float32 (batch, heads_q) (a (heads_q,) argument is expanded, no copy).
    window_left/right: as :func:`window_bounds` normalised them; window_right is -1 when
    the call is causal (``causal`` is then the right bound), so a plain causal call is not
    a windowed one.
    rng_state: int64 (2,) = (seed, offset) on the query's device, with dropout_p > 0.
    cu_seqlens_q/k: int32 (batch + 1,) on the query's device, layout TND only;
    max_seqlen_q/k bound every sequence's length (the caller's promise, as in flash-attn:
    read on the host, so no synchronisation with the device).
    sinks: the attention sinks' logits, (heads_q,) in the accumulator dtype (float32;
    float64 for float64 inputs), on the query's device.
    fp16_scores: the caller permits the backward to hold S = Q Kᵀ in fp16 (fp16 inputs
    only; a permission, not a feature: the forward keeps fp32 S, and backends without an
    fp16-score path ignore it)."""

    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None
    dropout_p: float = 0.0
    rng_state: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    sinks: torch.Tensor | None = None
    fp16_scores: bool = False

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def windowed(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def plain(self) -> bool:
        """No feature is used: plain (causal, padded) attention."""
        return not (self.windowed or self.softcap or self.alibi_slopes is not None
                    or self.dropout_p or self.varlen or self.sinks is not None)


PLAIN = Variant()


def shared_alibi_slopes(slopes: torch.Tensor) -> torch.Tensor | None:
    """The (heads_q,) row of checked ALiBi ``slopes`` when every sequence shares it, else
    None: the checks expand a (heads_q,) argument to (batch, heads_q) with batch stride 0
    (with batch 1 torch keeps the row stride, and the one row is shared all the same).
    The Ascend kernels then index the slopes by head only (flash_cann_variant.h, Alibi)."""
    if slopes.dim() == 1:
        return slopes
    return slopes[0] if slopes.stride(0) == 0 or slopes.shape[0] == 1 else None


def window_bounds(left: int, right: int, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """``window_size`` as every op reads it: flash-attn 2.8's normalisation (mha_fwd,
    mha_varlen_fwd, mha_fwd_kvcache), so the same arguments select the same keys.

    - a bound >= seqlen_k is -1, unbounded (seqlen_k: the key length, max_seqlen_k for
      packed sequences, the cache's capacity for a KV cache). On the left this changes
      nothing; on the right it does when seqlen_q > seqlen_k (bottom-right alignment
      would otherwise hide keys from the first rows), and flash-attn unbounds it;
    - ``causal=True`` makes the right bound 0 whatever was passed: returned as -1 here,
      since ``causal`` itself carries that bound (Variant.window_right).

    Bounds below -1 are refused by the checks before this runs."""
    left = -1 if left >= seqlen_k else left
    right = -1 if causal or right >= seqlen_k else right
    return left, right


# ---------------------------------------------------------------------------------------
# Dropout: Philox4x32-10 (Salmon et al., SC'11), as Triton's tl.random.philox computes it
# ---------------------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57   # Random123's PHILOX_M4x32_0 / _1
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85       # the Weyl key increments
PHILOX_ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32 bits of the 64-bit product a * b, for a constant a < 2^32 and uint32
    values b held in int64 (whose products would overflow): b splits into 16-bit halves."""
    lo_part = b & 0xFFFF
    hi_part = b >> 16
    low_product = lo_part * a                      # < 2^48
    high_product = hi_part * a                     # < 2^48, weighs 2^16
    t = low_product + ((high_product & 0xFFFF) << 16)
    return ((high_product >> 16) + (t >> 32)) & _MASK32, t & _MASK32


def philox(seed: int | torch.Tensor, c0, c1, c2, c3, rounds: int = PHILOX_ROUNDS):
    """Philox4x32 of the counter (c0, c1, c2, c3) with key = the 64-bit ``seed`` (low word
    first): four uint32 results held in int64 tensors. Bit for bit what Triton's
    ``tl.random.philox(seed, c0, c1, c2, c3)`` returns for 32-bit counters."""
    seed = torch.as_tensor(seed, dtype=torch.int64)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) & _MASK32 for c in (c0, c1, c2, c3))
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def dropout_threshold(dropout_p: float) -> int:
    """An element is kept iff its 32-bit draw is >= this (dropout_p in [0, 1)).

    dropout_p is first rounded to float32, the type of the CANN op's attribute, so the
    Ascend kernels (whose host reads a float32 attribute) and every other backend derive
    the same threshold, and one seed gives the same mask everywhere."""
    return int(struct.unpack("f", struct.pack("f", dropout_p))[0] * 2**32)


def keep_mask(rng_state: torch.Tensor, dropout_p: float, batch, head, rows, cols) -> torch.Tensor:
    """Which probabilities dropout keeps: True where the first Philox output of the counter
    (col j, row i, head h, batch b + offset) -- each mod 2^32, b the sequence index, i and
    j positions within the sequence -- is >= dropout_threshold(dropout_p), with key =
    rng_state[0] (the seed); rng_state[1] is the offset. The coordinates broadcast."""
    seed, offset = (int(x) for x in rng_state.tolist())
    draw = philox(seed, cols, rows, head, torch.as_tensor(batch, dtype=torch.int64) + offset)[0]
    return draw >= dropout_threshold(dropout_p)
