"""How a sequence is split among the ranks of a context-parallel group, and the helpers
that shard and unshard a batch.

- ``"contiguous"``: rank r holds positions r*L .. (r+1)*L - 1 (L = S / W). With causal
  attention the last rank does W times the work of the first.
- ``"zigzag"`` (head-tail; ring-flash-attn's zigzag, torch's ``_HeadTailLoadBalancer``):
  the sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r, one after the
  other, so every rank does the same causal work. The default.

A shard is described by its chunks, (global start, length) in local order
(:func:`chunks_of`): the block planner (``blocks``) needs nothing else.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

SHARDINGS = ("zigzag", "contiguous")


def _check(sharding: str, seqlen: int, world: int) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"flash_cann.distributed: sharding must be one of "
                         f"{', '.join(SHARDINGS)} (got {sharding!r})")
    pieces = 2 * world if sharding == "zigzag" else world
    if seqlen % pieces:
        raise ValueError(f"flash_cann.distributed: {sharding} sharding over {world} ranks "
                         f"needs a sequence length divisible by {pieces} (got {seqlen})")


def chunks_of(sharding: str, seqlen: int, world: int, rank: int) -> list[tuple[int, int]]:
    """The (global start, length) chunks rank ``rank`` holds, in local order, of a
    sequence of ``seqlen`` positions (the global length)."""
    _check(sharding, seqlen, world)
    if sharding == "contiguous":
        length = seqlen // world
        return [(rank * length, length)]
    length = seqlen // (2 * world)
    return [(rank * length, length), ((2 * world - 1 - rank) * length, length)]


def _group(group):
    return group if group is not None else dist.group.WORLD


def shard(x: torch.Tensor, seq_dim: int, group=None, sharding: str = "zigzag",
          rank: int | None = None, world: int | None = None) -> torch.Tensor:
    """This rank's shard of the whole-sequence tensor ``x`` (every rank holds the same
    ``x``), along ``seq_dim``: a copy, contiguous. ``rank``/``world`` default to the
    group's (give them to shard without a process group)."""
    group = None if rank is not None and world is not None else _group(group)
    rank = dist.get_rank(group) if rank is None else rank
    world = dist.get_world_size(group) if world is None else world
    chunks = chunks_of(sharding, x.shape[seq_dim], world, rank)
    return torch.cat([x.narrow(seq_dim, start, n) for start, n in chunks], seq_dim).contiguous()


def unshard(x: torch.Tensor, seq_dim: int, group=None, sharding: str = "zigzag") -> torch.Tensor:
    """The whole-sequence tensor from every rank's shard ``x`` (an all-gather, then the
    chunks put back in position order). Not differentiable."""
    group = _group(group)
    world = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return restore(parts, seq_dim, sharding)


def restore(parts: list[torch.Tensor], seq_dim: int, sharding: str = "zigzag") -> torch.Tensor:
    """The whole sequence from the shards of ranks 0 .. W-1 (``unshard`` without the
    communication)."""
    world = len(parts)
    seqlen = parts[0].shape[seq_dim] * world
    pieces = []
    for rank, part in enumerate(parts):
        local = 0
        for start, n in chunks_of(sharding, seqlen, world, rank):
            pieces.append((start, part.narrow(seq_dim, local, n)))
            local += n
    return torch.cat([p for _, p in sorted(pieces, key=lambda item: item[0])], seq_dim)
