"""Device helpers of the Triton kernels for the features of flash_cann.variant: the
sliding window, softcap, ALiBi and the dropout mask, each in one place so that the
forward, backward and KV-cache kernels compute the same thing (variant.py states the
semantics; these follow it line by line).

Scores reach these helpers in natural units (scale already applied): the kernels
convert to log2 units (x LOG2E) after the softcap and the bias.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
