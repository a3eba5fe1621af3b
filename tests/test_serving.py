"""The serving path on cpu (issue 24): vLLM's flash_attn_varlen_func over a paged KV cache
(mixed prefill + decode rows, seqused_k, block_table), seqused_k over packed keys,
cache_leftpad and rotary embeddings in flash_attn_with_kvcache, against float64
oracles built independently of the backends (keys gathered densely, padding as a mask,
rotary by flash-attn's formula). The helpers take a device: test_triton_interpreter.py
runs them through the Triton kernels, test_triton.py on a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann
from flash_cann.contract import reference
from flash_cann.contract.variant import Variant

# Max |error| of out (values of size ~1) by dtype: a few ulps of the rounded output.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

# (query rows, keys) per sequence of a mixed batch: a prefill chunk, decode rows, an empty
# query, a decode row with no key, a prefill past a page boundary; keys not a multiple
# of any page size.
MIXED = [(7, 23), (1, 1), (0, 5), (1, 0), (19, 40)]


def _cu(lengths, device):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device=device)


def _rand(gen, *shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, generator=gen).to(device, dtype)


def paged_cache(gen, lengths_k, page, heads_kv, head_dim, dtype, device):
    """(k_cache, v_cache, block_table, dense keys, dense values): each sequence's pages at
    random places of the cache; every entry no sequence uses is NaN, so a kernel that
    reads one shows it."""
    per_seq = max(1, max(-(-n // page) for n in lengths_k))
    blocks = len(lengths_k) * per_seq + 3
    k_cache = torch.full((blocks, page, heads_kv, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    table = torch.randperm(blocks, generator=gen)[:len(lengths_k) * per_seq].view(-1, per_seq)
    keys, values = [], []
    for b, n in enumerate(lengths_k):
        k, v = _rand(gen, n, heads_kv, head_dim), _rand(gen, n, heads_kv, head_dim)
        for j in range(n):
            k_cache[table[b, j // page], j % page] = k[j]
            v_cache[table[b, j // page], j % page] = v[j]
        keys.append(k.to(dtype))
        values.append(v.to(dtype))
    return (k_cache.to(device, dtype), v_cache.to(device, dtype),
            table.to(device, torch.int32), keys, values)


def oracle(q, keys, values, lengths_q, *, causal, window=(-1, -1), softcap=0.0, slopes=None,
           sinks=None, scale, key_padding=None):
    """out (total_q, heads_q, head_dim) and lse (heads_q, total_q), float64, one sequence
    at a time from its dense keys (``key_padding``: a per-sequence bool mask of the keys,
    True = attend). A sequence without keys: out 0, lse -inf (the sink with sinks)."""
    outs, lses = [], []
    start = 0
    for b, n in enumerate(lengths_q):
        rows = q[start:start + n].double()
        start += n
        if keys[b].shape[0] == 0:
            outs.append(torch.zeros_like(rows))
            fill = (sinks.double().view(-1, 1).expand(-1, n) if sinks is not None
                    else torch.full((q.shape[1], n), -math.inf, dtype=torch.float64))
            lses.append(fill)
            continue
        variant = Variant(window_left=window[0], window_right=window[1], softcap=softcap,
                          alibi_slopes=None if slopes is None else slopes[b:b + 1],
                          sinks=sinks)
        mask = None if key_padding is None else key_padding[b].unsqueeze(0)
        out, lse = reference.attention(rows.unsqueeze(0), keys[b].double().unsqueeze(0),
                                       values[b].double().unsqueeze(0), mask, scale=scale,
                                       causal=causal, layout="BSND", variant=variant)
        outs.append(out[0])
        lses.append(lse[0].double())
    return torch.cat(outs), torch.cat(lses, dim=1)


def assert_matches(out, lse, ref_out, ref_lse, dtype):
    assert torch.isfinite(out).all()
    assert (out.double().cpu() - ref_out).abs().max().item() <= TOLERANCE[dtype]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), finite)
    assert torch.equal(lse.cpu()[~finite], ref_lse[~finite].float())
    assert (lse.double().cpu() - ref_lse)[finite].abs().max().item() <= 1e-4


def _features(gen, features, heads_q, batch, device):
    features = dict(features)
    slopes = (torch.rand(batch, heads_q, generator=gen).to(device)
              if features.pop("alibi", False) else None)
    sinks = torch.randn(heads_q, generator=gen).to(device) if features.pop("sinks", False) \
        else None
    return features, slopes, sinks


def check_vllm_paged(device, dtype, gen, *, page, heads=(4, 2), head_dim=16, features,
                     lengths=MIXED):
    """vLLM's call: flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=...,
    max_seqlen_q=..., seqused_k=..., max_seqlen_k=..., block_table=..., ...) with the
    output written into out=, against the oracle over each sequence's gathered keys."""
    lengths_q, lengths_k = zip(*lengths)
    k_cache, v_cache, table, keys, values = paged_cache(gen, lengths_k, page, heads[1],
                                                        head_dim, dtype, device)
    q = _rand(gen, sum(lengths_q), heads[0], head_dim, dtype=dtype, device=device)
    features, slopes, sinks = _features(gen, features, heads[0], len(lengths), device)
    out = torch.full_like(q, float("nan"))
    returned, lse = flash_cann.flash_attn_varlen_func(
        q, k_cache, v_cache, cu_seqlens_q=_cu(lengths_q, device), max_seqlen_q=max(lengths_q),
        seqused_k=torch.tensor(lengths_k, dtype=torch.int32, device=device),
        max_seqlen_k=max(lengths_k), block_table=table, alibi_slopes=slopes, sinks=sinks,
        out=out, return_softmax_lse=True, **features)
    assert returned is out
    ref_out, ref_lse = oracle(q.cpu(), keys, values, lengths_q, scale=head_dim ** -0.5,
                              causal=features.get("causal", False),
                              window=features.get("window_size", (-1, -1)),
                              softcap=features.get("softcap", 0.0),
                              slopes=None if slopes is None else slopes.cpu(),
                              sinks=None if sinks is None else sinks.cpu())
    assert_matches(out, lse, ref_out, ref_lse, dtype)


def check_seqused_packed(device, dtype, gen, *, heads=(4, 2), head_dim=16):
    """seqused_k without block_table: sequence b's keys are the first seqused_k[b] of its
    rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of packed k and v (the rest is NaN:
    never read)."""
    lengths_q, used = (5, 1, 3), (9, 0, 12)
    room = (11, 2, 12)
    cu_k = _cu(room, "cpu")
    k = torch.full((sum(room), heads[1], head_dim), float("nan"))
    v = torch.full_like(k, float("nan"))
    for b, n in enumerate(used):
        k[cu_k[b]:cu_k[b] + n] = torch.randn(n, heads[1], head_dim, generator=gen)
        v[cu_k[b]:cu_k[b] + n] = torch.randn(n, heads[1], head_dim, generator=gen)
    k, v = k.to(device, dtype), v.to(device, dtype)
    q = _rand(gen, sum(lengths_q), heads[0], head_dim, dtype=dtype, device=device)
    out, lse = flash_cann.flash_attn_varlen_func(
        q, k, v, _cu(lengths_q, device), cu_k.to(device), max(lengths_q), max(room),
        causal=True, window_size=(4, 0), seqused_k=torch.tensor(used, dtype=torch.int32,
                                                                device=device),
        return_softmax_lse=True)
    keys = [k.cpu()[cu_k[b]:cu_k[b] + n] for b, n in enumerate(used)]
    values = [v.cpu()[cu_k[b]:cu_k[b] + n] for b, n in enumerate(used)]
    ref_out, ref_lse = oracle(q.cpu(), keys, values, lengths_q, causal=True, window=(4, 0),
                              scale=head_dim ** -0.5)
    assert_matches(out, lse, ref_out, ref_lse, dtype)


def check_leftpad(device, dtype, gen, *, paged, heads=(4, 2), head_dim=16, features):
    """flash_attn_with_kvcache with cache_leftpad (and an append): sequence b attends to
    entries cache_leftpad[b] .. cache_seqlens[b] + seqlen_new - 1, positions absolute
    (the oracle masks the padding instead of cutting it off)."""
    batch, seqlen_q, seqlen_new, capacity, page = 3, 3, 2, 32, 16
    seqlens = torch.tensor([9, 0, 27], dtype=torch.int32)
    leftpad = torch.tensor([4, 0, 26], dtype=torch.int32)  # the last sees 3 keys
    dense_k, dense_v = (torch.randn(batch, capacity, heads[1], head_dim, generator=gen)
                        for _ in range(2))
    k_new, v_new = (_rand(gen, batch, seqlen_new, heads[1], head_dim, dtype=dtype,
                          device=device) for _ in range(2))
    q = _rand(gen, batch, seqlen_q, heads[0], head_dim, dtype=dtype, device=device)
    kwargs = {}
    if paged:
        table = torch.randperm(batch * capacity // page + 2, generator=gen)[
            :batch * capacity // page].view(batch, -1)
        k_cache = torch.zeros(table.numel() + 2, page, heads[1], head_dim)
        v_cache = torch.zeros_like(k_cache)
        k_cache[table.flatten()] = dense_k.view(-1, page, heads[1], head_dim)
        v_cache[table.flatten()] = dense_v.view(-1, page, heads[1], head_dim)
        kwargs["block_table"] = table.to(device, torch.int32)
    else:
        k_cache, v_cache = dense_k.clone(), dense_v.clone()
    k_cache, v_cache = k_cache.to(device, dtype), v_cache.to(device, dtype)
    features, slopes, sinks = _features(gen, features, heads[0], batch, device)
    out, lse = flash_cann.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens.to(device),
        cache_leftpad=leftpad.to(device), alibi_slopes=slopes, sinks=sinks,
        return_softmax_lse=True, **features, **kwargs)
    keys, values, padding = [], [], []
    for b in range(batch):
        n = int(seqlens[b]) + seqlen_new
        dense_k[b, seqlens[b]:n] = k_new[b].cpu().float()
        dense_v[b, seqlens[b]:n] = v_new[b].cpu().float()
        keys.append(dense_k[b, :n].to(dtype))
        values.append(dense_v[b, :n].to(dtype))
        padding.append(torch.arange(n) >= leftpad[b])
    ref_out, ref_lse = oracle(q.cpu().flatten(0, 1), keys, values, [seqlen_q] * batch,
                              scale=head_dim ** -0.5, causal=features.get("causal", False),
                              window=features.get("window_size", (-1, -1)),
                              softcap=features.get("softcap", 0.0),
                              slopes=None if slopes is None else slopes.cpu(),
                              sinks=None if sinks is None else sinks.cpu(),
                              key_padding=padding)
    assert_matches(out.flatten(0, 1), lse.transpose(0, 1).flatten(1), ref_out, ref_lse, dtype)


def rotary_reference(x, cos, sin, positions, interleaved):
    """flash-attn's rotary formula (tests/test_flash_attn.py's apply_rotary_emb reference,
    written out per channel pair): x (batch, seqlen, heads, dim), positions (batch,
    seqlen)."""
    half = cos.shape[1]
    out = x.double().clone()
    c = cos.double()[positions].unsqueeze(2)      # (batch, seqlen, 1, half)
    s = sin.double()[positions].unsqueeze(2)
    first = torch.arange(half) * 2 if interleaved else torch.arange(half)
    second = first + 1 if interleaved else first + half
    x1, x2 = x.double()[..., first], x.double()[..., second]
    out[..., first] = x1 * c - x2 * s
    out[..., second] = x1 * s + x2 * c
    return out


def check_rotary(device, dtype, gen, *, interleaved, causal, paged=False, heads=(4, 2),
                 head_dim=16, rotary_dim=8):
    """Rotary embeddings applied to q and the new k before the op, at flash-attn's
    positions: cache_seqlens + i for the keys (and for the queries of causal / local
    calls), cache_seqlens for every query token otherwise; the cache holds the rotated
    keys."""
    batch, seqlen_q, seqlen_new, capacity = 2, 3, 3, 16
    seqlens = torch.tensor([5, 0], dtype=torch.int32)
    angle = torch.rand(capacity, rotary_dim // 2, generator=gen) * 2 * math.pi
    cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    q = _rand(gen, batch, seqlen_q, heads[0], head_dim, dtype=dtype)
    k_new, v_new = (_rand(gen, batch, seqlen_new, heads[1], head_dim, dtype=dtype)
                    for _ in range(2))
    k_cache, v_cache = (_rand(gen, batch, capacity, heads[1], head_dim, dtype=dtype)
                        for _ in range(2))
    dense_k, dense_v = k_cache.clone(), v_cache.clone()
    out = flash_cann.flash_attn_with_kvcache(
        q.to(device), k_cache.to(device), v_cache.to(device), k_new.to(device), v_new.to(device),
        rotary_cos=cos.to(device), rotary_sin=sin.to(device), cache_seqlens=seqlens.to(device),
        causal=causal, rotary_interleaved=interleaved)
    first = seqlens.long().unsqueeze(1)
    positions_k = first + torch.arange(seqlen_new)
    positions_q = first + torch.arange(seqlen_q) if causal else first.expand(-1, seqlen_q)
    q_ro = rotary_reference(q, cos, sin, positions_q, interleaved)
    k_ro = rotary_reference(k_new, cos, sin, positions_k, interleaved)
    keys, values = [], []
    for b in range(batch):
        n = int(seqlens[b]) + seqlen_new
        dense_k[b, seqlens[b]:n] = k_ro[b].to(dtype)
        dense_v[b, seqlens[b]:n] = v_new[b]
        keys.append(dense_k[b, :n])
        values.append(dense_v[b, :n])
    ref_out, _ = oracle(q_ro.flatten(0, 1), keys, values, [seqlen_q] * batch,
                        scale=head_dim ** -0.5, causal=causal)
    # The channels past rotary_dim pass through; the stored keys are the rotated ones.
    assert (out.flatten(0, 1).double().cpu() - ref_out).abs().max().item() <= \
        4 * TOLERANCE[dtype]
    return out


@pytest.mark.parametrize("page, heads, features", [
    (16, (4, 2), dict(causal=True)),
    (128, (4, 2), dict(causal=True, window_size=(6, 0), softcap=2.0, alibi=True, sinks=True)),
    (512, (2, 2), dict(causal=False, window_size=(3, 3), softcap=1.5, sinks=True)),
    (16, (4, 1), dict(causal=True, alibi=True)),
], ids=["page16-causal", "page128-all", "page512-mha-window", "page16-mqa-alibi"])
def test_vllm_paged_call_matches_the_oracle(page, heads, features, gen):
    check_vllm_paged("cpu", torch.float32, gen, page=page, heads=heads, features=features)


def test_seqused_k_over_packed_keys(gen):
    check_seqused_packed("cpu", torch.float32, gen)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_cache_leftpad_is_a_lower_bound_on_the_keys(paged, gen):
    check_leftpad("cpu", torch.float32, gen, paged=paged,
                  features=dict(causal=True, window_size=(5, 0), alibi=True, sinks=True))


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "halves"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "one-position"])
def test_rotary_matches_flash_attn_formula(interleaved, causal, gen):
    check_rotary("cpu", torch.float32, gen, interleaved=interleaved, causal=causal)


def test_rotary_positions_ignore_leftpad(gen):
    """flash-attn 2.8 rotates at absolute cache positions (block_info.h: seqlen_k_cache is
    cache_seqlens - leftpad, and the kernel adds leftpad back for the cos/sin row):
    cache_leftpad changes which keys are seen, not the rotation."""
    q, k, v = (torch.randn(1, 2, 2, 8, generator=gen) for _ in range(3))
    cos, sin = torch.rand(8, 2, generator=gen), torch.rand(8, 2, generator=gen)
    seqlens = torch.tensor([3], dtype=torch.int32)
    caches = [torch.randn(1, 8, 2, 8, generator=gen) for _ in range(2)]
    with_pad, without = (
        [c.clone() for c in caches] for _ in range(2))
    flash_cann.flash_attn_with_kvcache(q, *with_pad, k, v, cos, sin, seqlens,
                                       cache_leftpad=torch.tensor([2], dtype=torch.int32))
    flash_cann.flash_attn_with_kvcache(q, *without, k, v, cos, sin, seqlens)
    assert torch.equal(with_pad[0], without[0])


@pytest.mark.parametrize("what", ["block_table", "seqused_k"])
def test_vllm_call_is_forward_only(gen, what):
    """flash-attn runs its paged varlen forward with q requiring grad (its tests do);
    only a backward through the output is refused, naming the argument."""
    q, cache = torch.randn(3, 2, 8, requires_grad=True), torch.randn(4, 16, 2, 8)
    seqused_k = torch.tensor([3, 16], dtype=torch.int32)
    if what == "block_table":
        call = dict(cu_seqlens_q=_cu([1, 2], "cpu"), max_seqlen_q=2, max_seqlen_k=16,
                    seqused_k=seqused_k, block_table=torch.tensor([[0], [3]], dtype=torch.int32))
        k = v = cache
    else:
        k = v = cache[:2].flatten(0, 1)
        call = dict(cu_seqlens_q=_cu([1, 2], "cpu"), cu_seqlens_k=_cu([16, 16], "cpu"),
                    max_seqlen_q=2, max_seqlen_k=16, seqused_k=seqused_k)
    out = flash_cann.flash_attn_varlen_func(q, k, v, **call)
    with torch.no_grad():
        plain = flash_cann.flash_attn_varlen_func(q, k, v, **call)
    assert out.requires_grad and not plain.requires_grad
    assert torch.equal(out, plain) and torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match=f"with {what} .* has no backward"):
        out.sum().backward()


def test_opcheck_fwd_kvcache_with_packed_queries(gen):
    """fwd_kvcache with TND queries, leftpad, a paged cache and every feature passes
    torch.library.opcheck (schema, fake kernel, no host sync in the fake)."""
    k_cache, v_cache, table, _, _ = paged_cache(gen, [5, 0, 9], 4, 2, 8, torch.float32, "cpu")
    k_cache, v_cache = (torch.nan_to_num(c) for c in (k_cache, v_cache))
    q = torch.randn(6, 4, 8, generator=gen)
    torch.library.opcheck(
        torch.ops.flash_cann.fwd_kvcache.default,
        (q, k_cache, v_cache, None, None, torch.tensor([5, 0, 9], dtype=torch.int32), None,
         table, torch.tensor([1, 0, 2], dtype=torch.int32), 0.3),
        {"causal": True, "layout": "TND", "cu_seqlens_q": _cu([2, 1, 3], "cpu"),
         "max_seqlen_q": 3, "window_left": 4, "softcap": 2.0,
         "alibi_slopes": torch.rand(4, generator=gen), "sinks": torch.randn(4, generator=gen)})


def test_compile_fullgraph_vllm_call(gen):
    """vLLM's call traces without graph breaks (no host read of a device tensor on the
    way: the fake kernels, out= as a mutation) and matches eager. aot_eager: the graph
    and its functionalisation are what is tested; inductor's codegen would add 25 s."""
    k_cache, v_cache, table, _, _ = paged_cache(gen, [9, 1, 20], 16, 2, 16, torch.float32,
                                                "cpu")
    q = torch.randn(8, 4, 16, generator=gen)
    cu_q, used = _cu([4, 1, 3], "cpu"), torch.tensor([9, 1, 20], dtype=torch.int32)

    def step(q_, out_):
        return flash_cann.flash_attn_varlen_func(
            q=q_, k=k_cache, v=v_cache, out=out_, cu_seqlens_q=cu_q, max_seqlen_q=4,
            seqused_k=used, max_seqlen_k=20, softmax_scale=0.25, causal=True,
            window_size=(7, 0), block_table=table, softcap=3.0)

    torch._dynamo.reset()
    eager = step(q, torch.empty_like(q))
    out = torch.empty_like(q)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, out)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(out, eager)
