"""What both hosts of the Triton kernels (CUDA: ``cuda.py``, NPU: ``npu.py``) pass the
kernels beyond the tensors and their strides: the features' arguments and the views of
packed sequences. Imports no Triton."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...contract import layout as layouts
from ...contract.variant import Variant, dropout_threshold
from .buffers import empty


def feature_arguments(variant: Variant, causal: bool) -> dict:
    """The kernels' feature arguments (kernels.forward.attn_fwd's docstring): the window
    as CAUSAL (a right bound) + window_right and LEFT_BOUNDED + window_left, softcap,
    ALiBi slopes, dropout; each constexpr flag off unless the call uses it, so a plain
    call compiles the plain kernel."""
    right_bounded = causal or variant.window_right >= 0
    args = dict(CAUSAL=right_bounded, window_right=0 if causal else max(variant.window_right, 0),
                LEFT_BOUNDED=variant.window_left >= 0, window_left=max(variant.window_left, 0),
                SOFTCAP=variant.softcap > 0, softcap=variant.softcap or 1.0,
                ALIBI=variant.alibi_slopes is not None, DROPOUT=variant.dropout_p > 0)
    if variant.alibi_slopes is not None:
        slopes = variant.alibi_slopes  # (batch, heads_q), maybe a stride-0 expansion
        if slopes.stride(1) != 1:
            slopes = slopes.contiguous()
        args.update(Alibi=slopes, alibi_stride_b=slopes.stride(0))
    if variant.dropout_p > 0:
        args.update(Rng=variant.rng_state, dropout_threshold=dropout_threshold(variant.dropout_p),
                    dropout_scale=1.0 / (1.0 - variant.dropout_p))
    return args


def sink_arguments(variant: Variant) -> dict:
    """The forward and decode kernels' sink arguments: SINKS off without sinks. (The
    dK/dV and dQ kernels take none: the saved lse holds the sink.)"""
    if variant.sinks is None:
        return {}
    return dict(SINKS=True, Sinks=variant.sinks.contiguous())


def packed_views(*tensors):
    """TND tensors as BNSD views of a batch of one (packed sequences are row ranges of
    it); the kernels' sequence geometry comes from cu_seqlens."""
    return tuple(layouts.to_bnsd(t.unsqueeze(0), "BSND") for t in tensors)


def cache_arguments(variant: Variant, causal: bool, seqlens_k, cache_batch_idx, block_table,
                    page_size: int, cache_leftpad=None) -> dict:
    """The feature arguments of a KV cache call (flash_attn_with_kvcache has no dropout,
    the op's contract): sequence b attends to entries cache_leftpad[b] (LEFTPAD; else 0)
    .. seqlens_k[b] - 1 (SEQUSED_K), read in place through its pages (PAGED: the block
    table; ``page_size`` rows a page) or its cache row (BATCH_IDX); packed queries
    (VARLEN: cu_seqlens_q, max_seqlen_q); sinks as sink_arguments."""
    args = feature_arguments(variant, causal)
    del args["DROPOUT"]
    args.update(SeqUsedK=seqlens_k, **sink_arguments(variant))
    if block_table is not None:
        args.update(PAGED=True, BlockTable=block_table, block_table_stride=block_table.stride(0),
                    page_size=page_size)
    if cache_batch_idx is not None:
        args.update(BATCH_IDX=True, CacheBatchIdx=cache_batch_idx)
    if cache_leftpad is not None:
        args.update(LEFTPAD=True, LeftPad=cache_leftpad)
    if variant.varlen:
        args.update(VARLEN=True, CuSeqQ=variant.cu_seqlens_q, max_seqlen_q=variant.max_seqlen_q)
    return args


@dataclass(frozen=True)
class CacheCall:
    """A KV cache call as both hosts launch it: the outputs, the launch arguments that
    precede the hosts' own, and the features."""
    out: torch.Tensor
    lse: torch.Tensor
    group: int     # query heads per kv head: > 1 runs the decode kernel
    heads_kv: int
    tensors: tuple  # q, k, v, out, lse (BNSD views; the cache read in place)
    strides: tuple
    sizes: tuple   # batch, heads_q, group, seqlen_q, capacity, scale * log2(e)
    features: dict
    rows_q: int    # query rows a sequence may have: seqlen_q, or max_seqlen_q (TND)


def cache_call(query, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, *,
               scale: float, causal: bool, variant: Variant, layout: str = "BSND",
               cache_leftpad=None) -> CacheCall:
    """The outputs and the kernels' leading arguments of a KV cache call (query BSND, or
    TND: a batch of one whose rows cu_seqlens_q splits; the cache's capacity is its
    pages' rows with a block table, else its rows). seqlen_q is then the number of
    query rows (the lse's row stride) and the batch the number of sequences."""
    out = empty(query.shape, query.dtype, query.device)
    if layout == layouts.PACKED:
        q, o = packed_views(query, out)
        batch, rows_q = variant.cu_seqlens_q.shape[0] - 1, variant.max_seqlen_q
    else:
        q, o = (layouts.to_bnsd(t, "BSND") for t in (query, out))
        batch, rows_q = q.shape[0], q.shape[2]
    k, v = (layouts.to_bnsd(t, "BSND") for t in (k_cache, v_cache))
    heads_q, seqlen_q = q.shape[1:3]
    heads_kv = k.shape[1]
    group = heads_q // heads_kv
    capacity = block_table.shape[1] * k.shape[2] if block_table is not None else k.shape[2]
    lse = empty((q.shape[0], heads_q, seqlen_q), torch.float32, query.device)
    return CacheCall(
        out, lse[0] if layout == layouts.PACKED else lse, group, heads_kv, (q, k, v, o, lse),
        (*q.stride(), *k.stride(), *v.stride(), *o.stride()),
        (batch, heads_q, group, seqlen_q, capacity, scale * math.log2(math.e)),
        cache_arguments(variant, causal, seqlens_k, cache_batch_idx, block_table, k.shape[2],
                        cache_leftpad), rows_q)
