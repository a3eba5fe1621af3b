"""Moving key/value blocks between the ranks of a context-parallel group, with
torch.distributed only (NCCL, HCCL, gloo): no communication layer of our own.

Two ways, chosen per call (``choose``), as torch's ``_RotateMethod``:

- ``"p2p"``: a ring. At step s rank r holds the block of rank r - s and, while it
  computes with it, already sends it on to r + 1 and receives r - s - 1's
  (``dist.batch_isend_irecv``): the transfer hides behind the compute. The ring stops
  after the last step any rank needs (a window that reaches one shard back needs one
  step, not W - 1).
- ``"allgather"``: every block at once (``all_gather_into_tensor``, asynchronous, started
  before the own block is computed). One collective instead of W - 1 exchanges; W blocks
  of memory.

Both hand out the blocks in the same order (step s: the block of rank r - s), so both
give bitwise the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

METHODS = ("auto", "p2p", "allgather")
# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Ring:
    """A process group seen as a ring: this rank, its size, and group ranks -> global."""
    group: object
    rank: int
    world: int

    @classmethod
    def of(cls, group) -> "Ring":
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("flash_cann.distributed: torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first: 'nccl' on "
                               "CUDA, 'hccl' on Ascend, 'gloo' on the CPU)")
        group = group if group is not None else dist.group.WORLD
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def peer(self, offset: int) -> int:
        """The global rank of the group member ``offset`` places along the ring."""
        return dist.get_global_rank(self.group, (self.rank + offset) % self.world)

    def exchange(self, tensors: Sequence[torch.Tensor], send_offset: int,
                 tag: int = 0) -> "Pending":
        """Send ``tensors`` to the member ``send_offset`` ahead and receive the same shapes
        from the one ``send_offset`` behind; returns at once."""
        received = [torch.empty_like(t) for t in tensors]
        sent = [t.contiguous() for t in tensors]
        to, frm = self.peer(send_offset), self.peer(-send_offset)
        ops = [dist.P2POp(dist.isend, t, to, self.group, tag + i) for i, t in enumerate(sent)]
        ops += [dist.P2POp(dist.irecv, r, frm, self.group, tag + i)
                for i, r in enumerate(received)]
        return Pending(received, dist.batch_isend_irecv(ops), sent)


@dataclass
class Pending:
    """Tensors being received; ``wait()`` returns them once they have arrived. Holds the
    tensors being sent too, so that none is freed while a transfer still reads it."""
    tensors: list
    works: list
    sent: list = ()

    def wait(self) -> list:
        for work in self.works:
            work.wait()
        return self.tensors


def choose(method: str, local_bytes: int, kv_bytes: int, world: int, windowed: bool) -> str:
    """The rotation for one call. ``"auto"``: all-gather when every rank's key/value
    blocks together take at most twice this rank's query+key+value (short sequences,
    GQA's small key/value, two ranks), unless a window bounds the reach (the ring then
    stops early and moves less); else the ring."""
    if method not in METHODS:
        raise ValueError(f"flash_cann.distributed: rotate must be one of {', '.join(METHODS)} "
                         f"(got {method!r})")
    if method != "auto":
        return method
    return "allgather" if not windowed and world * kv_bytes <= 2 * local_bytes else "p2p"


def blocks(ring: Ring, tensors: Sequence[torch.Tensor], steps: int,
           method: str) -> Iterator[tuple[int, list]]:
    """(step, the block of rank r - step) for step = 0 .. steps - 1; the next block's
    transfer runs while the caller works on the current one."""
    if method == "p2p":
        current = list(tensors)
        for step in range(steps):
            pending = ring.exchange(current, 1) if step + 1 < steps else None
            yield step, current
            if pending is not None:
                current = pending.wait()
        return
    gathered, works = [], []
    if steps > 1:
        for t in tensors:
            out, work = gather(ring, t, async_op=True)
            gathered.append(out)
            works.append(work)
    yield 0, list(tensors)
    for work in works:
        work.wait()
    for step in range(1, steps):
        yield step, [g[(ring.rank - step) % ring.world] for g in gathered]


def gather(ring: Ring, t: torch.Tensor, async_op: bool = False):
    """(every rank's ``t`` stacked, (world, *t.shape); the pending work or None)."""
    # a flat buffer: gloo checks the output as (world * numel,)
    out = torch.empty(ring.world * t.numel(), dtype=t.dtype, device=t.device)
    work = _all_gather(out, t.contiguous().view(-1), group=ring.group, async_op=async_op)
    return out.view(ring.world, *t.shape), work


def sum_to_owners(ring: Ring, partials: torch.Tensor, steps: int) -> torch.Tensor:
    """``partials[s]``: this rank's contribution to the block of rank r - s. Returns the
    sum of every rank's contribution to this rank's block, added in the ring's order
    (own first, then r + 1, r + 2, ...), which makes it bitwise the ring's (and
    independent of the collective's reduction order: an all-to-all, then a fixed sum)."""
    if steps == 1:
        return partials[0]
    world = ring.world
    # by destination rank: row d holds the contribution to rank d's block
    send = torch.zeros((world, *partials.shape[1:]), dtype=partials.dtype,
                       device=partials.device)
    for step in range(steps):
        send[(ring.rank - step) % world] = partials[step]
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=ring.group)
    total = received[ring.rank].clone()
    for step in range(1, steps):
        total += received[(ring.rank + step) % world]
    return total
