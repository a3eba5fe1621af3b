"""The KV cache's bookkeeping for ``torch.ops.flash_cann.fwd_kvcache``, shared by every
backend: appending the new keys and values in place, and how many keys each sequence
then has. Device tensor ops only (an index_put per cache), so a decoding step never
waits for the device."""

from __future__ import annotations

import torch

from .checks import CacheProblem


def _positions(cache_seqlens: torch.Tensor, seqlen_new: int) -> torch.Tensor:
    """(batch, seqlen_new) int64: where each new entry goes in its sequence."""
    offsets = torch.arange(seqlen_new, device=cache_seqlens.device)
    return cache_seqlens.long().unsqueeze(1) + offsets


def append(k_cache, v_cache, key, value, cache_seqlens, cache_batch_idx, block_table,
           c: CacheProblem) -> torch.Tensor:
    """Write key/value (batch, seqlen_new, heads_kv, head_dim) into the caches after each
    sequence's cache_seqlens entries (through block_table or cache_batch_idx); return
    int32 (batch,): the keys each sequence attends to (all of its cache capacity when
    cache_seqlens is None)."""
    p = c.problem
    device = k_cache.device
    if cache_seqlens is None:
        return torch.full((p.batch,), p.seqlen_k, dtype=torch.int32, device=device)
    if key is not None:
        positions = _positions(cache_seqlens, c.seqlen_new)
        if block_table is not None:
            blocks = block_table.long().gather(1, positions // c.page_size)
            index = (blocks, positions % c.page_size)
        else:
            rows = (cache_batch_idx.long() if cache_batch_idx is not None
                    else torch.arange(p.batch, device=device))
            index = (rows.unsqueeze(1).expand_as(positions), positions)
        k_cache.index_put_(index, key)
        v_cache.index_put_(index, value)
    return cache_seqlens + c.seqlen_new
