"""Argument checks of the op contract, shared by every backend.

Each op kernel (and each fake kernel, so ``torch.compile`` reports the same errors at
trace time) calls :func:`check_fwd` / :func:`check_bwd` before computing anything.
Messages name the argument, the rule and what was received. Non-contiguous inputs are
accepted by the contract: every backend reads strided tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import capture
from . import layout as layouts
from .spec import BackendSpec, load
from .variant import PLAIN, Variant, window_bounds


@dataclass(frozen=True)
class Problem:
    """The sizes of one attention call, as the checks established them."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: torch.dtype
    layout: str
    causal: bool
    has_mask: bool
    variant: Variant = PLAIN
    tokens_q: int = 0  # TND: total query rows (seqlen_q is then max_seqlen_q)

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 = MHA, heads_q = MQA)."""
        return self.heads_q // self.heads_kv


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The spec's "accumulator" dtype: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _prefix(msg: str) -> str:
    return f"flash_cann: {msg}"


def require_tensor(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(_prefix(f"{name} must be a torch.Tensor (got {type(t).__name__})"))
    return t


def _same_device(tensors: dict[str, torch.Tensor], ref: str) -> None:
    device = tensors[ref].device
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(_prefix(f"{name} must be on the same device as {ref} "
                                     f"(got {t.device} and {device})"))


def _on_query_device(t: torch.Tensor, name: str, device) -> None:
    """An optional input that travels with the call must be where the query is."""
    if t.device != device:
        raise ValueError(_prefix(f"{name} must be on the same device as query (got {t.device} "
                                 f"and {device})"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_dtype(query: torch.Tensor, backend: BackendSpec | None) -> None:
    name = _dtype_name(query.dtype)
    if backend is not None and name not in backend.dtypes:
        raise TypeError(_prefix(
            f"query dtype {name} is not supported on device type '{backend.device_type}' "
            f"(backend '{backend.name}' supports {', '.join(backend.dtypes)})"))
    if backend is None and not query.is_floating_point():
        raise TypeError(_prefix(f"query must be a floating-point tensor (got {name})"))


# The op arguments of each feature, as the public API spells them (for messages).
_API_NAMES = {"window_left": "window_size[0]", "window_right": "window_size[1]"}


def _check_features(op: str, given: dict, layout: str | None, backend: BackendSpec | None,
                    device_type: str) -> None:
    """A backend without a feature (on this device type) refuses its arguments (unless at
    their defaults)."""
    if backend is None:
        return
    spec = load()
    used = []
    feature = spec.layout_features.get(layout) if layout else None
    if feature is not None:
        used.append((feature, f"layout={layout!r}"))
    op_spec = spec.ops[op]
    if op_spec.feature is not None:
        used.append((op_spec.feature, f"torch.ops.flash_cann.{op}"))
    defaults = {a.name: a.default for a in op_spec.attrs}
    for name, feature in op_spec.featured():
        value = given.get(name)
        if value is None or (name in defaults and value == defaults[name]):
            continue
        shown = "<tensor>" if isinstance(value, torch.Tensor) else repr(value)
        used.append((feature, f"{_API_NAMES.get(name, name)}={shown}"))
    for feature, argument in used:
        if feature not in backend.features_on(device_type):
            able = [b.name for b in spec.backends.values() if feature in b.features]
            raise NotImplementedError(_prefix(
                f"backend '{backend.name}' (device type '{device_type}') does not support "
                f"{feature} yet ({argument}); backends that do: {', '.join(able) or 'none'}"))


def _check_int32_vector(t, name: str, length: int | None, device) -> None:
    require_tensor(t, name)
    if t.dtype != torch.int32 or t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"({length},)" if length is not None else "1-D"
        raise ValueError(_prefix(f"{name} must be an int32 tensor of shape {want} (got "
                                 f"{_dtype_name(t.dtype)} {tuple(t.shape)})"))
    _on_query_device(t, name, device)


def _check_cu_seqlens(cu, name: str, tokens: int, max_seqlen: int, max_name: str,
                      read_values: bool) -> None:
    """0 = cu[0] <= cu[1] <= ... = tokens, each length <= max_seqlen. The values are read
    only where that costs no device synchronisation (CPU tensors, not while tracing):
    on an accelerator max_seqlen is the caller's promise, as in flash-attn."""
    if not read_values:
        return
    starts = cu.tolist()
    lengths = [b - a for a, b in zip(starts, starts[1:])]
    if starts[0] != 0 or starts[-1] != tokens or min(lengths) < 0:
        raise ValueError(_prefix(f"{name} must rise from 0 to the number of tokens ({tokens}) "
                                 f"(got {starts[:8]}{' ...' if len(starts) > 8 else ''})"))
    if max(lengths) > max_seqlen:
        raise ValueError(_prefix(f"{max_name}={max_seqlen} is smaller than the longest "
                                 f"sequence of {name} ({max(lengths)})"))


def reads_values(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "cpu" and not is_fake(t)


def reads_capacity(cache_seqlens: torch.Tensor, paged_batched: bool) -> bool:
    """Whether check_kvcache reads cache_seqlens on the host to check the capacity at the
    call: on CPU always (free); on a device for flash_attn_with_kvcache's paged call
    (a block table, batched queries) in eager mode, as flash-attn 2.8.4's does (its issue
    2709: one device-to-host read per call) -- not under a graph capture, where a host
    read is not allowed, nor on fake tensors (tracing). There, for contiguous caches and
    for packed (TND) queries on a device (vLLM's varlen call, which flash-attn's varlen
    path does not check either), kvcache.append's flag guards instead."""
    from torch._subclasses.fake_tensor import is_fake

    if reads_values(cache_seqlens):
        return True
    return (paged_batched and not is_fake(cache_seqlens) and cache_seqlens.device.type != "meta"
            and not capture.capturing(cache_seqlens.device))


def _check_scores(scale, window_left, window_right, softcap) -> None:
    """The score arguments every attention op takes."""
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(_prefix(f"softmax scale must be a finite number (got {scale!r})"))
    for name, value in (("window_size[0]", window_left), ("window_size[1]", window_right)):
        if not isinstance(value, int) or value < -1:
            raise ValueError(_prefix(f"{name} must be an int >= -1 (-1: unbounded) (got "
                                     f"{value!r})"))
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(_prefix(f"softcap must be a finite number >= 0 (0: off) (got "
                                 f"{softcap!r})"))


def _alibi(slopes, batch: int, heads_q: int, device) -> torch.Tensor | None:
    """ALiBi slopes as float32 (batch, heads_q) (an expanded view of (heads_q,))."""
    if slopes is None:
        return None
    require_tensor(slopes, "alibi_slopes")
    if slopes.dtype != torch.float32 or tuple(slopes.shape) not in ((heads_q,), (batch, heads_q)):
        raise ValueError(_prefix(f"alibi_slopes must be float32 of shape (nheads,) = "
                                 f"({heads_q},) or (batch, nheads) = {(batch, heads_q)} (got "
                                 f"{_dtype_name(slopes.dtype)} {tuple(slopes.shape)})"))
    _on_query_device(slopes, "alibi_slopes", device)
    return slopes.expand(batch, heads_q)


def _sinks(sinks, heads_q: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Attention sinks: one logit per query head, in the accumulator dtype."""
    if sinks is None:
        return None
    require_tensor(sinks, "sinks")
    want = accumulator_dtype(dtype)
    if sinks.dtype != want or tuple(sinks.shape) != (heads_q,):
        raise ValueError(_prefix(f"sinks must be {_dtype_name(want)} of shape (nheads,) = "
                                 f"({heads_q},): one logit per query head (got "
                                 f"{_dtype_name(sinks.dtype)} {tuple(sinks.shape)})"))
    _on_query_device(sinks, "sinks", device)
    return sinks


def check_fp16_scores(fp16_scores: bool, dtype: torch.dtype) -> bool:
    """fp16_scores (a bool: the schema's, or the API's _flag) is a permission for fp16 inputs
    only, the same on every backend (those without an fp16-score path ignore it): the
    spec's comment on the attribute says why."""
    if fp16_scores and dtype == torch.bfloat16:
        raise ValueError(_prefix(
            "fp16_scores=True is refused for bfloat16 inputs: scores held in bfloat16 keep an "
            "8-bit mantissa, 8x coarser than fp16's; use fp16 inputs or fp16_scores=False"))
    if fp16_scores and dtype != torch.float16:
        raise ValueError(_prefix(f"fp16_scores=True takes float16 inputs only (got "
                                 f"{_dtype_name(dtype)}): it permits fp16 scores, a loss of "
                                 f"precision only fp16 inputs are held to"))
    return fp16_scores


def _check_dropout(dropout_p, rng_state, device) -> None:
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(_prefix(f"dropout_p must be in [0, 1) (got {dropout_p!r})"))
    if dropout_p > 0:
        if rng_state is None:
            raise ValueError(_prefix("rng_state (int64 (seed, offset)) is required with "
                                     "dropout_p > 0; the public API draws it"))
        require_tensor(rng_state, "rng_state")
        if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,):
            raise ValueError(_prefix(f"rng_state must be int64 of shape (2,) (got "
                                     f"{_dtype_name(rng_state.dtype)} {tuple(rng_state.shape)})"))
        _on_query_device(rng_state, "rng_state", device)


def _check_qkv(tensors: dict, layout: str, backend: BackendSpec | None, same_batch=True):
    """dtype, rank, emptiness and size agreement of query, key, value in ``layout``
    (``same_batch``: and their batch sizes); returns (heads_q, heads_kv, head_dim)."""
    spec = load()
    query = tensors["query"]
    _same_device(tensors, "query")
    for name in ("key", "value"):
        if tensors[name].dtype != query.dtype:
            raise TypeError(_prefix(f"query, key and value must have the same dtype "
                                    f"(got query {_dtype_name(query.dtype)}, "
                                    f"{name} {_dtype_name(tensors[name].dtype)})"))
    _check_dtype(query, backend)
    dims = spec.layouts[layout]
    for name in ("query", "key", "value"):
        t = tensors[name]
        if t.dim() != len(dims):
            raise ValueError(_prefix(f"{name} must be {len(dims)}-D ({', '.join(dims)}) for "
                                     f"layout {layout} (got {t.dim()}-D shape {tuple(t.shape)})"))
        if t.numel() == 0 and t.shape[-1] == 0:  # head_dim is every layout's last dim
            raise ValueError(_prefix(f"head_dim must be in [{spec.head_dim_min}, "
                                     f"{spec.head_dim_max}] (got 0: {name}'s last dim, shape "
                                     f"{tuple(t.shape)})"))
        if t.numel() == 0:
            raise ValueError(_prefix(f"{name} must not be empty (got shape {tuple(t.shape)})"))
    sizes = {name: _sizes(t, layout) for name, t in tensors.items()}
    (b, hq, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = (sizes[n] for n in ("query", "key",
                                                                            "value"))
    if same_batch and layout != layouts.PACKED and not (b == bk == bv):
        raise ValueError(_prefix(f"query, key and value must have the same batch size "
                                 f"(got {b}, {bk}, {bv})"))
    if dk != d or dv != d:
        raise ValueError(_prefix(f"query, key and value must have the same head_dim "
                                 f"(got {d}, {dk}, {dv})"))
    if not spec.head_dim_min <= d <= spec.head_dim_max:
        raise ValueError(_prefix(f"head_dim must be in [{spec.head_dim_min}, "
                                 f"{spec.head_dim_max}] (got {d})"))
    if sv != sk:
        raise ValueError(_prefix(f"key and value must have the same seqlen (got {sk} and {sv})"))
    if hv != hk:
        raise ValueError(_prefix(f"key and value must have the same number of heads "
                                 f"(got {hk} and {hv})"))
    if hq % hk:
        raise ValueError(_prefix(f"query heads ({hq}) must be a multiple of key/value heads "
                                 f"({hk}) for GQA/MQA"))
    return hq, hk, d


def _sizes(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(batch, heads, seqlen, head_dim); TND: (1, heads, tokens, head_dim)."""
    if layout == layouts.PACKED:
        return 1, t.shape[1], t.shape[0], t.shape[2]
    return layouts.sizes(t, layout)


def check_fwd(query, key, value, key_padding_mask, scale: float, causal: bool, layout: str,
              backend: BackendSpec | None = None, *, cu_seqlens_q=None, cu_seqlens_k=None,
              alibi_slopes=None, rng_state=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
              window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
              dropout_p: float = 0.0, sinks=None, fp16_scores: bool = False,
              op: str = "fwd") -> Problem:
    """Validate the forward op's arguments; return the problem sizes and its variant."""
    spec = load()
    tensors = {n: require_tensor(t, n) for n, t in
               (("query", query), ("key", key), ("value", value))}
    if layout not in spec.layouts:
        raise ValueError(_prefix(f"layout must be one of {', '.join(spec.layouts)} "
                                 f"(got {layout!r})"))
    _check_features(op, dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             alibi_slopes=alibi_slopes, rng_state=rng_state,
                             max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                             window_left=window_left,
                             window_right=-1 if causal else window_right,
                             softcap=softcap, dropout_p=dropout_p, sinks=sinks), layout,
                    backend,
                    query.device.type)
    _check_scores(scale, window_left, window_right, softcap)
    fp16_scores = check_fp16_scores(fp16_scores, query.dtype)
    if key_padding_mask is not None:
        tensors["key_padding_mask"] = require_tensor(key_padding_mask, "key_padding_mask")
    hq, hk, d = _check_qkv({n: tensors[n] for n in ("query", "key", "value")}, layout, backend)
    _same_device(tensors, "query")
    packed = layout == layouts.PACKED
    tokens_q = 0
    if packed:
        if key_padding_mask is not None:
            raise ValueError(_prefix("key_padding_mask is not taken with layout TND: "
                                     "cu_seqlens_k delimits each sequence's keys"))
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError(_prefix("cu_seqlens_q and cu_seqlens_k are required with layout "
                                     "TND"))
        _check_int32_vector(cu_seqlens_q, "cu_seqlens_q", None, query.device)
        _check_int32_vector(cu_seqlens_k, "cu_seqlens_k", cu_seqlens_q.shape[0], query.device)
        if cu_seqlens_q.shape[0] < 2:
            raise ValueError(_prefix(f"cu_seqlens_q must hold batch + 1 >= 2 offsets (got "
                                     f"{cu_seqlens_q.shape[0]})"))
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(_prefix(f"{name} must be a positive int with layout TND "
                                         f"(got {value!r})"))
        tokens_q, tokens_k = query.shape[0], key.shape[0]
        _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", tokens_q, max_seqlen_q, "max_seqlen_q",
                          reads_values(cu_seqlens_q))
        _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", tokens_k, max_seqlen_k, "max_seqlen_k",
                          reads_values(cu_seqlens_k))
        b, sq, sk = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
    else:
        for name, value, default in (("cu_seqlens_q", cu_seqlens_q, None),
                                     ("cu_seqlens_k", cu_seqlens_k, None),
                                     ("max_seqlen_q", max_seqlen_q, 0),
                                     ("max_seqlen_k", max_seqlen_k, 0)):
            if value is not default and value != default:
                raise ValueError(_prefix(f"{name} is only taken with layout TND (packed "
                                         f"sequences); the layout is {layout}"))
        b, _, sq, _ = layouts.sizes(query, layout)
        sk = layouts.sizes(key, layout)[2]
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(_prefix(f"key_padding_mask must be torch.bool here (got "
                                    f"{_dtype_name(key_padding_mask.dtype)}); the public API "
                                    f"converts integer masks"))
        if tuple(key_padding_mask.shape) != (b, sk):
            raise ValueError(_prefix(f"key_padding_mask must have shape (batch, seqlen_k) = "
                                     f"{(b, sk)} (got {tuple(key_padding_mask.shape)})"))
    _check_dropout(dropout_p, rng_state, query.device)
    window_left, window_right = window_bounds(window_left, window_right, causal, sk)
    variant = Variant(window_left=window_left, window_right=window_right, softcap=float(softcap),
                      alibi_slopes=_alibi(alibi_slopes, b, hq, query.device),
                      dropout_p=float(dropout_p), rng_state=rng_state if dropout_p > 0 else None,
                      cu_seqlens_q=cu_seqlens_q if packed else None,
                      cu_seqlens_k=cu_seqlens_k if packed else None,
                      max_seqlen_q=max_seqlen_q if packed else 0,
                      max_seqlen_k=max_seqlen_k if packed else 0,
                      sinks=_sinks(sinks, hq, query.dtype, query.device),
                      fp16_scores=fp16_scores)
    return Problem(b, hq, hk, sq, sk, d, query.dtype, layout, bool(causal),
                   key_padding_mask is not None, variant, tokens_q)


def lse_shape(p: Problem) -> tuple[int, ...]:
    """softmax_lse's shape: (batch, heads_q, seqlen_q), or (heads_q, tokens_q) for TND."""
    if p.layout == layouts.PACKED:
        return (p.heads_q, p.tokens_q)
    return (p.batch, p.heads_q, p.seqlen_q)


def check_bwd(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
              grad_softmax_lse, scale: float, causal: bool, layout: str,
              backend: BackendSpec | None = None, **features) -> Problem:
    """Validate the backward op's arguments; return the problem sizes and its variant."""
    p = check_fwd(query, key, value, key_padding_mask, scale, causal, layout, backend,
                  op="bwd", **features)
    extra = {n: require_tensor(t, n) for n, t in
             (("grad_out", grad_out), ("out", out), ("softmax_lse", softmax_lse))}
    if grad_softmax_lse is not None:
        extra["grad_softmax_lse"] = require_tensor(grad_softmax_lse, "grad_softmax_lse")
    _same_device({"query": query, **extra}, "query")
    for name in ("grad_out", "out"):
        t = extra[name]
        if t.shape != query.shape or t.dtype != query.dtype:
            raise ValueError(_prefix(
                f"{name} must match query in shape and dtype (got {tuple(t.shape)} "
                f"{_dtype_name(t.dtype)}, query {tuple(query.shape)} "
                f"{_dtype_name(query.dtype)})"))
    shape = lse_shape(p)
    lse_dtype = accumulator_dtype(query.dtype)
    described = "(heads_q, tokens_q)" if layout == layouts.PACKED else "(batch, heads_q, seqlen_q)"
    for name in ("softmax_lse", "grad_softmax_lse"):
        t = extra.get(name)
        if t is not None and (tuple(t.shape) != shape or t.dtype != lse_dtype):
            raise ValueError(_prefix(
                f"{name} must be {_dtype_name(lse_dtype)} of shape {described} "
                f"= {shape} (got {_dtype_name(t.dtype)} {tuple(t.shape)})"))
    return p


# flash-attn's limit on num_splits (its split-KV workspace is sized by it, as ours is).
MAX_NUM_SPLITS = 128


@dataclass(frozen=True)
class CacheProblem:
    """The sizes of one fwd_kvcache call, as check_kvcache established them."""

    problem: Problem          # query x the cache, seqlen_k = the cache's capacity; layout
                              # BSND, or TND (variant.cu_seqlens_q / max_seqlen_q)
    seqlen_new: int           # keys appended per sequence (0: none)
    page_size: int            # 0: not paged
    cache_leftpad: torch.Tensor | None = None  # int32 (batch,): each sequence's first key

    @property
    def packed(self) -> bool:
        return self.problem.layout == layouts.PACKED


def _check_cache_query(query, layout: str, cu_seqlens_q, max_seqlen_q, batch_from) -> tuple:
    """The query's rank for ``layout`` and, with TND, its cu_seqlens_q / max_seqlen_q;
    returns (batch, seqlen_q, tokens_q) (tokens_q 0 for BSND). ``batch_from``: (name,
    batch) of the argument that fixes the batch of a TND call (cache_seqlens, else
    block_table's rows), or None."""
    if layout not in ("BSND", layouts.PACKED):
        raise ValueError(_prefix(f"fwd_kvcache's layout must be BSND or TND (got {layout!r})"))
    if layout == "BSND":
        for name, value, default in (("cu_seqlens_q", cu_seqlens_q, None),
                                     ("max_seqlen_q", max_seqlen_q, 0)):
            if value is not default and value != default:
                raise ValueError(_prefix(f"{name} is only taken with layout TND (packed "
                                         f"query rows); the layout is BSND"))
        if query.dim() != 4:
            raise ValueError(_prefix(f"query must be 4-D (batch, seqlen, heads, head_dim) for "
                                     f"layout BSND (got {query.dim()}-D shape "
                                     f"{tuple(query.shape)})"))
        return query.shape[0], query.shape[1], 0
    if query.dim() != 3:
        raise ValueError(_prefix(f"query must be 3-D (total_q, heads, head_dim) for layout TND "
                                 f"(got {query.dim()}-D shape {tuple(query.shape)})"))
    if cu_seqlens_q is None:
        raise ValueError(_prefix("cu_seqlens_q is required with layout TND: it delimits each "
                                 "sequence's query rows"))
    require_tensor(cu_seqlens_q, "cu_seqlens_q")
    if batch_from is not None:
        name, batch = batch_from
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != batch + 1:
            raise ValueError(_prefix(
                f"cu_seqlens_q must hold batch + 1 = {batch + 1} offsets, batch being "
                f"{name}'s length {batch} (got shape {tuple(cu_seqlens_q.shape)})"))
    _check_int32_vector(cu_seqlens_q, "cu_seqlens_q", None, query.device)
    if cu_seqlens_q.shape[0] < 2:
        raise ValueError(_prefix(f"cu_seqlens_q must hold batch + 1 >= 2 offsets (got "
                                 f"{cu_seqlens_q.shape[0]})"))
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 1:
        raise ValueError(_prefix(f"max_seqlen_q must be a positive int with layout TND (got "
                                 f"{max_seqlen_q!r})"))
    tokens_q = query.shape[0]
    _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", tokens_q, max_seqlen_q, "max_seqlen_q",
                      reads_values(cu_seqlens_q))
    return cu_seqlens_q.shape[0] - 1, max_seqlen_q, tokens_q


def _check_leftpad(cache_leftpad, cache_seqlens, seqlen_new: int, capacity: int, batch: int,
                   device) -> None:
    """cache_leftpad: int32 (batch,) on the query's device; on CPU tensors 0 <= leftpad <=
    the sequence's keys (cache_seqlens + seqlen_new, or the capacity without
    cache_seqlens): they start there. On a device the kernels clamp it into that range
    instead (no host read)."""
    _check_int32_vector(cache_leftpad, "cache_leftpad", batch, device)
    if not reads_values(cache_leftpad):
        return
    if cache_seqlens is None:
        lengths = torch.full((batch,), capacity)
    elif reads_values(cache_seqlens):
        lengths = cache_seqlens.long() + seqlen_new
    else:
        return
    bad = (cache_leftpad < 0) | (cache_leftpad.long() > lengths)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(_prefix(f"cache_leftpad must be in [0, cache_seqlens + seqlen_new] "
                                 f"(the first key sequence b attends to) (got cache_leftpad[{b}]"
                                 f" = {int(cache_leftpad[b])}, keys: {int(lengths[b])})"))


def check_kvcache(query, k_cache, v_cache, key, value, cache_seqlens, cache_batch_idx,
                  block_table, scale: float, causal: bool, *, cache_leftpad=None,
                  layout: str = "BSND", cu_seqlens_q=None, max_seqlen_q: int = 0,
                  alibi_slopes=None, window_left: int = -1, window_right: int = -1,
                  softcap: float = 0.0, sinks=None, num_splits: int = 0,
                  backend: BackendSpec | None = None) -> CacheProblem:
    """Validate fwd_kvcache's arguments (see the spec's comment on the op).

    The batch: query's (BSND); with TND, cache_seqlens' length, else block_table's rows,
    else len(cu_seqlens_q) - 1 -- the other per-sequence arguments must agree with it."""
    if not 0 <= num_splits <= MAX_NUM_SPLITS:
        raise ValueError(_prefix(f"num_splits must be in [0, {MAX_NUM_SPLITS}] (0: the backend "
                                 f"chooses, 1: no split, n: n key ranges per sequence) (got "
                                 f"{num_splits})"))
    _check_features("fwd_kvcache", dict(cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                        alibi_slopes=alibi_slopes, window_left=window_left,
                                        window_right=-1 if causal else window_right,
                                        softcap=softcap, sinks=sinks),
                    layout if layout in layouts.LAYOUTS else None, backend, query.device.type)
    _check_scores(scale, window_left, window_right, softcap)
    tensors = {n: require_tensor(t, n) for n, t in
               (("query", query), ("k_cache", k_cache), ("v_cache", v_cache))}
    for name in ("k_cache", "v_cache"):
        t = tensors[name]
        if t.dim() != 4:
            raise ValueError(_prefix(f"{name} must be 4-D (batch, seqlen, heads, head_dim), or "
                                     f"(num_blocks, page_block_size, heads, head_dim) with "
                                     f"block_table (got {t.dim()}-D shape {tuple(t.shape)})"))
    if k_cache.shape != v_cache.shape:
        raise ValueError(_prefix(f"k_cache and v_cache must have the same shape (got "
                                 f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)})"))
    packed = layout == layouts.PACKED
    batch_from = None
    if packed and isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1:
        batch_from = ("cache_seqlens", cache_seqlens.shape[0])
    elif packed and isinstance(block_table, torch.Tensor) and block_table.dim() == 2:
        batch_from = ("block_table", block_table.shape[0])
    batch, seqlen_q, tokens_q = _check_cache_query(query, layout, cu_seqlens_q, max_seqlen_q,
                                                   batch_from)
    # The query as a BSND batch of one for the shared q/k/v checks (a view).
    as_bsnd = query.unsqueeze(0) if packed else query
    hq, hk, d = _check_qkv({"query": as_bsnd, "key": k_cache, "value": v_cache}, "BSND",
                           backend, same_batch=False)
    device = query.device
    if (key is None) != (value is None):
        raise ValueError(_prefix("k and v must be given together (the new keys and values "
                                 "to append) or both be None"))
    seqlen_new = 0
    if key is not None and packed:
        raise ValueError(_prefix("k and v (new entries to append) are not taken with layout "
                             "TND: a packed (vLLM-style) call attends to what the cache "
                             "holds; append with a BSND query, or write the cache first"))
    if key is not None:
        for name, t in (("k", key), ("v", value)):
            require_tensor(t, name)
            want = (batch, t.shape[1] if t.dim() == 4 else -1, hk, d)
            if t.dim() != 4 or tuple(t.shape) != want or t.dtype != query.dtype or \
                    t.device != device:
                raise ValueError(_prefix(
                    f"{name} must be {_dtype_name(query.dtype)} (batch, seqlen_new, nheads_k, "
                    f"headdim) = {(batch, 'seqlen_new', hk, d)} on {device} (got "
                    f"{_dtype_name(t.dtype)} {tuple(t.shape)} on {t.device})"))
        if key.shape != value.shape:
            raise ValueError(_prefix(f"k and v must have the same shape (got "
                                     f"{tuple(key.shape)} and {tuple(value.shape)})"))
        if cache_seqlens is None:
            raise ValueError(_prefix("cache_seqlens is required when appending k and v (it "
                                     "says where each sequence's new entries go)"))
        seqlen_new = key.shape[1]
    if cache_seqlens is not None:
        _check_int32_vector(cache_seqlens, "cache_seqlens", batch, device)
    page_size = 0
    if block_table is not None:
        require_tensor(block_table, "block_table")
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or \
                block_table.shape[0] != batch or block_table.device != device:
            raise ValueError(_prefix(f"block_table must be int32 (batch, max_num_blocks) = "
                                     f"({batch}, ...) on {device} (got "
                                     f"{_dtype_name(block_table.dtype)} "
                                     f"{tuple(block_table.shape)} on {block_table.device})"))
        if cache_batch_idx is not None:
            raise ValueError(_prefix("cache_batch_idx is not taken with a paged cache "
                                     "(block_table): the table already maps each sequence"))
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        if cache_batch_idx is not None:
            _check_int32_vector(cache_batch_idx, "cache_batch_idx", batch, device)
        elif k_cache.shape[0] < batch:
            raise ValueError(_prefix(f"k_cache holds {k_cache.shape[0]} sequences, fewer than "
                                     f"the batch ({batch}): sequence b uses cache row b unless "
                                     f"cache_batch_idx maps it"))
        capacity = k_cache.shape[1]
    if (cache_seqlens is not None and cache_seqlens.numel()
            and reads_capacity(cache_seqlens, block_table is not None and not packed)):
        # Otherwise kvcache.append guards this (no host read); see kvcache.py.
        shortest, longest = torch.stack((cache_seqlens.min(), cache_seqlens.max())).tolist()
        if shortest < 0:
            raise ValueError(_prefix(f"cache_seqlens must be >= 0 (got {shortest})"))
        longest += seqlen_new
        if longest > capacity:
            holder = (f"block_table's {block_table.shape[1]} blocks x page_block_size "
                      f"{page_size}" if block_table is not None else "k_cache's seqlen")
            raise RuntimeError(_prefix(
                f"block_table (or k_cache without one) is too small: cache_seqlens + "
                f"seqlen_new reaches {longest}, beyond the capacity of {capacity} keys per "
                f"sequence ({holder})"))
    if cache_leftpad is not None:
        _check_leftpad(require_tensor(cache_leftpad, "cache_leftpad"), cache_seqlens,
                       seqlen_new, capacity, batch, device)
    if cache_batch_idx is not None and reads_values(cache_batch_idx):
        rows = cache_batch_idx.tolist()
        if min(rows) < 0 or max(rows) >= k_cache.shape[0]:
            raise ValueError(_prefix(f"cache_batch_idx must index k_cache's {k_cache.shape[0]} "
                                     f"sequences: each in [0, {k_cache.shape[0]}) (got {rows[:8]}"
                                     f"{' ...' if len(rows) > 8 else ''})"))
    if block_table is not None and reads_values(block_table):
        _check_block_table(block_table, cache_seqlens, seqlen_new, page_size, k_cache.shape[0])
    window_left, window_right = window_bounds(window_left, window_right, causal, capacity)
    variant = Variant(window_left=window_left, window_right=window_right, softcap=float(softcap),
                      alibi_slopes=_alibi(alibi_slopes, batch, hq, device),
                      cu_seqlens_q=cu_seqlens_q if packed else None,
                      max_seqlen_q=max_seqlen_q if packed else 0,
                      sinks=_sinks(sinks, hq, query.dtype, device))
    problem = Problem(batch, hq, hk, seqlen_q, capacity, d, query.dtype, layout, bool(causal),
                      False, variant, tokens_q)
    return CacheProblem(problem, seqlen_new, page_size, cache_leftpad)


def _check_block_table(block_table, cache_seqlens, seqlen_new: int, page_size: int,
                       blocks: int) -> None:
    """Every page a sequence uses (its first ceil((cache_seqlens + seqlen_new) / page_size)
    entries; all of them without cache_seqlens) is in [0, blocks): a negative entry would
    silently wrap around the cache, one past the end fail deep inside a backend. Entries
    past a sequence's length are never read, as in flash-attn."""
    if cache_seqlens is None:
        used = torch.full((block_table.shape[0], 1), block_table.shape[1])
    else:
        used = ((cache_seqlens.long() + seqlen_new + page_size - 1) // page_size).unsqueeze(1)
    in_use = torch.arange(block_table.shape[1]).unsqueeze(0) < used
    bad = in_use & ((block_table < 0) | (block_table >= blocks))
    if bool(bad.any()):
        b, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(_prefix(f"block_table entries must be pages of k_cache, in [0, {blocks}) "
                                 f"(got block_table[{b}, {j}] = {int(block_table[b, j])})"))


def key_padding_mask_as_bool(mask, batch: int, seqlen_k: int,
                             device: torch.device) -> torch.Tensor | None:
    """The public API's mask normalisation: bool/integer, (batch, seqlen_k) or (seqlen_k,)
    -> torch.bool (batch, seqlen_k), True (nonzero) = attend."""
    if mask is None:
        return None
    mask = require_tensor(mask, "key_padding_mask")
    if mask.dtype != torch.bool and (mask.is_floating_point() or mask.is_complex()):
        raise TypeError(_prefix(f"key_padding_mask must be a bool or integer tensor "
                                f"(True/nonzero = attend); got {_dtype_name(mask.dtype)}"))
    _on_query_device(mask, "key_padding_mask", device)
    if tuple(mask.shape) == (seqlen_k,):
        mask = mask.unsqueeze(0).expand(batch, seqlen_k)
    elif tuple(mask.shape) != (batch, seqlen_k):
        raise ValueError(_prefix(f"key_padding_mask must have shape (batch, seqlen_k) = "
                                 f"{(batch, seqlen_k)} or (seqlen_k,) = ({seqlen_k},) "
                                 f"(got {tuple(mask.shape)})"))
    return mask if mask.dtype == torch.bool else mask != 0
