"""The decode kernel (op_kernel/flash_cann_attention_kvcache.cpp, fwd_kvcache) on the
twin, race detector on, against the float64 oracle under the project's tolerance rule.

Each case draws a cache (contiguous with cache_batch_idx, or paged with a random block
table), per-sequence lengths including 0, 1 and non-multiples of the page, and runs the
kernel with the split of each tile's keys over cores off (1) and on. The oracle is
contract.reference.attention, one sequence at a time, on the keys gathered from the
cache in Python (cache_leftpad as a key padding mask: keys before it are invisible;
causal and windows bottom-right aligned to the sequence's length, as the spec says)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flash_cann
from flash_cann.contract import reference
from flash_cann.contract.variant import Variant
from flash_cann.tools import accuracy
from native_build import built

pytestmark = pytest.mark.usefixtures("twin_library")


@pytest.fixture(scope="module")
def twin_library():
    built("twin/libflash_cann_twin.so")


def _launcher():
    from flash_cann.backends.twin import launcher
    return launcher


def _cache(gen, dtype, *, batch, hk, d, lengths, page=0, spare=1):
    """(k_cache, v_cache, block_table or None, cache_batch_idx or None): paged (a random
    permutation of more blocks than needed) when page > 0, else contiguous rows in a
    shuffled order."""
    capacity = max(max(lengths), 1)
    if page:
        per_seq = (capacity + page - 1) // page + spare
        blocks = batch * per_seq + 3
        shape = (blocks, page, hk, d)
        table = torch.randperm(blocks, generator=gen)[:batch * per_seq].view(batch, per_seq)
        table, idx = table.to(torch.int32), None
    else:
        shape = (batch + 2, capacity + spare, hk, d)
        table = None
        idx = torch.randperm(batch + 2, generator=gen)[:batch].to(torch.int32)
    k, v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    return k, v, table, idx


def _keys(cache, b, length, table, idx):
    if table is not None:
        return cache[table[b].long()].flatten(0, 1)[:length]
    return cache[int(idx[b]) if idx is not None else b, :length]


def _oracle(q_rows, kc, vc, b, length, table, idx, *, scale, causal, variant, leftpad, dtype):
    """(out, lse) of one sequence: q_rows (rows, heads_q, d); the float64 oracle and the
    same-precision baseline."""
    keys, values = (_keys(c, b, length, table, idx).unsqueeze(0) for c in (kc, vc))
    mask = None
    if leftpad is not None:
        mask = (torch.arange(length) >= int(leftpad[b])).unsqueeze(0)
    slopes = variant.alibi_slopes
    v = Variant(window_left=variant.window_left, window_right=variant.window_right,
                softcap=variant.softcap, sinks=variant.sinks,
                alibi_slopes=None if slopes is None else
                slopes[b:b + 1] if slopes.dim() == 2 else slopes.view(1, -1))
    results = []
    for compute in (torch.float64, dtype):
        if length == 0:  # no key at all: out 0, lse -inf (or the sink)
            rows, hq = q_rows.shape[:2]
            lse = torch.full((1, hq, rows), float("-inf"), dtype=torch.float64)
            if variant.sinks is not None:
                lse = variant.sinks.double().view(1, hq, 1).expand(1, hq, rows)
            results.append((torch.zeros(1, *q_rows.shape, dtype=torch.float64), lse))
            continue
        results.append(reference.attention(q_rows.unsqueeze(0), keys, values, mask, scale=scale,
                                           causal=causal, layout="BSND", variant=v,
                                           compute_dtype=compute))
    return results


def _check(q, kc, vc, lengths, table, idx, *, causal=False, variant=Variant(), leftpad=None,
           cu=None, splits=0, ai_cores=None, dtype=torch.float16):
    """Run the kernel and compare every sequence with the oracle; return (out, lse)."""
    scale = q.shape[-1] ** -0.5
    lens = torch.tensor(lengths, dtype=torch.int32)
    max_rows = 0 if cu is None else int((cu[1:] - cu[:-1]).max())
    if cu is not None:
        variant = dataclasses.replace(variant, cu_seqlens_q=cu, max_seqlen_q=max_rows)
    out, lse = _launcher().kvcache_forward(
        q, kc, vc, lens, idx, table, scale=scale, causal=causal,
        layout="BSND" if cu is None else "TND", variant=variant, cache_leftpad=leftpad,
        num_splits=splits, ai_cores=ai_cores)
    for b, length in enumerate(lengths):
        if cu is None:
            rows = slice(None)
            got_out, got_lse = out[b], lse[b]
            q_rows = q[b]
        else:
            rows = slice(int(cu[b]), int(cu[b + 1]))
            got_out, got_lse = out[rows], lse[:, rows]
            q_rows = q[rows]
        if q_rows.shape[0] == 0:
            continue
        (o64, l64), (ob, lb) = _oracle(q_rows, kc, vc, b, length, table, idx, scale=scale,
                                       causal=causal, variant=variant, leftpad=leftpad,
                                       dtype=dtype)
        for name, kind, got, oracle, base in (("out", "out", got_out, o64[0], ob[0]),
                                              ("lse", "lse", got_lse, l64[0], lb[0])):
            c = accuracy.compare(f"{name}[{b}]", kind, got, oracle, base, dtype)
            assert c.ok, f"{c} (length {length})"
    return out, lse


@pytest.mark.parametrize("page, lengths, splits", [
    (16, [0, 1, 37, 70], 1),      # lengths 0 and 1, pages of 16, no split
    (16, [0, 1, 37, 70], 3),      # the same split three ways (a 1-key sequence's 2nd, 3rd split are empty)
    (128, [130, 5], 0),           # vLLM-Ascend's page, a length just past a page; the planner's split
    (512, [600, 513], 2),         # the largest page, a page boundary inside a split
])
def test_paged_gqa_matches_oracle(page, lengths, splits):
    gen = torch.Generator().manual_seed(page + splits)
    kc, vc, table, _ = _cache(gen, torch.float16, batch=len(lengths), hk=2, d=64, lengths=lengths,
                              page=page)
    q = torch.randn(len(lengths), 1, 8, 64, generator=gen).half()  # GQA 4 query heads per kv head
    _check(q, kc, vc, lengths, table, None, splits=splits)


def test_contiguous_cache_batch_idx_causal_appended_rows_bf16():
    """Three new rows per sequence (the appended tokens), bottom-right causal, bf16, the
    cache rows mapped by cache_batch_idx, head_dim 40 (padded)."""
    gen = torch.Generator().manual_seed(1)
    lengths = [3, 91, 200]
    kc, vc, _, idx = _cache(gen, torch.bfloat16, batch=3, hk=1, d=40, lengths=lengths)
    q = torch.randn(3, 3, 2, 40, generator=gen).bfloat16()
    _check(q, kc, vc, lengths, None, idx, causal=True, splits=2, dtype=torch.bfloat16)


@pytest.mark.parametrize("feature", ["leftpad", "window", "softcap", "alibi", "sinks", "all"])
def test_each_feature_matches_oracle(feature):
    gen = torch.Generator().manual_seed(7)
    lengths = [75, 0, 150]
    batch, hq, hk, d = 3, 4, 2, 32
    kc, vc, table, _ = _cache(gen, torch.float16, batch=batch, hk=hk, d=d, lengths=lengths, page=32)
    q = torch.randn(batch, 2, hq, d, generator=gen).half()
    every = feature == "all"
    leftpad = torch.tensor([9, 0, 70], dtype=torch.int32) if feature == "leftpad" or every else None
    variant = Variant(
        window_left=40 if feature == "window" or every else -1,
        window_right=3 if feature == "window" else -1,
        softcap=7.0 if feature == "softcap" or every else 0.0,
        alibi_slopes=(torch.rand(batch, hq, generator=gen) * 0.3) if feature == "alibi" or every else None,
        sinks=torch.randn(hq, generator=gen) if feature == "sinks" or every else None)
    _check(q, kc, vc, lengths, table, None, causal=every, variant=variant, leftpad=leftpad, splits=2)


@pytest.mark.parametrize("cu", [
    [0, 5, 6, 6],   # a 5-row prefill chunk, a decode row, a sequence with no new row
    [0, 1, 6, 7],   # decode, prefill, decode: sequence b's rows do not start at b x max_seqlen_q
])
def test_tnd_mixed_prefill_and_decode_rows(cu):
    """vLLM's call: packed query rows of prefill chunks and decode rows, cache_seqlens as
    seqused_k, causal, paged."""
    gen = torch.Generator().manual_seed(3)
    lengths = [40, 17, 9]
    cu = torch.tensor(cu, dtype=torch.int32)
    kc, vc, table, _ = _cache(gen, torch.float16, batch=3, hk=2, d=64, lengths=lengths, page=16)
    q = torch.randn(int(cu[-1]), 4, 64, generator=gen).half()
    _check(q, kc, vc, lengths, table, None, causal=True, cu=cu, splits=2)


def test_split_combine_is_deterministic_across_core_counts():
    """The combine adds the splits in split order: the bits do not depend on how the
    units are dealt to cores."""
    gen = torch.Generator().manual_seed(5)
    lengths = [300, 211]
    kc, vc, table, _ = _cache(gen, torch.float16, batch=2, hk=1, d=64, lengths=lengths, page=64)
    q = torch.randn(2, 1, 4, 64, generator=gen).half()
    runs = [_check(q, kc, vc, lengths, table, None, splits=4, ai_cores=cores) for cores in (1, 5)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_batch_one_long_context_uses_every_core():
    """The planner's split, from shapes only: one sequence, one kv head, a cache of 2k
    keys on 8 cores -> 4 splits (chunks of at least one 512-key round)."""
    gen = torch.Generator().manual_seed(9)
    lengths = [2000]
    kc, vc, table, _ = _cache(gen, torch.float16, batch=1, hk=1, d=64, lengths=lengths, page=128)
    q = torch.randn(1, 1, 2, 64, generator=gen).half()
    used = []
    _launcher().kvcache_forward(q, kc, vc, torch.tensor(lengths, dtype=torch.int32), None, table,
                                scale=0.125, causal=False, ai_cores=8, splits_used=used)
    assert used == [4]
    _check(q, kc, vc, lengths, table, None, ai_cores=8)


def test_through_the_op_with_append_matches_the_cpu_backend():
    """flash_attn_with_kvcache on the twin backend (append by contract.kvcache.append, then
    the kernel) against the cpu backend on copies of the same caches."""
    gen = torch.Generator().manual_seed(11)
    kc, vc, table, _ = _cache(gen, torch.float16, batch=2, hk=2, d=64, lengths=[50, 20], page=16)
    q = torch.randn(2, 2, 4, 64, generator=gen).half()
    k_new, v_new = (torch.randn(2, 2, 2, 64, generator=gen).half() for _ in range(2))
    seqlens = torch.tensor([48, 7], dtype=torch.int32)
    results = []
    for backend in ("twin", "cpu"):
        k, v = kc.clone(), vc.clone()
        with flash_cann.use_backend(backend):
            out, lse = flash_cann.flash_attn_with_kvcache(
                q, k, v, k_new, v_new, cache_seqlens=seqlens, block_table=table, causal=True,
                return_softmax_lse=True)
        results.append((out, lse, k, v))
    (o_t, l_t, k_t, v_t), (o_c, l_c, k_c, v_c) = results
    assert torch.equal(k_t, k_c) and torch.equal(v_t, v_c)
    torch.testing.assert_close(o_t, o_c, atol=2e-3, rtol=0)
    torch.testing.assert_close(l_t, l_c, atol=1e-4, rtol=0)


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_kernel_allocates_the_plans_bytes(softcap):
    """The bytes the kernel allocates per memory level (every InitBuffer) equal the decode
    planner's accounting (ListDecodeBuffers), with and without softcap's scratch tiles."""
    gen = torch.Generator().manual_seed(13)
    lengths = [90]
    kc, vc, table, _ = _cache(gen, torch.float16, batch=1, hk=2, d=72, lengths=lengths, page=32)
    q = torch.randn(1, 3, 8, 72, generator=gen).half()
    lens = torch.tensor(lengths, dtype=torch.int32)
    variant = Variant(softcap=softcap)
    allocated = {}
    _launcher().kvcache_forward(q, kc, vc, lens, None, table, scale=0.1, causal=True,
                                variant=variant, ai_cores=2, allocated=allocated)
    problem, features = _launcher().decode_problem(q, kc, lens, None, table, scale=0.1,
                                                   causal=True, variant=variant)
    from flash_cann.ascend import planner
    plan = planner.decode_plan_for("ascend910b2", problem, features, aic_cores=2)
    assert allocated == {level["level"]: level["used"] for level in plan["levels"]}


def test_lengths_past_the_capacity_attend_to_the_capacity():
    """A graph path has no Python capacity guard: cache_seqlens beyond block_table's row
    (here 3 pages of 16) must not walk past it; the kernel attends to the capacity."""
    gen = torch.Generator().manual_seed(17)
    kc, vc, table, _ = _cache(gen, torch.float16, batch=1, hk=1, d=32, lengths=[48], page=16,
                              spare=0)
    q = torch.randn(1, 1, 2, 32, generator=gen).half()
    out, lse = _launcher().kvcache_forward(q, kc, vc, torch.tensor([1000], dtype=torch.int32),
                                           None, table, scale=32 ** -0.5, causal=False)
    full = _check(q, kc, vc, [48], table, None)
    assert torch.equal(out, full[0]) and torch.equal(lse, full[1])


def test_a_plan_with_more_blocks_than_the_device_has_cores_is_reported():
    """The decode's split combine waits across blocks (SyncAll): a plan for 4 cores
    launched on a device of 3 is stopped there (asc-devkit SyncAll: no more blocks than
    the AI cores running the kernel); on 4 cores the same plan runs."""
    gen = torch.Generator().manual_seed(43)
    kc, vc, table, _ = _cache(gen, torch.float16, batch=2, hk=2, d=64, lengths=[300, 200], page=64)
    q = torch.randn(2, 1, 4, 64, generator=gen).half()
    lens = torch.tensor([300, 200], dtype=torch.int32)
    call = dict(scale=0.125, causal=False, ai_cores=4, num_splits=2)
    used = []
    with _launcher().device_cores(3), pytest.raises(
            _launcher().TwinViolation, match=r"\[R98\] SyncAll in a launch of 4 blocks on 3 AI cores"):
        _launcher().kvcache_forward(q, kc, vc, lens, None, table, **call)
    _launcher().kvcache_forward(q, kc, vc, lens, None, table, splits_used=used, **call)
    assert used == [2]


@pytest.mark.parametrize("cu", [[0, 4, 9], [0, 7, 9], [-3, 2, 5]], ids=["past-end", "start-past-end", "negative"])
def test_bad_query_offsets_stay_inside_the_tensors(cu):
    """Malformed cu_seqlens_q (no host check on a graph path): the decode walk clamps the
    offsets to [0, tokens] as the other packed walks do, so no write of out or
    softmax_lse leaves its tensor (the twin's GM bounds check stops one that does); the
    rows a clamped sequence keeps get that sequence's attention."""
    gen = torch.Generator().manual_seed(47)
    lengths = [40, 17]
    kc, vc, table, _ = _cache(gen, torch.float16, batch=2, hk=2, d=64, lengths=lengths, page=16)
    q = torch.randn(5, 4, 64, generator=gen).half()
    variant = Variant(cu_seqlens_q=torch.tensor(cu, dtype=torch.int32), max_seqlen_q=5)
    out, lse = _launcher().kvcache_forward(q, kc, vc, torch.tensor(lengths, dtype=torch.int32),
                                           None, table, scale=0.125, causal=False, layout="TND",
                                           variant=variant, num_splits=2)
    # The clamped spans: sequence 0 rows [max(cu0, 0), min(cu1, 5)), sequence 1 the rest.
    first = min(max(cu[1], 0), 5)
    good = _check(q[:first], kc, vc, lengths[:1], table[:1], None,
                  cu=torch.tensor([0, first], dtype=torch.int32), splits=2) if first > 0 else None
    if good is not None:
        assert torch.equal(out[:first], good[0]) and torch.equal(lse[:, :first], good[1])
