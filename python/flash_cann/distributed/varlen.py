"""Packed documents across ranks, llama3-style context parallelism: the packed token
sequence (flash-attn's varlen layout, documents one after another) is cut into W equal
contiguous token shards; each rank all-gathers the keys/values and attends its own
tokens to the keys of their documents with one varlen op call (per-rank cu_seqlens, as
Llama 3's CP and ring-flash-attn's ``llama3_flash_attn_varlen_func`` do). Backward: the
op's backward on the same call; dK/dV partials go back to their owners by one
all-to-all and are summed there in a fixed order.

The document boundaries are host data (the data loader packed the batch on the host):
:func:`varlen_shard` takes them as a list or a CPU tensor and computes every rank's
offsets on the host; no device tensor is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..api.interface import _flag, _real, _softmax_scale, _window
from ..contract.checks import require_tensor
from . import rotation
from .rotation import Ring


@dataclass(frozen=True)
class VarlenShard:
    """One rank's part of a packed batch: its query tokens q_start .. q_end - 1 of the
    global packed sequence, the key tokens k_start .. k_end - 1 they need, and the varlen
    offsets of both (device tensors) for one op call."""
    tokens: int
    q_start: int
    q_end: int
    k_start: int
    k_end: int
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool


def _host_offsets(cu_seqlens) -> list[int]:
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.device.type != "cpu":
            raise ValueError("flash_cann.distributed.varlen_shard: cu_seqlens must be host data "
                             "(a list or a CPU tensor, as the data loader built it): reading "
                             f"a {cu_seqlens.device.type} tensor would stall the device")
        cu_seqlens = cu_seqlens.tolist()
    offsets = [int(x) for x in cu_seqlens]
    if len(offsets) < 2 or offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"flash_cann.distributed.varlen_shard: cu_seqlens must start at 0 "
                         f"and never decrease (got {offsets})")
    return offsets


def varlen_shard(cu_seqlens, *, causal: bool, device=None, group=None, rank: int | None = None,
                 world: int | None = None) -> VarlenShard:
    """This rank's :class:`VarlenShard` of the packed batch whose documents start at
    ``cu_seqlens`` (host data: a list or CPU tensor, [0, len_0, len_0 + len_1, ...]).
    ``causal`` must be the attention's (non-causal queries need their documents' later
    keys too). ``rank``/``world`` default to the group's."""
    offsets = _host_offsets(cu_seqlens)
    if rank is None or world is None:
        ring = Ring.of(group)
        rank, world = ring.rank, ring.world
    tokens = offsets[-1]
    if tokens % world:
        raise ValueError(f"flash_cann.distributed.varlen_shard: the packed batch's {tokens} "
                         f"tokens must split evenly over {world} ranks (pad the batch)")
    length = tokens // world
    q_start, q_end = rank * length, (rank + 1) * length
    pieces = []  # (query tokens of one document on this rank, the keys they see)
    for start, end in zip(offsets, offsets[1:]):
        a, b = max(start, q_start), min(end, q_end)
        if a < b:
            pieces.append((a, b, start, b if causal else end))
    k_start = pieces[0][2]
    cu_q, cu_k = [0], [0]
    for a, b, ks, ke in pieces:
        cu_q.append(cu_q[-1] + b - a)
        cu_k.append(ke - k_start)
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    return VarlenShard(tokens, q_start, q_end, k_start, pieces[-1][3], as_tensor(cu_q),
                       as_tensor(cu_k), max(b - a for a, b, _, _ in pieces),
                       max(ke - ks for _, _, ks, ke in pieces), bool(causal))


def _needed_keys(ring: Ring, shard: VarlenShard, tensors):
    """The key/value tokens this rank's queries see, from every rank's (an all-gather)."""
    return [rotation.gather(ring, t)[0].flatten(0, 1)[shard.k_start:shard.k_end]
            for t in tensors]


class _VarlenContextParallel(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, ring, shard, attrs):
        keys, values = _needed_keys(ring, shard, (k, v))
        out, lse = torch.ops.flash_cann.fwd(
            q, keys, values, None, cu_seqlens_q=shard.cu_seqlens_q,
            cu_seqlens_k=shard.cu_seqlens_k, max_seqlen_q=shard.max_seqlen_q,
            max_seqlen_k=shard.max_seqlen_k, layout="TND", **attrs)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (ring, shard, attrs)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring, shard, attrs = ctx.args
        attrs = dict(attrs)
        deterministic = attrs.pop("deterministic")
        keys, values = _needed_keys(ring, shard, (k, v))
        dq, dk_part, dv_part, _ = torch.ops.flash_cann.bwd(
            torch.zeros_like(out) if dout is None else dout, q, keys, values, out, lse, None,
            dlse, cu_seqlens_q=shard.cu_seqlens_q, cu_seqlens_k=shard.cu_seqlens_k,
            max_seqlen_q=shard.max_seqlen_q, max_seqlen_k=shard.max_seqlen_k, layout="TND",
            deterministic=deterministic, **attrs)
        grads = []
        for part, like in ((dk_part, k), (dv_part, v)):
            whole = torch.zeros((ring.world * like.shape[0], *like.shape[1:]),
                                dtype=torch.float32, device=like.device)
            whole[shard.k_start:shard.k_end] = part.float()
            by_owner = whole.view(ring.world, *like.shape)
            # partials[s]: the contribution to rank r - s (rotation.sum_to_owners' order)
            partials = torch.stack([by_owner[(ring.rank - s) % ring.world]
                                    for s in range(ring.world)])
            grads.append(rotation.sum_to_owners(ring, partials, ring.world).to(like.dtype))
        return dq, *grads, None, None, None


def context_parallel_varlen_attn_func(q, k, v, shard: VarlenShard, group=None, *,
                                      softmax_scale=None, causal=False, window_size=(-1, -1),
                                      softcap=0.0, deterministic=False, return_lse=False):
    """Attention over packed documents whose tokens are sharded among the ranks of
    ``group``: this rank's q, k, v are tokens ``shard.q_start .. shard.q_end - 1``
    (``shard(x, 0, sharding="contiguous")``), (tokens / world, nheads[_k], headdim).

    causal must be the one ``shard`` was made for; a window needs causal=True (each
    document's window is then aligned to its own positions). Returns out (like q) and,
    with return_lse, softmax_lse (nheads, tokens / world), as flash_attn_varlen_func."""
    ring = Ring.of(group)
    q, k, v = (require_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    causal = _flag(causal, "causal")
    if causal != shard.causal:
        raise ValueError(f"flash_cann.distributed: the VarlenShard was made for causal="
                         f"{shard.causal}, the call has causal={causal}: the keys each rank "
                         f"needs differ (make it with varlen_shard(..., causal={causal}))")
    window_left, window_right = _window(window_size)
    if not causal and (window_left, window_right) != (-1, -1):
        raise NotImplementedError(
            f"flash_cann.distributed: window_size={window_size!r} with causal=False is not "
            f"supported across ranks for packed documents (one op call cannot align each "
            f"document's window to its own part on this rank); use causal=True")
    if q.shape[0] != shard.q_end - shard.q_start or k.shape[0] != q.shape[0]:
        raise ValueError(f"flash_cann.distributed: q, k, v must be this rank's "
                         f"{shard.q_end - shard.q_start} tokens of the packed batch (got "
                         f"{q.shape[0]}, {k.shape[0]})")
    attrs = dict(scale=_softmax_scale(softmax_scale, q, "softmax_scale"), causal=causal,
                 window_left=window_left, window_right=window_right,
                 softcap=_real(softcap, "softcap"),
                 deterministic=_flag(deterministic, "deterministic"))
    out, lse = _VarlenContextParallel.apply(q, k, v, ring, shard, attrs)
    return (out, lse) if _flag(return_lse, "return_lse") else out
