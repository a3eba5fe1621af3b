"""The KV cache's bookkeeping for ``torch.ops.flash_cann.fwd_kvcache``, shared by every
backend: appending the new keys and values in place, and how many keys each sequence
then has. Device tensor ops only (an index_put per cache): the one host read of a
decoding step is the capacity check below, for flash_attn_with_kvcache's paged call in
eager mode.

The capacity guard. A sequence holds at most ``capacity`` keys: block_table's
max_num_blocks_per_seq x page_block_size for a paged cache, k_cache's seqlen otherwise.
cache_seqlens (+ the new tokens) beyond it, or below 0, is the caller's error:

- CPU tensors: check_kvcache reads cache_seqlens (free on the host) and raises a
  RuntimeError naming block_table (or k_cache), cache_seqlens and the capacity.
- A paged cache with batched queries (flash_attn_with_kvcache's call) on a device in
  eager mode: the same check at the call, as flash-attn 2.8.4 makes it (its issue
  2709), at the price of one device-to-host read of cache_seqlens per call
  (checks.reads_capacity).
- Otherwise (a contiguous cache or packed queries -- vLLM's varlen call, which
  flash-attn's varlen path does not check either -- on a device; any device cache under
  a graph capture, where a host read is not allowed, or while tracing): reading
  cache_seqlens would make every decoding step wait for the device, or break the
  capture (as cu_seqlens are taken on trust, checks._check_cu_seqlens). So
  :func:`append` keeps every access in range on the device instead -- writes go to
  positions clamped into [0, capacity), each carrying the value its clamped position
  would get anyway, and each sequence attends to at most its capacity -- and records the
  overflow in a per-device flag. Nothing is read or written out of range, so there is no device assert (which
  would poison the CUDA context), but that call's result for the sequence is wrong: the
  error surfaces as a RuntimeError naming block_table from
  :func:`check_kvcache_capacity` (``flash_cann.check_kvcache_capacity``), the one host
  read, which a decoding loop calls where it synchronises anyway (after reading the
  sampled tokens, at the end of generation).

Block ids in block_table (and cache_batch_idx rows) are checked on CPU tensors
(checks.check_kvcache) and taken on trust on a device, as in flash-attn: there an id
outside k_cache's blocks is not guarded.
"""

from __future__ import annotations

import torch

from .checks import CacheProblem

# Per device: int64 (3,) = (calls that overflowed since the last check, the latest such
# call's longest cache_seqlens + seqlen_new, its capacity). Device tensors, written by
# device ops only.
_OVERFLOWS: dict[torch.device, torch.Tensor] = {}


def _record_overflow(cache_seqlens: torch.Tensor, lengths: torch.Tensor, capacity: int) -> None:
    """Count this call in the device's flag if a sequence leaves [0, capacity]; no host
    read."""
    device = cache_seqlens.device
    state = _OVERFLOWS.get(device)
    if state is None:
        state = _OVERFLOWS[device] = torch.zeros(3, dtype=torch.int64, device=device)
    overflowed = ((cache_seqlens < 0) | (lengths > capacity)).any()
    latest = torch.stack((state[0] + 1, lengths.max().long(), state.new_full((), capacity)))
    state.copy_(torch.where(overflowed, latest, state))


def check_kvcache_capacity(device: torch.device | str | None = None) -> None:
    """Raise RuntimeError if a fwd_kvcache call on ``device`` (default: every device used)
    since the last check had cache_seqlens (+ the new tokens) beyond its cache's
    capacity (see the module docstring), and reset the flag. Reads one small tensor per
    device: a host synchronisation, so call it where the loop synchronises anyway."""
    wanted = None if device is None else torch.device(device)
    for where, state in _OVERFLOWS.items():
        if wanted is not None and (where.type != wanted.type or
                                   wanted.index not in (None, where.index)):
            continue
        calls, longest, capacity = state.tolist()
        state.zero_()
        if calls:
            raise RuntimeError(
                f"flash_cann: block_table (or k_cache without one) is too small: {calls} "
                f"flash_attn_with_kvcache call(s) on {where} since the last check had "
                f"cache_seqlens + seqlen_new outside [0, capacity]; the latest asked for "
                f"{longest} keys of a capacity of {capacity} (max_num_blocks_per_seq x "
                f"page_block_size, or k_cache's seqlen). Those sequences attended to at "
                f"most their capacity and the tokens beyond it were not stored: enlarge "
                f"block_table or the cache")


def _append_index(positions: torch.Tensor, block_table, cache_batch_idx, c: CacheProblem):
    """The cache index of each (sequence, position), all positions in [0, capacity)."""
    if block_table is not None:
        blocks = block_table.long().gather(1, positions // c.page_size)
        return blocks, positions % c.page_size
    rows = (cache_batch_idx.long() if cache_batch_idx is not None
            else torch.arange(positions.shape[0], device=positions.device))
    return rows.unsqueeze(1).expand_as(positions), positions


def append(k_cache, v_cache, key, value, cache_seqlens, cache_batch_idx, block_table,
           c: CacheProblem) -> torch.Tensor:
    """Write key/value (batch, seqlen_new, heads_kv, head_dim) into the caches after each
    sequence's cache_seqlens entries (through block_table or cache_batch_idx); return
    int32 (batch,): the keys each sequence attends to (all of its cache capacity when
    cache_seqlens is None), clamped into [0, capacity] by the capacity guard."""
    p = c.problem
    capacity = p.seqlen_k
    device = k_cache.device
    if cache_seqlens is None:
        return torch.full((p.batch,), capacity, dtype=torch.int32, device=device)
    lengths = cache_seqlens + c.seqlen_new
    _record_overflow(cache_seqlens, lengths, capacity)
    if key is not None:
        starts = cache_seqlens.long().unsqueeze(1)
        # Each write goes to its position clamped into the cache, with the value that
        # position gets from this call (a new token, or what it holds): writes that
        # clamp onto the same position carry the same value, so the result is
        # deterministic, and a call within capacity writes exactly its new tokens.
        positions = (starts + torch.arange(c.seqlen_new, device=device)).clamp(0, capacity - 1)
        index = _append_index(positions, block_table, cache_batch_idx, c)
        token = positions - starts
        is_new = ((token >= 0) & (token < c.seqlen_new))[..., None, None]
        token = token.clamp(0, c.seqlen_new - 1)[..., None, None]
        for cache, new in ((k_cache, key), (v_cache, value)):
            written = new.gather(1, token.expand_as(new))
            cache.index_put_(index, torch.where(is_new, written, cache[index]))
    return lengths.clamp(0, capacity)
