"""The context-parallel block plan (flash_cann.distributed.blocks), without processes:
for contiguous and zigzag shards, causal, windowed and full attention, the union of the
planned op calls' masks (the op's own bottom-right semantics, contract.reference.visible)
is the global mask, each visible pair covered exactly once, and rectangles that see
nothing are not computed."""

from __future__ import annotations

import math

import pytest
import torch

from flash_cann.contract.reference import visible
from flash_cann.contract.variant import window_bounds
from flash_cann.distributed import blocks
from flash_cann.distributed.sharding import chunks_of


def _covered(calls, nq, nk):
    """How many planned calls cover each (local row, local column)."""
    count = torch.zeros(nq, nk, dtype=torch.int64)
    for c in calls:
        rows, cols = c.q_end - c.q_start, c.k_end - c.k_start
        window = window_bounds(c.window_left, c.window_right, c.causal, cols)
        count[c.q_start:c.q_end, c.k_start:c.k_end] += visible(
            rows, cols, c.causal, window=window)[0, 0].long()
    return count


def _global(chunks):
    return torch.cat([torch.arange(s, s + n) for s, n in chunks])


@pytest.mark.parametrize("sharding", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (True, (5, -1)), (False, (3, 7)),
                                            (False, (0, 0)), (True, (40, 0))])
def test_plans_cover_the_global_mask_once(sharding, world, causal, window):
    seqlen = 24 * world
    left, right = blocks.band(causal, window)
    calls_made = 0
    for rank in range(world):
        q_chunks = chunks_of(sharding, seqlen, world, rank)
        qpos = _global(q_chunks)
        for src in range(world):
            k_chunks = chunks_of(sharding, seqlen, world, src)
            kpos = _global(k_chunks)
            d = kpos.view(1, -1) - qpos.view(-1, 1)
            want = (d >= -left) & (d <= right)
            calls = blocks.plan(q_chunks, k_chunks, left, right)
            calls_made += len(calls)
            got = _covered(calls, len(qpos), len(kpos))
            assert got.max() <= 1, (rank, src, calls)
            assert torch.equal(got.bool(), want), (rank, src, calls)
            if not want.any():
                assert calls == []
    if causal and sharding == "zigzag" and window == (-1, -1):
        # zigzag's point: every block is one call (diagonal causal, others unmasked)
        assert calls_made == world * world  # no pair is skipped, none needs two calls


def test_windows_skip_far_blocks():
    """A 4-position causal window over 4 contiguous shards of 16 touches only the own and
    the previous shard: the others are not planned at all."""
    chunks = [chunks_of("contiguous", 64, 4, r) for r in range(4)]
    left, right = blocks.band(True, (4, -1))
    assert blocks.plan(chunks[3], chunks[1], left, right) == []
    assert blocks.plan(chunks[3], chunks[0], left, right) == []
    (near,) = blocks.plan(chunks[3], chunks[2], left, right)
    assert (near.q_start, near.q_end, near.k_start, near.k_end) == (0, 4, 12, 16)


def test_bad_band_is_refused():
    with pytest.raises(ValueError, match="window bounds"):
        blocks.plan([(0, 4)], [(0, 4)], -1, math.inf)


def test_random_shards_and_bands():
    """Arbitrary chunk layouts (uneven, out of order, query and key shards of different
    lengths) and bands, including ones no single op mask expresses."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        def shard():
            n = int(torch.randint(1, 4, (1,), generator=gen))
            return [(int(torch.randint(0, 40, (1,), generator=gen)),
                     int(torch.randint(1, 9, (1,), generator=gen))) for _ in range(n)]
        q_chunks, k_chunks = shard(), shard()
        left, right = (math.inf if float(torch.rand(1, generator=gen)) < 0.3
                       else int(torch.randint(0, 12, (1,), generator=gen)) for _ in range(2))
        d = _global(k_chunks).view(1, -1) - _global(q_chunks).view(-1, 1)
        calls = blocks.plan(q_chunks, k_chunks, left, right)
        got = _covered(calls, d.shape[0], d.shape[1])
        assert got.max() <= 1 and torch.equal(got.bool(), (d >= -left) & (d <= right)), (
            q_chunks, k_chunks, left, right, calls)
