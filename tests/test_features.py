"""flash-attn 2.8's features through the public API and torch.ops.flash_cann on the CPU
backend: every feature alone and combined vs the float64 oracle (flash-attn's rule:
error <= k x the same-precision baseline's), dropout's statistics and exactness, the KV
cache's in-place append and paged reads, and the op's PyTorch citizenship with the new
arguments (opcheck, torch.compile(fullgraph=True)) and its errors, eager and compiled.
The Triton kernels run the same checks in test_triton_interpreter.py (CPU) and
test_triton.py (GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flash_cann
from flash_cann.contract import checks, kvcache, reference
from flash_cann.contract.variant import PLAIN, Variant

import oracle_checks
from oracle_checks import assert_all_ok, check_variant, packed_lengths

# (id, features): each alone, then combined.
FEATURES = [
    ("window", dict(window=(5, 3))),
    ("window-left-causal", dict(window=(4, -1), causal=True)),
    ("softcap", dict(softcap=1.5)),
    ("alibi-heads", dict(alibi="heads")),
    ("alibi-batch-causal", dict(alibi="batch", causal=True)),
    ("dropout", dict(dropout_p=0.3)),
    ("sinks", dict(sinks=True)),
    ("sinks-window-causal", dict(sinks=True, window=(4, -1), causal=True)),
    ("all", dict(window=(6, 0), causal=True, softcap=2.0, alibi="batch", dropout_p=0.2,
                 sinks=True)),
]
# (seqlen_q, seqlen_k) per sequence: an empty query sequence, rows above the diagonal,
# one longer than a CPU block (128 x 256).
PACKED = [(17, 40), (0, 5), (40, 17), (1, 1), (130, 300)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=str)
@pytest.mark.parametrize("name, features", FEATURES, ids=[f[0] for f in FEATURES])
def test_batched_features_match_the_oracle(name, features, dtype, gen):
    assert_all_ok(check_variant("cpu", dtype, gen=gen, seqlens=(37, 70), heads=(4, 2),
                                **features))


@pytest.mark.parametrize("name, features", FEATURES, ids=[f[0] for f in FEATURES])
def test_packed_features_match_the_oracle(name, features, gen):
    assert_all_ok(check_variant("cpu", torch.bfloat16, gen=gen, seqlens=PACKED, heads=(6, 2),
                                head_dim=40, layout="TND", **features))


# window_size as flash-attn 2.8 takes it: seqlen_q 20 > seqlen_k 12, so a right bound of
# 12 taken literally would hide keys from the first rows; flash-attn unbounds it.
@pytest.mark.parametrize("window_size, causal, same_as", [
    (torch.tensor([-1, 3]), True, (-1, -1)),      # causal sets the right bound to 0
    ((12, 12), False, (-1, -1)),                  # bounds >= seqlen_k: unbounded
    ([2, 40], False, (2, -1)),
    (np.array([3, 1]), False, (3, 1)),
    ((4, 12), False, (4, -1)),  # right = seqlen_k: bottom-right alignment would cut row 0
], ids=["causal-tensor", "beyond-seqlen_k", "list", "numpy", "right-at-seqlen_k"])
def test_window_size_is_normalised_as_in_flash_attn(window_size, causal, same_as):
    q = torch.randn(1, 20, 2, 16)
    k, v = torch.randn(2, 1, 12, 2, 16)
    out = flash_cann.flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    torch.testing.assert_close(out, flash_cann.flash_attn_func(q, k, v, causal=causal,
                                                               window_size=same_as),
                               rtol=0, atol=0)
    if same_as == (-1, -1):  # and the oracle agrees
        ref, _ = reference.attention(q, k, v, scale=16 ** -0.5, causal=causal, layout="BSND")
        torch.testing.assert_close(out, ref)


def test_kvcache_takes_causal_with_any_right_bound():
    q, k_cache, v_cache = torch.randn(1, 2, 2, 16), *torch.randn(2, 1, 10, 2, 16)
    seqlens = torch.tensor([7], dtype=torch.int32)
    out = flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                             causal=1, window_size=(-1, 5))
    torch.testing.assert_close(out, flash_cann.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, causal=True), rtol=0, atol=0)


def test_causal_with_a_right_bound_is_no_window(monkeypatch):
    """causal=True sets the right bound whatever window_size[1] says (flash-attn 2.8), so
    such a call uses no window: the backend receives a plain causal call."""
    from flash_cann.backends.twin import launcher as twin

    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.float16) for _ in range(3))
    served = []
    monkeypatch.setattr(twin, "forward", lambda *a, **kw: served.append(kw) or (
        torch.zeros_like(q), torch.zeros(1, 2, 8)))
    with flash_cann.use_backend("twin"):
        flash_cann.flash_attn_func(q, k, v, causal=True, window_size=(-1, 5))
    assert len(served) == 1 and served[0]["causal"] is True
    variant = served[0].get("variant", PLAIN)
    assert variant.plain and variant.window_right == -1, served[0]


@pytest.mark.parametrize("check", ["fwd", "kvcache"])
def test_causal_with_a_right_bound_needs_no_window_feature(check):
    """The same rule at the capability check: a backend without windows takes
    causal=True with any window_size[1] (causal's bound is the right bound), and still
    refuses a left bound."""
    import dataclasses

    from flash_cann.contract.spec import load

    cpu = load().backends["cpu"]
    no_window = dataclasses.replace(cpu, features=tuple(f for f in cpu.features if f != "window"),
                                    also_on_features={})
    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.float16) for _ in range(3))

    def call(left, right):
        if check == "fwd":
            return checks.check_fwd(q, k, v, None, 0.25, True, "BNSD", no_window,
                                    window_left=left, window_right=right)
        cache = torch.randn(1, 8, 2, 16, dtype=torch.float16)
        return checks.check_kvcache(q.transpose(1, 2), cache, cache, None, None,
                                    torch.tensor([8], dtype=torch.int32), None, None, 0.25,
                                    True, backend=no_window, window_left=left,
                                    window_right=right)

    call(-1, 5)
    with pytest.raises(NotImplementedError, match="does not support window"):
        call(3, 5)


@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_window_with_padding_and_rows_that_see_nothing(sinks, gen):
    """A window narrower than the padding holes leaves rows with no key: out 0, lse -inf
    (the sink's logit with sinks), zero gradients."""
    assert_all_ok(check_variant("cpu", torch.float16, gen=gen, seqlens=(50, 30), heads=(2, 1),
                                window=(0, 0), causal=False, masked=True, softcap=3.0,
                                alibi="heads", sinks=sinks))


def _dropout_call(p, seed, seqlens=(64, 96), heads=(4, 4)):
    q, k, v = oracle_checks.make_qkv(2, *heads, *seqlens, 16, torch.float32, "BSND",
                                     generator=torch.Generator().manual_seed(0))
    rng = torch.Generator().manual_seed(seed)
    return flash_cann.flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True,
                                      generator=rng)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_one_minus_p_of_the_probabilities(p):
    """2 x 4 x 64 x 96 = 49k Bernoulli draws: the kept share within 5 sigma of 1 - p,
    and no visible correlation between neighbouring columns."""
    _, _, probs = _dropout_call(p, seed=123)
    kept = (~torch.signbit(probs)).double()
    n = kept.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept.mean().item() - (1 - p)) < 5 * sigma
    both = (kept[..., 1:] * kept[..., :-1]).mean().item()
    assert abs(both - (1 - p) ** 2) < 5 * (1 - p) * sigma * 2


def test_dropout_is_repeatable_by_seed_and_varies_without_it():
    out_a = _dropout_call(0.4, seed=7)[0]
    out_b = _dropout_call(0.4, seed=7)[0]
    out_c = _dropout_call(0.4, seed=8)[0]
    assert torch.equal(out_a, out_b) and not torch.equal(out_a, out_c)
    q = torch.randn(1, 16, 2, 8)
    torch.manual_seed(3)
    first = flash_cann.flash_attn_func(q, q, q, dropout_p=0.5)
    torch.manual_seed(3)
    assert torch.equal(flash_cann.flash_attn_func(q, q, q, dropout_p=0.5), first)


def test_varlen_packed_functions_are_the_unpacked_one(gen):
    cu, _, max_len, _ = packed_lengths([(5, 5), (9, 9)])
    qkv = torch.randn(14, 3, 4, 16, generator=gen)
    out = flash_cann.flash_attn_varlen_qkvpacked_func(qkv, cu, max_len, causal=True)
    q, k, v = qkv.unbind(1)
    torch.testing.assert_close(out, flash_cann.flash_attn_varlen_func(q, k, v, cu, cu, max_len,
                                                                      max_len, causal=True))
    kv_out = flash_cann.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, max_len, max_len,
                                                        causal=True)
    torch.testing.assert_close(kv_out, out)


def test_attention_takes_tnd(gen):
    """The CANN-style entry point with layout TND equals flash_attn_varlen_func."""
    cu_q, cu_k, max_q, max_k = packed_lengths([(3, 7), (6, 2)])
    q = torch.randn(9, 4, 16, generator=gen)
    k, v = (torch.randn(9, 2, 16, generator=gen) for _ in range(2))
    out, lse = flash_cann.attention(q, k, v, layout="TND", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                    max_seqlen_q=max_q, max_seqlen_k=max_k, return_lse=True)
    ref_out, ref_lse, _ = flash_cann.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                            return_attn_probs=True)
    torch.testing.assert_close((out, lse), (ref_out, ref_lse))
    assert lse.shape == (4, 9)


# --------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------

def _cache_case(gen, *, paged, batch=3, seqlen_q=2, seqlen_new=2, heads=(4, 2), head_dim=16,
                page_size=8, capacity=72, batch_idx=False, dtype=torch.float32, device="cpu"):
    """q, the caches (paged: a random block table over a shuffled pool), the new k/v,
    cache_seqlens (one sequence empty before the append; one of 63 + seqlen_new entries,
    one past a multiple of every key block size when seqlen_new is 2; one filled to the
    end), and a dense view of each sequence's cache rows for the oracle."""
    hq, hk = heads

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(device, dtype)

    q = rand(batch, seqlen_q, hq, head_dim)
    k_new, v_new = rand(batch, seqlen_new, hk, head_dim), rand(batch, seqlen_new, hk, head_dim)
    filled = [0, 63, capacity - seqlen_new] + [int(x) for x in torch.randint(
        capacity - seqlen_new + 1, (max(0, batch - 3),), generator=gen)]
    cache_seqlens = torch.tensor(filled[:batch], dtype=torch.int32, device=device)
    kwargs = {}
    if paged:
        blocks = capacity // page_size
        pool = batch * blocks + 3
        table = torch.randperm(pool, generator=gen)[:batch * blocks].view(batch, blocks)
        k_cache, v_cache = rand(pool, page_size, hk, head_dim), rand(pool, page_size, hk, head_dim)
        kwargs["block_table"] = table.to(device, torch.int32)

        def dense(cache, b):
            return cache[table[b].to(device)].flatten(0, 1)
    else:
        rows = torch.randperm(batch + 2, generator=gen)[:batch] if batch_idx else torch.arange(batch)
        k_cache, v_cache = rand(batch + 2, capacity, hk, head_dim), rand(batch + 2, capacity, hk,
                                                                          head_dim)
        if batch_idx:
            kwargs["cache_batch_idx"] = rows.to(device, torch.int32)

        def dense(cache, b):
            return cache[int(rows[b])]
    return q, k_cache, v_cache, k_new, v_new, cache_seqlens, kwargs, dense


def _cache_oracle(q, k_cache, v_cache, seqlens_k, dense, *, causal, variant, scale):
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(seqlens_k[b])
        k = dense(k_cache, b)[:n].unsqueeze(0).double()
        v = dense(v_cache, b)[:n].unsqueeze(0).double()
        slopes = None if variant.alibi_slopes is None else variant.alibi_slopes[b:b + 1]
        one = Variant(window_left=variant.window_left, window_right=variant.window_right,
                      softcap=variant.softcap, alibi_slopes=slopes, sinks=variant.sinks)
        out, lse = reference.attention(q[b:b + 1].double(), k, v, scale=scale, causal=causal,
                                       layout="BSND", variant=one)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


# Max |error| of out (values of size ~1) by dtype: a few ulps of the rounded output.
CACHE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
CACHE_FEATURES = [dict(causal=True), dict(causal=True, window_size=(6, -1), softcap=2.0,
                                          alibi=True, sinks=True),
                  dict(causal=False, window_size=(3, 3))]
CACHE_LAYOUTS = [(True, False), (False, False), (False, True)]
CACHE_IDS = ["paged", "dense", "cache_batch_idx"]


def check_kvcache(device, dtype, gen, *, paged, batch_idx, features, **sizes):
    """flash_attn_with_kvcache appends in place and matches the float64 oracle built from
    each sequence's cache rows (after the append)."""
    q, k_cache, v_cache, k_new, v_new, seqlens, kwargs, dense = _cache_case(
        gen, paged=paged, batch_idx=batch_idx, dtype=dtype, device=device, **sizes)
    before = k_cache.clone()
    features = dict(features)
    alibi = features.pop("alibi", False)
    slopes = (torch.rand(q.shape[0], q.shape[2], generator=gen).to(device) if alibi else None)
    sinks = (torch.randn(q.shape[2], generator=gen).to(device) if features.pop("sinks", False)
             else None)
    out, lse = flash_cann.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, alibi_slopes=slopes,
        return_softmax_lse=True, sinks=sinks, **features, **kwargs)
    # The new entries landed after each sequence's filled part, nothing else changed.
    new = k_new.shape[1]
    for b in range(q.shape[0]):
        n = int(seqlens[b])
        assert torch.equal(dense(k_cache, b)[n:n + new], k_new[b])
        assert torch.equal(dense(v_cache, b)[n:n + new], v_new[b])
    assert int((k_cache != before).any(dim=(-1, -2)).sum()) <= q.shape[0] * new
    window = features.get("window_size", (-1, -1))
    variant = Variant(window_left=window[0], window_right=window[1],
                      softcap=features.get("softcap", 0.0), alibi_slopes=slopes, sinks=sinks)
    ref_out, ref_lse = _cache_oracle(q, k_cache, v_cache, seqlens + new, dense,
                                     causal=features["causal"], variant=variant,
                                     scale=q.shape[-1] ** -0.5)
    assert (out.double() - ref_out).abs().max().item() <= CACHE_TOLERANCE[dtype]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double() - ref_lse)[finite].abs().max().item() <= 1e-4


@pytest.mark.parametrize("paged, batch_idx", CACHE_LAYOUTS, ids=CACHE_IDS)
@pytest.mark.parametrize("features", CACHE_FEATURES, ids=["causal", "all", "window"])
def test_kvcache_appends_in_place_and_attends_to_the_filled_cache(paged, batch_idx, features,
                                                                   gen):
    check_kvcache("cpu", torch.float32, gen, paged=paged, batch_idx=batch_idx,
                  features=features)


def test_kvcache_without_new_entries_reads_the_whole_given_length(gen):
    q, k_cache, v_cache, _, _, seqlens, kwargs, dense = _cache_case(gen, paged=True)
    out = flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens + 1,
                                             causal=True, **kwargs)
    ref_out, _ = _cache_oracle(q, k_cache, v_cache, seqlens + 1, dense, causal=True,
                               variant=Variant(), scale=q.shape[-1] ** -0.5)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    # cache_seqlens as an int, and no cache_seqlens (the whole cache).
    full = flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=72, **kwargs)
    torch.testing.assert_close(full, flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                                        **kwargs))


def check_capacity_guard(device):
    """The device-side capacity guard (contract/kvcache.py), run on ``device``'s tensors
    directly (on CPU the checks raise first): an append past a paged cache's capacity
    writes inside the sequence's blocks only, each sequence attends to at most the
    capacity, and check_kvcache_capacity raises once, naming block_table."""
    page, heads_kv, head_dim = 4, 1, 8                   # 2 blocks per sequence: capacity 8
    k_cache, v_cache = torch.randn(2, 5, page, heads_kv, head_dim, device=device)
    block_table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    k, v = torch.randn(2, 2, 2, heads_kv, head_dim, device=device)
    query = torch.randn(2, 1, heads_kv, head_dim, device=device)
    in_range = torch.zeros(2, dtype=torch.int32, device=device)
    c = checks.check_kvcache(query, k_cache, v_cache, k, v, in_range, None, block_table, 1.0,
                             False)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    overflowing = torch.tensor([7, 9], dtype=torch.int32, device=device)
    lengths = kvcache.append(k_cache, v_cache, k, v, overflowing, None, block_table, c)
    assert lengths.tolist() == [8, 8]
    # Sequence 0 gets its first new token at position 7 (block 1, offset 3), the one that
    # fits; sequence 1 (already past its capacity) and the unmapped block 4 keep theirs.
    before_k[1, 3], before_v[1, 3] = k[0, 0], v[0, 0]
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)
    with pytest.raises(RuntimeError, match=r"block_table .* is too small: 1 flash_attn_with_"
                                           r"kvcache call\(s\) .* the latest asked for 11 keys "
                                           r"of a capacity of 8"):
        flash_cann.check_kvcache_capacity(device)
    flash_cann.check_kvcache_capacity(device)  # the check reset the flag
    kvcache.append(k_cache, v_cache, k, v, in_range, None, block_table, c)
    flash_cann.check_kvcache_capacity()           # a call within capacity sets nothing


def test_kvcache_capacity_guard_on_device_tensors():
    check_capacity_guard("cpu")


def test_kvcache_capacity_guard_bounds():
    """The guard's two edges, on kvcache.append directly: a sequence that ends exactly at
    the capacity is within it (nothing recorded, all its tokens stored), and a negative
    cache_seqlens is outside [0, capacity] (recorded, attends to nothing)."""
    page, heads_kv, head_dim = 4, 1, 8                   # 2 blocks per sequence: capacity 8
    k_cache, v_cache = torch.randn(2, 5, page, heads_kv, head_dim)
    block_table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    k, v = torch.randn(2, 2, 2, heads_kv, head_dim)
    query = torch.randn(2, 1, heads_kv, head_dim)
    zeros = torch.zeros(2, dtype=torch.int32)
    c = checks.check_kvcache(query, k_cache, v_cache, k, v, zeros, None, block_table, 1.0,
                             False)
    flash_cann.check_kvcache_capacity("cpu")             # no flag left by another test
    full = torch.tensor([6, 6], dtype=torch.int32)       # 6 + 2 new = the capacity, 8
    assert kvcache.append(k_cache, v_cache, k, v, full, None, block_table, c).tolist() == [8, 8]
    torch.testing.assert_close(k_cache[[1, 3], 2:], k)   # positions 6, 7: block 1 / 3, 2..3
    flash_cann.check_kvcache_capacity("cpu")             # within capacity: nothing to raise
    negative = torch.tensor([-3, 0], dtype=torch.int32)
    assert kvcache.append(k_cache, v_cache, k, v, negative, None, block_table, c).tolist() \
        == [0, 2]
    with pytest.raises(RuntimeError, match=r"1 flash_attn_with_kvcache call\(s\)"):
        flash_cann.check_kvcache_capacity("cpu")


def test_kvcache_num_splits_is_a_hint(gen):
    """num_splits changes no result (the CPU reference ignores it; the Triton backend's
    split-KV is tested in test_triton_interpreter.py); the op refuses one outside
    flash-attn's [0, 128] by name, the API a negative one."""
    q, k_cache, v_cache, _, _, seqlens, kwargs, _ = _cache_case(gen, paged=True)
    outs = [flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               num_splits=n, **kwargs) for n in (0, 1, 7)]
    assert all(torch.equal(outs[0], out) for out in outs[1:])
    for bad in (-1, 129):
        with pytest.raises(ValueError, match=r"num_splits must be in \[0, 128\]"):
            torch.ops.flash_cann.fwd_kvcache(q, k_cache, v_cache, None, None, seqlens, None,
                                             kwargs["block_table"], None, 0.25, num_splits=bad)
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=-1, **kwargs)


# --------------------------------------------------------------------------------------
# PyTorch citizenship
# --------------------------------------------------------------------------------------

def _packed_inputs(gen, dtype=torch.float32, requires_grad=False):
    cu_q, cu_k, max_q, max_k = packed_lengths([(5, 9), (3, 2), (7, 7)])
    q = torch.randn(15, 4, 16, generator=gen, dtype=dtype).requires_grad_(requires_grad)
    k, v = (torch.randn(18, 2, 16, generator=gen, dtype=dtype).requires_grad_(requires_grad)
            for _ in range(2))
    features = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                    max_seqlen_k=max_k, alibi_slopes=torch.rand(3, 4, generator=gen),
                    rng_state=torch.tensor([11, 0]), window_left=4, softcap=3.0,
                    dropout_p=0.25,
                    sinks=torch.randn(4, generator=gen).requires_grad_(requires_grad))
    return q, k, v, features


def test_opcheck_with_every_feature(gen):
    q, k, v, features = _packed_inputs(gen, requires_grad=True)
    torch.library.opcheck(torch.ops.flash_cann.fwd.default, (q, k, v, None, 0.3),
                          {"causal": True, "layout": "TND", **features})
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.3, True, "TND", **features)
    torch.library.opcheck(torch.ops.flash_cann.bwd.default,
                          (torch.randn(out.shape, generator=gen), q.detach(), k.detach(),
                           v.detach(), out.detach(), lse.detach(), None, None, 0.3),
                          {"causal": True, "layout": "TND", **features,
                           "sinks": features["sinks"].detach()})


def test_opcheck_kvcache(gen):
    q, k_cache, v_cache, k_new, v_new, seqlens, kwargs, _ = _cache_case(gen, paged=True)
    torch.library.opcheck(torch.ops.flash_cann.fwd_kvcache.default,
                          (q, k_cache, v_cache, k_new, v_new, seqlens, None,
                           kwargs["block_table"], None, 0.25),
                          {"causal": True, "window_left": 5, "softcap": 1.0,
                           "sinks": torch.randn(q.shape[2], generator=gen)})


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_varlen_with_features(dynamic, gen):
    """Packed sequences with window, softcap, ALiBi and sinks (no dropout: compiled and
    eager draw different seeds) compile without graph breaks and match eager, with
    gradients (the sinks' included)."""
    q, k, v, features = _packed_inputs(gen, requires_grad=True)
    sinks = features["sinks"]

    def model(q_, k_, v_, sinks_):
        return flash_cann.flash_attn_varlen_func(
            q_, k_, v_, features["cu_seqlens_q"], features["cu_seqlens_k"],
            features["max_seqlen_q"], features["max_seqlen_k"], causal=True,
            window_size=(4, 0), softcap=3.0, alibi_slopes=features["alibi_slopes"],
            sinks=sinks_)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    eager = model(q, k, v, sinks)
    out = compiled(q, k, v, sinks)
    torch.testing.assert_close(out, eager)
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v, sinks)),
                    torch.autograd.grad(eager.sum(), (q, k, v, sinks))):
        torch.testing.assert_close(a, b)


def test_compile_fullgraph_dropout_and_kvcache(gen):
    """Dropout draws its seed inside the graph; the KV cache's append is a mutation the
    graph keeps."""
    q = torch.randn(2, 9, 4, 16, generator=gen, requires_grad=True)
    k_cache, v_cache = torch.zeros(2, 20, 2, 16), torch.zeros(2, 20, 2, 16)
    k_new = torch.randn(2, 1, 2, 16, generator=gen)

    def model(q_, lengths):
        a = flash_cann.flash_attn_func(q_, q_, q_, dropout_p=0.3, causal=True)
        b = flash_cann.flash_attn_with_kvcache(q_[:, -1:].detach(), k_cache, v_cache, k_new,
                                               k_new, cache_seqlens=lengths)
        return a, b

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    a, b = compiled(q, torch.tensor([3, 5], dtype=torch.int32))
    a.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
    assert torch.equal(k_cache[0, 3], k_new[0, 0]) and torch.equal(k_cache[1, 5], k_new[1, 0])
    assert b.shape == (2, 1, 4, 16)


# --------------------------------------------------------------------------------------
# Errors (eager, and at trace time under torch.compile)
# --------------------------------------------------------------------------------------

def _varlen(q, k, v, cu_q, cu_k, max_q=9, max_k=9, **kwargs):
    return flash_cann.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


def _cu(*values):
    return torch.tensor(values, dtype=torch.int32)


_CU = torch.tensor([0, 4, 9], dtype=torch.int32)
_Q3 = torch.randn(9, 2, 16)
_BT = torch.tensor([[0], [1]], dtype=torch.int32)   # q (2, 8, 2, 16) as 2 pages of 8
_ROT = torch.ones(8, 4)                              # rotary cos / sin, rotary_dim 8

BAD_CALLS = [
    ("window type", lambda q: flash_cann.flash_attn_func(q, q, q, window_size=4),
     TypeError, "window_size must be a pair of ints"),
    ("window below -1", lambda q: flash_cann.flash_attn_func(q, q, q, window_size=(-2, 0)),
     ValueError, r"window_size\[0\] must be an int >= -1"),
    ("window float", lambda q: flash_cann.flash_attn_func(q, q, q, window_size=(0.5, 1)),
     TypeError, "window_size must be a pair of ints"),
    ("window float tensor", lambda q: flash_cann.flash_attn_func(
        q, q, q, window_size=torch.tensor([1.0, 2.0])), TypeError,
     "window_size must be a pair of ints"),
    ("window of 3", lambda q: flash_cann.flash_attn_func(
        q, q, q, window_size=torch.tensor([1, 2, 3])), TypeError,
     "window_size must be a pair of ints"),
    ("negative softcap", lambda q: flash_cann.flash_attn_func(q, q, q, softcap=-1.0),
     ValueError, "softcap must be a finite number >= 0"),
    ("dropout 1", lambda q: flash_cann.flash_attn_func(q, q, q, dropout_p=1.0),
     ValueError, r"dropout_p must be in \[0, 1\)"),
    ("alibi shape", lambda q: flash_cann.flash_attn_func(q, q, q, alibi_slopes=torch.ones(3)),
     ValueError, r"alibi_slopes must be float32 of shape \(nheads,\) = \(2,\)"),
    ("alibi dtype", lambda q: flash_cann.flash_attn_func(
        q, q, q, alibi_slopes=torch.ones(2, dtype=torch.float64)), ValueError,
     "alibi_slopes must be float32"),
    ("cu_seqlens dtype", lambda q: _varlen(_Q3, _Q3, _Q3, _CU.long(), _CU), ValueError,
     r"cu_seqlens_q must be an int32 tensor"),
    ("cu_seqlens end", lambda q: _varlen(_Q3, _Q3, _Q3, torch.tensor([0, 4, 8], dtype=torch.int32),
                                         _CU), ValueError,
     r"cu_seqlens_q must rise from 0 to the number of tokens \(9\)"),
    ("max_seqlen short", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU, max_q=4), ValueError,
     r"max_seqlen_q=4 is smaller than the longest sequence of cu_seqlens_q \(5\)"),
    ("cu_seqlens lengths", lambda q: _varlen(_Q3, _Q3, _Q3, _CU,
                                             torch.tensor([0, 9], dtype=torch.int32)),
     ValueError, r"cu_seqlens_k must be an int32 tensor of shape \(3,\)"),
    ("varlen block_table over packed keys", lambda q: _varlen(
        _Q3, _Q3, _Q3, _CU, _CU, block_table=torch.zeros(2, 1, dtype=torch.int32)),
     ValueError, r"k_cache must be 4-D .* or \(num_blocks, page_block_size, heads, head_dim\) "
                 r"with block_table"),
    # vLLM's call (flash_attn_varlen_func over a KV cache) and packed queries of the op.
    ("block_table without lengths", lambda q: flash_cann.flash_attn_varlen_func(
        _Q3, q, q, cu_seqlens_q=_CU, max_seqlen_q=5, max_seqlen_k=8, block_table=_BT),
     ValueError, "block_table needs seqused_k or cu_seqlens_k"),
    ("seqused_k without cu_seqlens_k", lambda q: flash_cann.flash_attn_varlen_func(
        _Q3, _Q3, _Q3, _CU, None, 5, 5, seqused_k=_cu(1, 2)),
     ValueError, "seqused_k without block_table needs cu_seqlens_k"),
    ("seqused_k shape", lambda q: flash_cann.flash_attn_varlen_func(
        _Q3, q, q, _CU, None, 5, 8, block_table=_BT, seqused_k=_cu(1, 2, 3)),
     ValueError, r"seqused_k must be int32 \(2,\) on cpu, batch being len\(cu_seqlens_q\) - 1"),
    ("dropout over a cache", lambda q: flash_cann.flash_attn_varlen_func(
        _Q3, q, q, _CU, None, 5, 8, 0.1, block_table=_BT, seqused_k=_cu(1, 2)),
     ValueError, "dropout_p=0.1 is not taken with block_table"),
    ("attn probs over a cache", lambda q: flash_cann.flash_attn_varlen_func(
        _Q3, _Q3, _Q3, _CU, _CU, 5, 5, return_attn_probs=True, seqused_k=_cu(1, 2)),
     ValueError, "return_attn_probs=True is not taken with seqused_k"),
    ("out shape", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU, out=_Q3[:4]),
     ValueError, r"out must be float32 \(9, 2, 16\) on cpu, like q \(got float32 \(4, 2, 16\)"),
    ("TND appending", lambda q: torch.ops.flash_cann.fwd_kvcache(
        _Q3, q, q, q[:, :1], q[:, :1], _cu(1, 2), None, None, None, 1.0, layout="TND",
        cu_seqlens_q=_CU, max_seqlen_q=5),
     ValueError, r"k and v \(new entries to append\) are not taken with layout TND"),
    ("TND cu_seqlens_q length", lambda q: torch.ops.flash_cann.fwd_kvcache(
        _Q3, q, q, None, None, _cu(1, 2, 3), None, None, None, 1.0, layout="TND",
        cu_seqlens_q=_CU, max_seqlen_q=5),
     ValueError, r"cu_seqlens_q must hold batch \+ 1 = 4 offsets, batch being cache_seqlens's "
                 r"length 3 \(got shape \(3,\)\)"),
    ("TND without cu_seqlens_q", lambda q: torch.ops.flash_cann.fwd_kvcache(
        _Q3, q, q, None, None, _cu(1, 2), None, None, None, 1.0, layout="TND", max_seqlen_q=5),
     ValueError, "cu_seqlens_q is required with layout TND"),
    ("cu_seqlens_q with BSND", lambda q: torch.ops.flash_cann.fwd_kvcache(
        q, q, q, None, None, _cu(1, 2), None, None, None, 1.0, cu_seqlens_q=_CU),
     ValueError, "cu_seqlens_q is only taken with layout TND"),
    ("TND query rank", lambda q: torch.ops.flash_cann.fwd_kvcache(
        q, q, q, None, None, _cu(1, 2), None, None, None, 1.0, layout="TND", cu_seqlens_q=_CU,
        max_seqlen_q=5),
     ValueError, r"query must be 3-D \(total_q, heads, head_dim\) for layout TND"),
    ("TND max_seqlen_q zero", lambda q: torch.ops.flash_cann.fwd_kvcache(
        _Q3, q, q, None, None, _cu(1, 2), None, None, None, 1.0, layout="TND", cu_seqlens_q=_CU),
     ValueError, "max_seqlen_q must be a positive int with layout TND"),
    ("cache_leftpad dtype", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(1, 2), cache_leftpad=torch.tensor([0, 1])),
     ValueError, r"cache_leftpad must be an int32 tensor of shape \(2,\)"),
    ("cache_leftpad device", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(1, 2), cache_leftpad=_cu(0, 1).to("meta")),
     ValueError, "cache_leftpad must be on the same device as query"),
    # Rotary embeddings (flash_attn_with_kvcache rotates q and the new k).
    ("rotary without sin", lambda q: flash_cann.flash_attn_with_kvcache(q, q, q, rotary_cos=q),
     ValueError, "rotary_cos and rotary_sin must be given together"),
    ("rotary without k", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, rotary_cos=_ROT, rotary_sin=_ROT, cache_seqlens=1),
     ValueError, "rotary_cos / rotary_sin rotate the new keys: they need k and v"),
    ("rotary_dim past headdim", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, q[:, :1], q[:, :1], torch.ones(8, 9), torch.ones(8, 9), cache_seqlens=1),
     ValueError, r"rotary_dim = 2 \* cos.shape\[1\] = 18 must be <= headdim 16"),
    ("rotary tables differ", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, q[:, :1], q[:, :1], _ROT, _ROT[:4], cache_seqlens=1),
     ValueError, r"cos and sin must both be \(seqlen_rotary, rotary_dim / 2\)"),
    ("TND with a mask", lambda q: flash_cann.attention(
        _Q3, _Q3, _Q3, layout="TND", cu_seqlens_q=_CU, cu_seqlens_k=_CU, max_seqlen_q=5,
        max_seqlen_k=5, key_padding_mask=torch.ones(2, 9, dtype=torch.bool)),
     ValueError, "key_padding_mask is not taken with layout TND"),
    ("cu_seqlens without TND", lambda q: flash_cann.attention(q, q, q, layout="BSND",
                                                              cu_seqlens_q=_CU),
     ValueError, "cu_seqlens_q is only taken with layout TND"),
    ("k without v", lambda q: flash_cann.flash_attn_with_kvcache(q, q, q, k=q, cache_seqlens=1),
     ValueError, "k and v must be given together"),
    ("cache overflow", lambda q: flash_cann.flash_attn_with_kvcache(q, q, q, k=q[:, :2],
                                                                    v=q[:, :2], cache_seqlens=7),
     RuntimeError, r"block_table \(or k_cache without one\) is too small: cache_seqlens \+ "
                   r"seqlen_new reaches 9, beyond the capacity of 8 keys per sequence \(k_cache"),
    ("paged overflow", lambda q: flash_cann.flash_attn_with_kvcache(
        q[:, :1], q, q, cache_seqlens=17, block_table=torch.zeros(2, 2, dtype=torch.int32)),
     RuntimeError, r"block_table .* reaches 17, beyond the capacity of 16 keys per sequence "
                   r"\(block_table's 2 blocks x page_block_size 8\)"),
    ("negative cache_seqlens", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=-1), ValueError, r"cache_seqlens must be >= 0 \(got -1\)"),
    ("paged with batch idx", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, block_table=torch.zeros(2, 1, dtype=torch.int32),
        cache_batch_idx=torch.zeros(2, dtype=torch.int32)),
     ValueError, "cache_batch_idx is not taken with a paged cache"),
]

# Every varlen and KV-cache input out of its range (issue 29); eager only: most are
# decided by the tensors' values, which are not known while tracing.
RANGE_CALLS = [
    # Every varlen input: decreasing, negative, past the token count, wrong dtype, wrong
    # device, max_seqlen smaller than a length (checked where the values are read: CPU).
    ("cu_seqlens_q decreasing", lambda q: _varlen(_Q3, _Q3, _Q3, _cu(0, 6, 4, 9), _cu(0, 3, 6, 9)),
     ValueError, r"cu_seqlens_q must rise from 0 to the number of tokens \(9\) \(got \[0, 6, 4, 9\]"),
    ("cu_seqlens_k decreasing", lambda q: _varlen(_Q3, _Q3, _Q3, _cu(0, 3, 6, 9), _cu(0, 6, 4, 9)),
     ValueError, r"cu_seqlens_k must rise from 0 to the number of tokens \(9\)"),
    ("cu_seqlens_q negative", lambda q: _varlen(_Q3, _Q3, _Q3, _cu(-1, 4, 9), _CU),
     ValueError, r"cu_seqlens_q must rise from 0"),
    ("cu_seqlens_k negative", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _cu(0, -4, 9)),
     ValueError, r"cu_seqlens_k must rise from 0"),
    ("cu_seqlens_q past the tokens", lambda q: _varlen(_Q3, _Q3, _Q3, _cu(0, 12, 9), _CU),
     ValueError, r"cu_seqlens_q must rise from 0 to the number of tokens \(9\)"),
    ("cu_seqlens_k past the tokens", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _cu(0, 4, 10)),
     ValueError, r"cu_seqlens_k must rise from 0 to the number of tokens \(9\)"),
    ("cu_seqlens_k dtype", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU.long()), ValueError,
     r"cu_seqlens_k must be an int32 tensor"),
    ("cu_seqlens_q device", lambda q: _varlen(_Q3, _Q3, _Q3, _CU.to("meta"), _CU), ValueError,
     r"cu_seqlens_q must be on the same device as query"),
    ("cu_seqlens_k device", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU.to("meta")), ValueError,
     r"cu_seqlens_k must be on the same device as query"),
    ("max_seqlen_k short", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU, max_k=4), ValueError,
     r"max_seqlen_k=4 is smaller than the longest sequence of cu_seqlens_k \(5\)"),
    ("max_seqlen_q zero", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU, max_q=0), ValueError,
     r"max_seqlen_q must be a positive int with layout TND"),
    ("max_seqlen_k negative", lambda q: _varlen(_Q3, _Q3, _Q3, _CU, _CU, max_k=-9), ValueError,
     r"max_seqlen_k must be a positive int with layout TND"),
    # Every KV-cache input: the same, and block tables / batch indices out of range. q
    # (2, 8, 2, 16) doubles as a cache of 2 sequences (or 2 pages) of 8 entries.
    ("cache_seqlens negative", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :1], v=q[:, :1], cache_seqlens=_cu(-1, 2)),
     ValueError, r"cache_seqlens must be >= 0 \(got -1\)"),
    ("cache_seqlens past the cache", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(3, 9)),
     RuntimeError, r"k_cache without one\) is too small: cache_seqlens \+ seqlen_new "
                   r"reaches 9, beyond the capacity of 8"),
    ("cache_seqlens dtype", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=torch.tensor([1, 2])),
     ValueError, r"cache_seqlens must be an int32 tensor of shape \(2,\)"),
    ("cache_seqlens shape", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(1, 2, 3)),
     ValueError, r"cache_seqlens must be an int32 tensor of shape \(2,\)"),
    ("cache_seqlens device", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(1, 2).to("meta")),
     ValueError, r"cache_seqlens must be on the same device as query"),
    ("cache_batch_idx past the cache", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(1, 2), cache_batch_idx=_cu(0, 2)),
     ValueError, r"cache_batch_idx must index k_cache's 2 sequences: each in \[0, 2\) "
                 r"\(got \[0, 2\]\)"),
    ("cache_batch_idx negative", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :1], v=q[:, :1], cache_seqlens=_cu(1, 2), cache_batch_idx=_cu(-1, 0)),
     ValueError, r"cache_batch_idx must index k_cache's 2 sequences"),
    ("cache_batch_idx dtype", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_batch_idx=torch.tensor([0, 1])),
     ValueError, r"cache_batch_idx must be an int32 tensor of shape \(2,\)"),
    ("cache_batch_idx device", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_batch_idx=_cu(0, 1).to("meta")),
     ValueError, r"cache_batch_idx must be on the same device as query"),
    ("block_table past the pages", lambda q: flash_cann.flash_attn_with_kvcache(
        q[:1], q, q, block_table=_cu(1, 2).view(1, 2)),
     ValueError, r"block_table entries must be pages of k_cache, in \[0, 2\) "
                 r"\(got block_table\[0, 1\] = 2\)"),
    ("block_table negative", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :1], v=q[:, :1], cache_seqlens=_cu(0, 3), block_table=_cu(0, -1).view(2, 1)),
     ValueError, r"block_table entries must be pages of k_cache, in \[0, 2\) "
                 r"\(got block_table\[1, 0\] = -1\)"),
    ("block_table dtype", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, block_table=torch.zeros(2, 1, dtype=torch.int64)),
     ValueError, r"block_table must be int32 \(batch, max_num_blocks\)"),
    ("block_table device", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, block_table=torch.zeros(2, 1, dtype=torch.int32, device="meta")),
     ValueError, r"block_table must be int32 \(batch, max_num_blocks\) = \(2, ...\) on cpu"),
    ("k dtype", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :1].double(), v=q[:, :1].double(), cache_seqlens=_cu(1, 2)),
     ValueError, r"k must be float32 \(batch, seqlen_new, nheads_k, headdim\)"),
    ("v device", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :1], v=q[:, :1].to("meta"), cache_seqlens=_cu(1, 2)),
     ValueError, r"v must be float32 .* on cpu \(got float32 \(2, 1, 2, 16\) on meta\)"),
    ("k past the cache", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :3], v=q[:, :3], cache_seqlens=_cu(0, 6)),
     RuntimeError, r"cache_seqlens \+ seqlen_new reaches 9, beyond the capacity of 8"),
    ("cache_leftpad past the keys", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, k=q[:, :1], v=q[:, :1], cache_seqlens=_cu(3, 5), cache_leftpad=_cu(0, 7)),
     ValueError, r"cache_leftpad must be in \[0, cache_seqlens \+ seqlen_new\] .* \(got "
                 r"cache_leftpad\[1\] = 7, keys: 6\)"),
    ("cache_leftpad negative", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_seqlens=_cu(3, 5), cache_leftpad=_cu(-1, 0)),
     ValueError, r"cache_leftpad must be in \[0, .* \(got cache_leftpad\[0\] = -1"),
    ("cache_leftpad past the whole cache", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, cache_leftpad=_cu(0, 9)),
     ValueError, r"cache_leftpad\[1\] = 9, keys: 8"),
    ("rotary table short", lambda q: flash_cann.flash_attn_with_kvcache(
        q, q, q, q[:, :2], q[:, :2], _ROT[:4], _ROT[:4], cache_seqlens=3),
     ValueError, r"cos / sin have 4 rows, too few for position 4"),
    ("seqused_k past its sequence", lambda q: flash_cann.flash_attn_varlen_func(
        _Q3, _Q3, _Q3, _CU, _CU, 5, 5, seqused_k=_cu(4, 6)),
     ValueError, r"seqused_k must be in \[0, cu_seqlens_k\[b \+ 1\] - cu_seqlens_k\[b\]\] "
                 r"\(got \[4, 6\] for \[4, 5\]\)"),
    ("TND max_seqlen_q short", lambda q: torch.ops.flash_cann.fwd_kvcache(
        _Q3, q, q, None, None, _cu(1, 2), None, None, None, 1.0, layout="TND",
        cu_seqlens_q=_CU, max_seqlen_q=4),
     ValueError, r"max_seqlen_q=4 is smaller than the longest sequence of cu_seqlens_q \(5\)"),
]


@pytest.mark.parametrize("name, call, exc, pattern", BAD_CALLS + RANGE_CALLS,
                         ids=[c[0] for c in BAD_CALLS + RANGE_CALLS])
def test_bad_feature_arguments_are_named(name, call, exc, pattern):
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(exc, match=pattern):
        call(q)


# Those decided from shapes, dtypes and attributes (tensor values are not known while
# tracing: cu_seqlens' and cache_seqlens' contents are checked at run time only).
TRACEABLE = [c for c in BAD_CALLS if c[2] is ValueError
             and c[0] not in ("cu_seqlens end", "max_seqlen short", "negative cache_seqlens")]


@pytest.mark.parametrize("name, call, exc, pattern", TRACEABLE, ids=[c[0] for c in TRACEABLE])
def test_bad_feature_arguments_fail_at_trace_time(name, call, exc, pattern):
    """The same errors from the fake kernels, while torch.compile traces."""
    torch._dynamo.reset()
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(Exception, match=pattern):
        torch.compile(call, fullgraph=True)(q)


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_gradcheck_float64_with_every_feature(layout, gen):
    """torch.autograd.gradcheck through the op: window, softcap, ALiBi and dropout (a fixed
    rng_state, so every evaluation draws the same mask), GQA, causal."""
    def leaf(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)

    features = dict(rng_state=torch.tensor([5, 1]), window_left=3, softcap=2.0, dropout_p=0.3)
    if layout == "TND":  # sequences (3, 4), (2, 2), (4, 3) over the grid of (6, 3) below
        cu_q, cu_k, max_q, max_k = packed_lengths([(3, 4), (2, 2), (4, 3)])
        q, k, v = leaf(9, 4, 6), leaf(9, 2, 6), leaf(9, 2, 6)
        features.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                        max_seqlen_k=max_k, alibi_slopes=torch.rand(3, 4, generator=gen))
    else:
        q, k, v = leaf(2, 5, 4, 6), leaf(2, 7, 2, 6), leaf(2, 7, 2, 6)
        features["alibi_slopes"] = torch.rand(4, generator=gen)
    def attend(q_, k_, v_):
        out, lse = torch.ops.flash_cann.fwd(q_, k_, v_, None, 0.35, True, layout, **features)
        return out, lse.masked_fill(lse.isinf(), 0.0)  # rows that see no key: lse -inf

    torch.autograd.gradcheck(attend, (q, k, v), atol=1e-6)


# ---------------------------------------------------------------------------------------
# Attention sinks: the sinks' gradient, rows that see no key, float64 gradcheck
# ---------------------------------------------------------------------------------------

def _sink_case(gen, layout, dtype=torch.float32):
    """(q, k, v, sinks, keyword arguments of flash_attn_func / _varlen_func, the oracle's
    keyword arguments): GQA, causal, a window, ALiBi; TND packs sequences of lengths
    (7, 12), (0, 3), (9, 4)."""
    kwargs = dict(causal=True, window_size=(5, -1), alibi_slopes=torch.rand(4, generator=gen))
    if layout == "TND":
        cu_q, cu_k, max_q, max_k = packed_lengths([(7, 12), (0, 3), (9, 4)])
        q = torch.randn(16, 4, 8, generator=gen, dtype=dtype)
        k, v = (torch.randn(19, 2, 8, generator=gen, dtype=dtype) for _ in range(2))
        packed = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                      max_seqlen_k=max_k)
        call = dict(kwargs, **packed)
        variant = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                       max_seqlen_k=max_k)
    else:
        q = torch.randn(2, 9, 4, 8, generator=gen, dtype=dtype)
        k, v = (torch.randn(2, 13, 2, 8, generator=gen, dtype=dtype) for _ in range(2))
        call, variant = kwargs, {}
    sinks = torch.randn(4, generator=gen, dtype=torch.promote_types(dtype, torch.float32))
    return q, k, v, sinks, call, variant


def _sink_call(q, k, v, sinks, call, layout):
    if layout == "TND":
        call = dict(call)
        return flash_cann.flash_attn_varlen_func(
            q, k, v, call.pop("cu_seqlens_q"), call.pop("cu_seqlens_k"),
            call.pop("max_seqlen_q"), call.pop("max_seqlen_k"), sinks=sinks,
            return_attn_probs=True, **call)[:2]
    return flash_cann.flash_attn_func(q, k, v, sinks=sinks, return_attn_probs=True, **call)[:2]


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_sinks_and_their_gradient_match_the_oracle(layout, gen):
    """out, lse and the gradients of q, k, v and the sinks vs the float64 oracle, through
    flash_attn_func / flash_attn_varlen_func (an empty sequence included)."""
    q, k, v, sinks, call, packed = _sink_case(gen, layout)
    inputs = [t.requires_grad_() for t in (q, k, v, sinks)]
    out, lse = _sink_call(*inputs, call, layout)
    left = call["window_size"][0]  # causal: the right bound is the diagonal
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_variant = Variant(window_left=left, window_right=-1, sinks=ref_inputs[3],
                          alibi_slopes=call["alibi_slopes"], **packed)
    ref_out, ref_lse = reference.attention(*ref_inputs[:3], scale=8 ** -0.5, causal=True,
                                           layout=layout, variant=ref_variant)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn(out.shape, generator=gen)
    grad_lse = torch.randn(lse.shape, generator=gen)
    got = torch.autograd.grad((out * grad_out).sum() + (lse * grad_lse).sum(), inputs)
    want = torch.autograd.grad((ref_out * grad_out).sum() + (ref_lse * grad_lse).sum(),
                               ref_inputs)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5, msg=name)
    assert got[3].dtype == torch.float32 and got[3].shape == (4,)


def test_sinks_rows_that_see_no_key_return_zero_and_the_sink(gen):
    """Every key padded out: out 0, lse = the head's sink, zero gradients for q, k, v; the
    sinks' gradient is -sum exp(sink - lse) * D = -dlse summed (P_sink = 1, D = -dlse)."""
    q, k, v = (torch.randn(1, 4, 2, 8, generator=gen).requires_grad_() for _ in range(3))
    sinks = torch.tensor([0.5, -2.0]).requires_grad_()
    out, lse = flash_cann.attention(q, k, v, layout="BSND", sinks=sinks, return_lse=True,
                                    key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, sinks.detach().view(1, 2, 1).expand(1, 2, 4))
    grad_lse = torch.randn(lse.shape, generator=gen)
    dq, dk, dv, dsinks = torch.autograd.grad((out.sum() + (lse * grad_lse).sum()),
                                             (q, k, v, sinks))
    assert not any(g.any() for g in (dq, dk, dv))
    torch.testing.assert_close(dsinks, grad_lse.sum((0, 2)))


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_sinks_gradcheck_float64(layout, gen):
    """torch.autograd.gradcheck of out and lse in q, k, v and the sinks (tiny shapes)."""
    q, k, v, sinks, call, _ = _sink_case(gen, layout, dtype=torch.float64)
    if layout == "TND":
        q, k, v = q[:9, :2, :4], k[:13, :1, :4], v[:13, :1, :4]
        call = dict(call, cu_seqlens_q=torch.tensor([0, 7, 7, 9], dtype=torch.int32),
                    cu_seqlens_k=torch.tensor([0, 12, 12, 13], dtype=torch.int32))
    else:
        q, k, v = q[:1, :5, :2, :4], k[:1, :6, :1, :4], v[:1, :6, :1, :4]
    call["alibi_slopes"] = call["alibi_slopes"][:2]
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks[:2])]
    assert torch.autograd.gradcheck(
        lambda *a: _sink_call(*a, call, layout), inputs)


def test_sinks_without_sinks_give_no_gradient_and_zeros_from_the_op(gen):
    """grad_sinks is always an output of the bwd op (zeros without sinks); autograd gives
    no gradient to a sinks argument that was None."""
    q, k, v = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3))
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.3)
    grads = torch.ops.flash_cann.bwd(out, q, k, v, out, lse, None, None, 0.3)
    assert len(grads) == 4 and torch.equal(grads[3], torch.zeros(2))
    sinks = torch.zeros(2)
    with_sinks = torch.ops.flash_cann.bwd(out, q, k, v, out, lse, None, None, 0.3, sinks=sinks)
    assert with_sinks[3].shape == (2,) and with_sinks[3].any()


def check_minus_infinity_sink(gen, dtype=torch.float32):
    """A head whose sink is -inf attends as without sinks (a row that sees no key: out 0,
    lse -inf), with gradients and that sink's gradient 0, never NaN."""
    q, k, v = (torch.randn(2, 6, 2, 8, generator=gen).to(dtype).requires_grad_()
               for _ in range(3))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    sinks = torch.tensor([float("-inf"), 0.5]).requires_grad_()
    out, lse = flash_cann.attention(q, k, v, layout="BSND", causal=True, sinks=sinks,
                                    key_padding_mask=mask, return_lse=True)
    plain_out, plain_lse = flash_cann.attention(q, k, v, layout="BSND", causal=True,
                                                key_padding_mask=mask, return_lse=True)
    torch.testing.assert_close(out[:, :, 0], plain_out[:, :, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(lse[:, 0], plain_lse[:, 0], rtol=0, atol=1e-6)
    grads = torch.autograd.grad(out.sum() + lse[lse.isfinite()].sum(), (q, k, v, sinks))
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[3][0] == 0 and grads[3][1] != 0


def test_a_sink_of_minus_infinity_is_no_sink(gen):
    check_minus_infinity_sink(gen)
