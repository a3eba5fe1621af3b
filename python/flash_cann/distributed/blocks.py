"""The block plan: which rectangles of one (query shard, key shard) pair a rank computes,
and with which of the op's masks.

Context parallelism splits one sequence of positions 0 .. S-1 into shards; a shard is a
list of chunks (global start, length) laid out one after another in the rank's local
tensor (contiguous sharding: one chunk; zigzag: chunks r and 2W-1-r). The attention is
the single-sequence one: the query at position p sees the keys at positions
p - left .. p + right (``causal``: right = 0; unbounded sides are ``math.inf``).

For one pair of shards the plan is a short list of :class:`Call`: a rectangle of local
query rows x local key rows, and the op's ``causal`` / ``window_left`` /
``window_right`` that reproduce exactly the global mask on it (the op's masks are
bottom-right aligned to the rectangle: row i sees column j iff
``j - i`` is in ``[c - window_left, c + window_right]``, c = keys - queries). Rectangles
that see nothing are not in the plan, which is how causal and windowed attention skip
blocks without computing them. Pure arithmetic on ints: every rank computes every
rank's plan identically, without communication.

Mask arithmetic, in one place: within a rectangle the mask depends only on
d = j - i (local column minus local row), and a rectangle of q x k rows holds every d in
[-(q - 1), k - 1]; two bands select the same entries iff they agree on that range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

Chunk = tuple[int, int]  # (global start position, length)


@dataclass(frozen=True)
class Call:
    """One op call: local query rows q_start .. q_end - 1 against local key rows
    k_start .. k_end - 1, with the op's mask arguments (-1 = unbounded)."""
    q_start: int
    q_end: int
    k_start: int
    k_end: int
    causal: bool = False
    window_left: int = -1
    window_right: int = -1

    @property
    def full(self) -> bool:
        return not self.causal and self.window_left == -1 and self.window_right == -1


@dataclass(frozen=True)
class _Rect:
    """A rectangle in local rows and the global band restricted to it, as d = j - i."""
    q0: int
    q1: int
    k0: int
    k1: int
    lo: float  # the visible d range [lo, hi] (may be empty: lo > hi)
    hi: float

    @property
    def d_min(self) -> int:
        return self.k0 - (self.q1 - 1)

    @property
    def d_max(self) -> int:
        return (self.k1 - 1) - self.q0

    def visible(self) -> tuple[float, float]:
        """The visible d range clipped to the rectangle's own range."""
        return max(self.lo, self.d_min), min(self.hi, self.d_max)

    def empty(self) -> bool:
        lo, hi = self.visible()
        return lo > hi


def _layout(chunks: Sequence[Chunk]) -> list[tuple[int, int, int]]:
    """(local start, global start, length) of each chunk."""
    local, out = 0, []
    for start, length in chunks:
        out.append((local, start, length))
        local += length
    return out


def _pair_rects(q_chunks, k_chunks, left: float, right: float) -> list[_Rect]:
    rects = []
    for lq, gq, nq in _layout(q_chunks):
        for lk, gk, nk in _layout(k_chunks):
            # global key - query = (gk + j - lk) - (gq + i - lq) = d + delta
            delta = (gk - lk) - (gq - lq)
            rects.append(_Rect(lq, lq + nq, lk, lk + nk, -left - delta, right - delta))
    return rects


def _call_for_band(q0, q1, k0, k1, lo: float, hi: float) -> Call | None:
    """The op call whose mask on rows q0..q1-1 x columns k0..k1-1 is the local band
    d in [lo, hi], or None if no op mask expresses it (a bound would be negative, or a
    right bound >= the key count, which the op reads as unbounded)."""
    nq, nk = q1 - q0, k1 - k0
    # rectangle-local d' = (j - k0) - (i - q0) = d - (k0 - q0)
    lo, hi = lo - (k0 - q0), hi - (k0 - q0)
    lo = -math.inf if lo <= -(nq - 1) else lo
    hi = math.inf if hi >= nk - 1 else hi
    c = nk - nq
    left = -1 if lo == -math.inf else c - int(lo)
    right = -1 if hi == math.inf else int(hi) - c
    if left < -1 or right < -1 or right >= nk or (left == -1 and lo != -math.inf) \
            or (right == -1 and hi != math.inf):
        return None
    if right == 0:  # the op's causal mask: the bound the kernels specialise
        return Call(q0, q1, k0, k1, causal=True, window_left=left)
    return Call(q0, q1, k0, k1, window_left=left, window_right=right)


def _one_call(rects: list[_Rect]) -> Call | None:
    """One call covering the bounding box of the non-empty rectangles, if one band
    reproduces every rectangle inside it (zigzag's diagonal block, for instance)."""
    live = [r for r in rects if not r.empty()]
    q0, q1 = min(r.q0 for r in live), max(r.q1 for r in live)
    k0, k1 = min(r.k0 for r in live), max(r.k1 for r in live)
    inside = [r for r in rects if q0 <= r.q0 and r.q1 <= q1 and k0 <= r.k0 and r.k1 <= k1]
    lows = {-math.inf} | {r.visible()[0] for r in live}
    highs = {math.inf} | {r.visible()[1] for r in live}
    for lo in sorted(lows):
        for hi in sorted(highs, reverse=True):
            if all(_agrees(r, lo, hi) for r in inside):
                call = _call_for_band(q0, q1, k0, k1, lo, hi)
                if call is not None:
                    return call
    return None


def _agrees(rect: _Rect, lo: float, hi: float) -> bool:
    """Whether the band [lo, hi] selects exactly rect's visible entries."""
    want_lo, want_hi = rect.visible()
    got_lo, got_hi = max(lo, rect.d_min), min(hi, rect.d_max)
    if want_lo > want_hi:
        return got_lo > got_hi
    return (got_lo, got_hi) == (want_lo, want_hi)


def _trimmed_calls(rect: _Rect) -> list[Call]:
    """The rectangle cut to the rows and columns that see anything, as one call; halved
    by rows where one mask cannot express it (a band much wider than the keys)."""
    lo, hi = rect.visible()
    if lo > hi:
        return []
    # rows i with some j in [k0, k1) and j - i in [lo, hi]: i in [k0 - hi, k1 - 1 - lo]
    q0 = max(rect.q0, rect.k0 - int(hi)) if hi != math.inf else rect.q0
    q1 = min(rect.q1, rect.k1 - int(lo)) if lo != -math.inf else rect.q1
    k0 = max(rect.k0, rect.q0 + int(lo)) if lo != -math.inf else rect.k0
    k1 = min(rect.k1, rect.q1 + int(hi)) if hi != math.inf else rect.k1
    call = _call_for_band(q0, q1, k0, k1, lo, hi)
    if call is not None:
        return [call]
    middle = (q0 + q1) // 2
    return [*_trimmed_calls(_Rect(q0, middle, k0, k1, rect.lo, rect.hi)),
            *_trimmed_calls(_Rect(middle, q1, k0, k1, rect.lo, rect.hi))]


def _merge_full(calls: list[Call]) -> list[Call]:
    """Join unmasked calls that share their key (or query) rows and touch."""
    calls = sorted(calls, key=lambda c: (c.k_start, c.q_start))
    merged = True
    while merged:
        merged = False
        for a in calls:
            for b in calls:
                if a is b or not (a.full and b.full):
                    continue
                if (a.k_start, a.k_end) == (b.k_start, b.k_end) and a.q_end == b.q_start:
                    joined = Call(a.q_start, b.q_end, a.k_start, a.k_end)
                elif (a.q_start, a.q_end) == (b.q_start, b.q_end) and a.k_end == b.k_start:
                    joined = Call(a.q_start, a.q_end, a.k_start, b.k_end)
                else:
                    continue
                calls = [c for c in calls if c is not a and c is not b] + [joined]
                merged = True
                break
            if merged:
                break
    return sorted(calls, key=lambda c: (c.q_start, c.k_start))


def plan(q_chunks: Sequence[Chunk], k_chunks: Sequence[Chunk], left: float = math.inf,
         right: float = math.inf) -> list[Call]:
    """The calls that compute attention of the query shard ``q_chunks`` to the key shard
    ``k_chunks`` under the global band [p - left, p + right] (see the module docstring):
    one call where one mask covers every chunk pair, else one per chunk pair that sees
    anything (cut to its visible rows and columns), unmasked neighbours joined. Empty
    when the shards see nothing of each other."""
    if left < 0 or right < 0:
        raise ValueError(f"plan: window bounds must be >= 0 or math.inf (got {left}, {right})")
    rects = _pair_rects(q_chunks, k_chunks, left, right)
    if all(r.empty() for r in rects):
        return []
    one = _one_call(rects)
    if one is not None:
        return [one]
    return _merge_full([call for r in rects for call in _trimmed_calls(r)])


def band(causal: bool, window_size: tuple[int, int]) -> tuple[float, float]:
    """flash-attn's (causal, window_size) as the global band (left, right): -1 is
    unbounded, causal makes the right bound 0."""
    left, right = window_size
    return (math.inf if left < 0 else left,
            0 if causal else (math.inf if right < 0 else right))
