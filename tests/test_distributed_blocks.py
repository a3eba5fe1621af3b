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


@pytest.mark.parametrize("layout", ["BSND", "BNSD"])
def test_partials_merge_to_attention_over_the_union(layout):
    """flash_cann.distributed.merge.Partial: merging the (out, lse) of disjoint key sets,
    in two row ranges, is attention over their union; a row no set shows a key to stays
    output 0, lse -inf (never NaN), and one that sees keys in only one set takes it."""
    from flash_cann.distributed.merge import Partial
    g = torch.Generator().manual_seed(3)
    batch, heads, nq, nk, d = 2, 3, 6, 10, 4
    q, k, v = (torch.randn(batch, heads, n, d, generator=g) for n in (nq, nk, nk))
    scores = q @ k.transpose(-1, -2)
    seen = torch.rand(nq, nk, generator=g) < 0.6
    seen[0] = False                  # row 0 sees nothing anywhere
    seen[1, :] = False
    seen[1, 7] = True                # row 1 sees one key, in the second set only
    sets = [torch.arange(nk) < 4, torch.arange(nk) >= 4]

    def attend(mask):                # (out, lse) of the rows over the keys of mask
        s = scores.masked_fill(~mask, -math.inf)
        lse = torch.logsumexp(s, -1)
        p = torch.where(torch.isneginf(lse)[..., None], 0.0, torch.exp(s - lse[..., None]))
        return p @ v, lse

    as_layout = (lambda t: t.transpose(1, 2)) if layout == "BSND" else (lambda t: t)
    acc = Partial(as_layout(q), layout)
    seq = 1 if layout == "BSND" else 2
    for rows in ((0, 4), (4, nq)):
        for keys in sets:
            out, lse = attend(seen & keys)
            acc.add(rows[0], rows[1], as_layout(out).narrow(seq, rows[0], rows[1] - rows[0]),
                    lse[..., rows[0]:rows[1]])
    want_out, want_lse = attend(seen)
    torch.testing.assert_close(acc.out, as_layout(want_out))
    torch.testing.assert_close(acc.lse, want_lse)
    assert torch.isneginf(acc.lse[..., 0]).all() and not acc.out.isnan().any()
