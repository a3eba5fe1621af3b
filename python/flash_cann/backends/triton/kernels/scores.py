"""Score helpers of the Triton kernels: the features of flash_cann.contract.variant (the
sliding window, softcap, ALiBi and the dropout mask), which pairs are visible, and the
scores in log2 units, each in one place so that the forward, decode and backward
kernels compute the same thing (variant.py states the semantics; these follow it line
by line).

Scores reach these helpers in natural units (scale already applied): the kernels
convert to log2 units (x LOG2E) after the softcap and the bias.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import LN2, LOG2E


@triton.jit
def in_window(q_idx, k_idx, diagonal, window_left, window_right,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Whether key k_idx lies in query q_idx's window: i + diagonal - left <= j <= i +
    diagonal + right, a side without a bound (HAS_* false) always passing. Causal calls
    pass window_right = 0 with HAS_RIGHT."""
    inside = k_idx == k_idx
    if HAS_LEFT:
        inside = inside & (k_idx >= q_idx + diagonal - window_left)
    if HAS_RIGHT:
        inside = inside & (k_idx <= q_idx + diagonal + window_right)
    return inside


@triton.jit
def tanh(x):
    """tanh for any x (no inf/inf): 1 - 2 / (exp(2x) + 1); Triton has no portable tanh."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def softcapped(s, softcap):
    """softcap * tanh(s / softcap) (Gemma 2), s in natural units."""
    return softcap * tanh(s / softcap)


@triton.jit
def softcap_slope(capped, softcap):
    """d capped / d s = 1 - tanh² = 1 - (capped / softcap)²: the backward's chain rule
    factor, from the capped score it already recomputed."""
    t = capped / softcap
    return 1.0 - t * t


@triton.jit
def alibi_bias(q_idx, k_idx, diagonal, slope):
    """-slope * |i + diagonal - j| (natural units)."""
    return -slope * tl.abs((q_idx + diagonal - k_idx).to(tl.float32))


@triton.jit
def dropout_keep(seed, offset, b, h, q_idx, k_idx, threshold):
    """variant.keep_mask for a tile: the first Philox4x32-10 output of the counter
    (j, i, h, b + offset) with key = seed is >= threshold (uint32 compare). q_idx and
    k_idx are positions within the sequence."""
    zero = (q_idx + k_idx) * 0
    draw, _, _, _ = tl.random.philox(seed, (k_idx + zero).to(tl.uint32), (q_idx + zero).to(tl.uint32),
                                     (zero + h).to(tl.uint32), (zero + b + offset).to(tl.uint32))
    return draw.to(tl.int64) >= threshold


@triton.jit
def visible_pairs(q_idx, k_idx, keep_row, keep_stride_s, seqlen_k, diagonal, window_left,
                  window_right, LEFT_BOUNDED: tl.constexpr, CAUSAL: tl.constexpr,
                  HAS_MASK: tl.constexpr):
    """Which (query, key) pairs of a queries x keys tile may attend: the key exists, lies
    in the window -- right of the diagonal by at most window_right (CAUSAL: the right
    bound exists; causal calls pass 0) and left of it by at most window_left
    (LEFT_BOUNDED) -- and is not padding (q_idx a column, k_idx a row)."""
    in_range = k_idx < seqlen_k
    visible = in_range & in_window(q_idx, k_idx, diagonal, window_left, window_right,
                                   LEFT_BOUNDED, CAUSAL)
    if HAS_MASK:
        keep = tl.load(keep_row + k_idx * keep_stride_s, mask=in_range, other=0)
        visible = visible & (keep != 0)
    return visible


@triton.jit
def scores_log2(s, offs_m, offs_n, diagonal, qk_scale, softcap, slope,
                SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """A tile of raw scores Q Kᵀ in log2 units: scale, softcap and ALiBi (natural units,
    above), then x log2(e). Also the softcap's derivative dS/dS_scaled (1.0
    without softcap), which the backward's chain rule needs."""
    slope_cap = 1.0
    if SOFTCAP or ALIBI:
        s = s * (qk_scale * LN2)
        if SOFTCAP:
            s = softcapped(s, softcap)
            slope_cap = softcap_slope(s, softcap)
        if ALIBI:
            s += alibi_bias(offs_m, offs_n, diagonal, slope)
        s = s * LOG2E
    else:
        s = s * qk_scale
    return s, slope_cap


@triton.jit
def head_features(b, h, Alibi, alibi_stride_b, Rng, ALIBI: tl.constexpr, DROPOUT: tl.constexpr):
    """The features' values for head h of sequence b: its ALiBi slope, the dropout seed and
    offset (0 where the feature is off)."""
    slope = tl.load(Alibi + b * alibi_stride_b + h) if ALIBI else 0.0
    seed = tl.load(Rng) if DROPOUT else 0
    rng_offset = tl.load(Rng + 1) if DROPOUT else 0
    return slope, seed, rng_offset
