"""Context-parallel attention over one sequence sharded among the ranks of a group:
forward and backward, on ``torch.ops.flash_cann.fwd`` / ``.bwd`` (so on every backend).

Forward: each rank merges, by lse (``merge``), the results of its queries against every
rank's key/value block, the blocks arriving by ring or all-gather (``rotation``), each
block computed as the planner says (``blocks``: the calls and masks that reproduce the
global causal / window mask, nothing outside the band). Backward: the op's backward per
block with the GLOBAL out and lse of the rows, which is exact (P = exp(S - lse) is the
global probability, D = rowsum(dO * O) the global one), as ring-flash-attn does; dQ
sums locally, dK/dV partials travel back to the block's owner (with the blocks around
the ring, or one all-to-all) and are summed there in a fixed order.

Every sum happens in an order fixed by the ranks (never by arrival): two runs give the
same bits, and the ring and the all-gather give the same bits. ``deterministic=True``
also asks the op's backward for its deterministic dQ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..api.interface import _flag, _real, _softmax_scale, _window
from ..contract.checks import require_tensor
from . import blocks, merge, rotation
from .rotation import Ring
from .sharding import chunks_of

LAYOUTS = tuple(merge.SEQ_DIM)


@dataclass(frozen=True)
class _Setup:
    """Everything about one call that is not a tensor."""
    ring: Ring
    layout: str
    sharding: str
    seqlen: int   # global
    left: float   # the global band (blocks.band)
    right: float
    scale: float
    softcap: float
    deterministic: bool
    method: str   # "p2p" | "allgather"
    fp16_scores: bool = False  # the op's fp16-score permission, handed to every block call

    @property
    def seq_dim(self) -> int:
        return merge.SEQ_DIM[self.layout]

    @property
    def plans(self) -> tuple[tuple[blocks.Call, ...], ...]:
        """This rank's calls at each step (step s: the block of rank r - s)."""
        return schedule(self.sharding, self.seqlen, self.ring.world, self.left,
                        self.right)[self.ring.rank]

    @property
    def steps(self) -> int:
        return len(self.plans)

    def attrs(self, call: blocks.Call) -> dict:
        return dict(scale=self.scale, causal=call.causal, layout=self.layout,
                    window_left=call.window_left, window_right=call.window_right,
                    softcap=self.softcap, fp16_scores=self.fp16_scores)


@lru_cache(maxsize=256)
def schedule(sharding: str, seqlen: int, world: int, left: float, right: float):
    """Every rank's calls per step, cut after the last step at which any rank has work
    (all ranks compute the same schedule, so all run the same number of steps)."""
    chunks = [chunks_of(sharding, seqlen, world, r) for r in range(world)]
    plans = [[tuple(blocks.plan(chunks[r], chunks[(r - s) % world], left, right))
              for s in range(world)] for r in range(world)]
    steps = 1 + max((s for r in range(world) for s in range(world) if plans[r][s]),
                    default=0)
    return tuple(tuple(p[:steps]) for p in plans)


def _rows(t: torch.Tensor, dim: int, start: int, end: int) -> torch.Tensor:
    return t.narrow(dim, start, end - start)


def forward(setup: _Setup, q, k, v):
    """(out in q's dtype, lse float32) of this rank's rows; no autograd."""
    partial = merge.Partial(q, setup.layout)
    dim = setup.seq_dim
    for step, (k_block, v_block) in rotation.blocks(setup.ring, (k, v), setup.steps,
                                                    setup.method):
        for call in setup.plans[step]:
            out, lse = torch.ops.flash_cann.fwd(
                _rows(q, dim, call.q_start, call.q_end),
                _rows(k_block, dim, call.k_start, call.k_end),
                _rows(v_block, dim, call.k_start, call.k_end), None, **setup.attrs(call))
            partial.add(call.q_start, call.q_end, out, lse)
    return partial.out.to(q.dtype), partial.lse


def _block_backward(setup: _Setup, calls, grads, q, k_block, v_block, out, lse, dout, dlse):
    """The op's backward for one block: adds into grads (dq, dk_block, dv_block, fp32)."""
    dim = setup.seq_dim
    dq, dk, dv = grads
    for call in calls:
        rows = (call.q_start, call.q_end)
        gq, gk, gv, _ = torch.ops.flash_cann.bwd(
            _rows(dout, dim, *rows), _rows(q, dim, *rows),
            _rows(k_block, dim, call.k_start, call.k_end),
            _rows(v_block, dim, call.k_start, call.k_end), _rows(out, dim, *rows),
            lse[..., call.q_start:call.q_end], None,
            None if dlse is None else dlse[..., call.q_start:call.q_end],
            deterministic=setup.deterministic, **setup.attrs(call))
        _rows(dq, dim, *rows).add_(gq.float())
        _rows(dk, dim, call.k_start, call.k_end).add_(gk.float())
        _rows(dv, dim, call.k_start, call.k_end).add_(gv.float())


def _backward_ring(setup: _Setup, q, k, v, out, lse, dout, dlse):
    """dK/dV partials travel with the blocks: at step s this rank adds its part to the
    sums for rank r - s that arrived from r - 1 and passes them on; after the last step
    each sum goes straight back to its owner."""
    ring, steps = setup.ring, setup.steps
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    incoming = None
    for step, (k_block, v_block) in rotation.blocks(ring, (k, v), steps, "p2p"):
        dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device)
                  for t in (k_block, v_block))
        _block_backward(setup, setup.plans[step], (dq, dk, dv), q, k_block, v_block, out,
                        lse, dout, dlse)
        if incoming is not None:
            sent_dk, sent_dv = incoming.wait()
            dk, dv = sent_dk + dk, sent_dv + dv
        if step + 1 < steps:
            incoming = ring.exchange((dk, dv), 1, tag=2)
    if steps == 1:
        return dq, dk, dv
    dk, dv = ring.exchange((dk, dv), -(steps - 1), tag=2).wait()
    return dq, dk, dv


def _backward_gathered(setup: _Setup, q, k, v, out, lse, dout, dlse):
    """Every block's dK/dV partial computed here, then summed at the owners
    (rotation.sum_to_owners: an all-to-all, then the ring's order)."""
    steps = setup.steps
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dks, dvs = (torch.zeros((steps, *t.shape), dtype=torch.float32, device=t.device)
                for t in (k, v))
    for step, (k_block, v_block) in rotation.blocks(setup.ring, (k, v), steps, "allgather"):
        _block_backward(setup, setup.plans[step], (dq, dks[step], dvs[step]), q, k_block,
                        v_block, out, lse, dout, dlse)
    return (dq, rotation.sum_to_owners(setup.ring, dks, steps),
            rotation.sum_to_owners(setup.ring, dvs, steps))


def backward(setup: _Setup, q, k, v, out, lse, dout, dlse):
    """(dq, dk, dv) in the inputs' dtypes, from the global out and lse of this rank's
    rows (``forward``'s); dlse may be None."""
    run = _backward_ring if setup.method == "p2p" else _backward_gathered
    dq, dk, dv = run(setup, q, k, v, out, lse, dout, dlse)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _ContextParallelAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, setup: _Setup):
        out, lse = forward(setup, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = setup
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        return (*backward(ctx.setup, q, k, v, out, lse, dout, dlse), None)


def _check(q, k, v, layout: str, ring: Ring) -> int:
    """The global sequence length, after the shape rules of context parallelism."""
    q, k, v = (require_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if layout not in LAYOUTS:
        raise ValueError(f"flash_cann.distributed: layout must be one of {', '.join(LAYOUTS)} "
                         f"(got {layout!r})")
    dim = merge.SEQ_DIM[layout]
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flash_cann.distributed: q, k, v must be 4-D ({layout}) (got "
                         f"{q.dim()}-D, {k.dim()}-D, {v.dim()}-D)")
    if not q.shape[dim] == k.shape[dim] == v.shape[dim]:
        raise ValueError(f"flash_cann.distributed: q, k and v must hold the same shard of "
                         f"one sequence (self-attention): their sequence lengths differ "
                         f"({q.shape[dim]}, {k.shape[dim]}, {v.shape[dim]})")
    return q.shape[dim] * ring.world


def prepare(q, k, v, group, *, scale: float, causal: bool, window: tuple[int, int],
            softcap: float, sharding: str, rotate: str, deterministic: bool,
            layout: str, fp16_scores: bool = False) -> _Setup:
    """The setup of one call (checked; the rotation chosen), for :func:`forward` and
    :func:`backward`."""
    ring = Ring.of(group)
    seqlen = _check(q, k, v, layout, ring)
    left, right = blocks.band(causal, window)
    windowed = not (math.isinf(left) and (math.isinf(right) or right == 0))
    local = sum(t.numel() * t.element_size() for t in (q, k, v))
    kv = sum(t.numel() * t.element_size() for t in (k, v))
    setup = _Setup(ring=ring, layout=layout, sharding=sharding, seqlen=seqlen, left=left,
                   right=right, scale=scale, softcap=softcap, deterministic=deterministic,
                   method=rotation.choose(rotate, local, kv, ring.world, windowed),
                   fp16_scores=fp16_scores)
    setup.plans  # refuses an unknown sharding or a length it cannot split
    return setup


def context_parallel_attn_func(q, k, v, group=None, *, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, sharding: str = "zigzag",
                               rotate: str = "auto", deterministic=False, layout: str = "BSND",
                               return_lse=False):
    """Attention over one sequence whose positions are sharded among the ranks of
    ``group`` (default: the world), as if one device ran it whole.

    Arguments:
        q, k, v: this rank's shard, (batch_size, seqlen / world, nheads[_k], headdim) for
            layout "BSND" (flash-attn's), or (batch_size, nheads[_k], seqlen / world,
            headdim) for "BNSD". GQA/MQA: k, v with fewer heads. Shard with
            :func:`flash_cann.distributed.shard` (the same ``sharding``).
        group: a torch.distributed process group (NCCL, HCCL, gloo), default the world.
        softmax_scale, causal, window_size, softcap: as in flash_attn_func, over the
            global positions (the window counts positions of the whole sequence).
        sharding: "zigzag" (load-balanced causal, the default) or "contiguous": how the
            sequence was sharded.
        rotate: "p2p" (ring, overlapped), "allgather", or "auto" (rotation.choose).
        deterministic: the op's deterministic backward; the merge and the dK/dV sums
            are in a fixed order in any case (bitwise repeatable).
        return_lse: also return the softmax_lse of the local rows.
    Return:
        out: like q; softmax_lse [if return_lse]: (batch_size, nheads, seqlen / world),
            float32, differentiable.

    Every rank of the group must call it with the same arguments and shard shapes, as
    for any collective: the ranks plan the same steps without talking, and a rank that
    disagrees leaves the others waiting for transfers it never makes.
    """
    setup = prepare(q, k, v, group, scale=_softmax_scale(softmax_scale, q, "softmax_scale"),
                    causal=_flag(causal, "causal"), window=_window(window_size),
                    softcap=_real(softcap, "softcap"), sharding=sharding, rotate=rotate,
                    deterministic=_flag(deterministic, "deterministic"), layout=layout)
    out, lse = _ContextParallelAttention.apply(q, k, v, setup)
    return (out, lse) if _flag(return_lse, "return_lse") else out
