"""A property test across backends (hypothesis): random small shapes and features,
each backend's forward (and backward where it has one) against the float64 oracle
(flash_cann.contract.reference) under flash_cann.tools.accuracy's tolerance rule.

A drawn case is one call of the public API:

- batched (``flash_cann.attention``, BNSD or BSND): batch 1-2, seqlen_q and seqlen_k
  1-40 drawn independently, an optional key padding mask;
- packed (TND, cu_seqlens): 1-3 sequences of 0-40 query and 0-40 key rows;
- a KV cache (``flash_attn_with_kvcache``): paged (block_table over a shuffled pool of
  pages), dense, or dense through cache_batch_idx; an optional append of new keys and
  values (checked in place) and cache_leftpad;

with heads_q 1-4 over a divisor of it as heads_kv (MHA, GQA, MQA), a head_dim within
the spec's limits, causal or not, and -- each where the backend lists the feature -- a
sliding window (either bound -1 .. 45, so at, inside and past the matrix), softcap,
ALiBi slopes per head or per (sequence, head), and attention sinks.

What a backend is fuzzed with is read from the spec (flash_cann_ops.yaml): its dtypes,
its features (packed and KV-cache cases only with ``varlen`` / ``kvcache``), and
whether it computes the backward (and the op has one: fwd_kvcache has none). Dropout is
not drawn: its oracle needs the mask the backend drew (test_features and the twin's
Philox tests check it bit for bit).

Backends: cpu (fast tier: a small budget; full suite: a larger one), the twin (the
Ascend C kernels on the CPU twin; needs the native build), and the Triton kernels in
Triton's interpreter, which must be enabled before triton is imported: their test
runs this file again in one subprocess with TRITON_INTERPRET=1 (no time limit), where
the interpreter's test draws and runs its whole budget of cases. Every test is
derandomized (the same cases on every run) and shrinks a failure to a small
counterexample, printed with the failing comparisons.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flash_cann
from flash_cann.contract import ops, reference
from flash_cann.contract.checks import accumulator_dtype
from flash_cann.contract.spec import load
from flash_cann.contract.variant import Variant
from flash_cann.tools import accuracy

from conftest import random_key_padding_mask

SPEC = load()
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
MAX_SEQLEN = 40


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the spec says a backend computes, on the device type whose module runs it."""

    name: str
    dtypes: tuple
    features: frozenset
    backward: bool


def backend(name: str, dtypes=None) -> Backend:
    spec = SPEC.backends[name]
    allowed = tuple(DTYPES[d] for d in spec.dtypes)
    if dtypes is not None:
        allowed = tuple(d for d in allowed if d in dtypes)
    return Backend(name, allowed, frozenset(spec.features_on(spec.device_type)), spec.backward)


CPU = backend("cpu")
TWIN = backend("twin")
# float16 only: the interpreter does not compute in bfloat16 (test_triton_interpreter.py).
TRITON = backend("triton", dtypes=(torch.float16,))


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str            # "batched", "packed" or "kvcache"
    dtype: torch.dtype
    heads: tuple         # (heads_q, heads_kv)
    head_dim: int
    causal: bool
    window: tuple        # (left, right) as passed: -1 unbounded
    softcap: float
    alibi: str | None    # None, "heads" ((heads_q,)) or "batch" ((batch, heads_q))
    sinks: bool
    seed: int
    layout: str = "BSND"
    batch: int = 1
    seqlens: tuple = ()  # batched: (seqlen_q, seqlen_k); packed: one pair per sequence
    masked: bool = False
    # KV cache: page_size 0 = dense; capacity = keys per sequence
    page_size: int = 0
    capacity: int = 0
    batch_idx: bool = False
    seqlen_new: int = 0
    filled: tuple = ()   # cache_seqlens
    leftpad: tuple | None = None


def _head_dims():
    low, high = SPEC.head_dim_min, SPEC.head_dim_max
    common = [d for d in (16, 32, 64, 80, high) if low <= d <= high]
    return st.one_of(st.sampled_from(common), st.integers(low, min(high, 64)))


@st.composite
def cases(draw, be: Backend) -> Case:
    kinds = ["batched"] + [kind for kind, feature in (("packed", "varlen"), ("kvcache", "kvcache"))
                           if feature in be.features]
    kind = draw(st.sampled_from(kinds))
    heads_q = draw(st.integers(1, 4))
    heads_kv = draw(st.sampled_from([h for h in (1, 2, 4) if heads_q % h == 0]))
    window = (-1, -1)
    if "window" in be.features and draw(st.booleans()):
        bound = st.integers(-1, MAX_SEQLEN + 5)
        window = (draw(bound), draw(bound))
    softcap = 0.0
    if "softcap" in be.features and draw(st.booleans()):
        softcap = draw(st.floats(0.5, 5.0))
    alibi = draw(st.sampled_from([None, "heads", "batch"])) if "alibi" in be.features else None
    common = dict(kind=kind, dtype=draw(st.sampled_from(be.dtypes)), heads=(heads_q, heads_kv),
                  head_dim=draw(_head_dims()), causal=draw(st.booleans()), window=window,
                  softcap=softcap, alibi=alibi,
                  sinks="sinks" in be.features and draw(st.booleans()),
                  seed=draw(st.integers(0, 2**31 - 1)))
    seqlen = st.integers(1, MAX_SEQLEN)
    if kind == "batched":
        return Case(**common, layout=draw(st.sampled_from(["BNSD", "BSND"])),
                    batch=draw(st.integers(1, 2)), seqlens=(draw(seqlen), draw(seqlen)),
                    masked=draw(st.booleans()))
    if kind == "packed":
        pairs = draw(st.lists(st.tuples(st.integers(0, MAX_SEQLEN), st.integers(0, MAX_SEQLEN)),
                              min_size=1, max_size=3).filter(
            # the op refuses empty tensors: at least one query and one key row in all
            lambda pairs: min(map(sum, zip(*pairs))) > 0))
        return Case(**common, layout="TND", batch=len(pairs), seqlens=tuple(pairs))
    batch = draw(st.integers(1, 2))
    page_size = draw(st.sampled_from([0, 1, 4, 8, 16]))
    if page_size:
        capacity = page_size * draw(st.integers(1, max(1, MAX_SEQLEN // page_size)))
    else:
        capacity = draw(seqlen)
    seqlen_new = draw(st.integers(0, min(4, capacity)))
    filled = tuple(draw(st.integers(0, capacity - seqlen_new)) for _ in range(batch))
    leftpad = None
    if draw(st.booleans()):
        leftpad = tuple(draw(st.integers(0, n + seqlen_new)) for n in filled)
    return Case(**common, batch=batch, seqlens=(draw(seqlen), capacity), page_size=page_size,
                capacity=capacity, batch_idx=not page_size and draw(st.booleans()),
                seqlen_new=seqlen_new, filled=filled, leftpad=leftpad)


def oracle_window(left: int, right: int, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """window_size as the contract reads it (flash-attn 2.8's rule, variant.py), written
    out here so that the oracle does not share the backends' normalisation: a bound >=
    seqlen_k is unbounded; with causal the right bound is causal's 0."""
    left = -1 if left >= seqlen_k else left
    right = -1 if causal or right >= seqlen_k else right
    return left, right


def _rand(gen, *shape, dtype):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def _features(case: Case, gen, batch: int):
    """ALiBi slopes (float32) and sinks (the accumulator dtype) of a case."""
    heads_q = case.heads[0]
    slopes = None
    if case.alibi is not None:
        shape = (heads_q,) if case.alibi == "heads" else (batch, heads_q)
        slopes = torch.rand(shape, generator=gen) * 0.5
    sinks = None
    if case.sinks:  # around the rows' largest scores, so that the sink takes a fair share
        sinks = (torch.randn(heads_q, generator=gen) + 1.0).to(accumulator_dtype(case.dtype))
    return slopes, sinks


def _attention_results(case: Case, be: Backend) -> list[accuracy.Comparison]:
    """A batched or packed case through flash_cann.attention, judged by
    accuracy.check_against_oracle (forward, and backward if the backend has one)."""
    gen = torch.Generator().manual_seed(case.seed)
    (heads_q, heads_kv), d = case.heads, case.head_dim
    packed = case.kind == "packed"
    if packed:
        lengths_q, lengths_k = zip(*case.seqlens)
        cu_q, cu_k = (torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)
                      for lengths in (lengths_q, lengths_k))
        max_q, max_k = max(max(lengths_q), 1), max(max(lengths_k), 1)
        q = _rand(gen, int(cu_q[-1]), heads_q, d, dtype=case.dtype)
        k, v = (_rand(gen, int(cu_k[-1]), heads_kv, d, dtype=case.dtype) for _ in range(2))
        seqlen_k, mask = max_k, None
        packing = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                       max_seqlen_k=max_k)
    else:
        (seqlen_q, seqlen_k), b = case.seqlens, case.batch

        def shape(heads, seqlen):
            return (b, heads, seqlen, d) if case.layout == "BNSD" else (b, seqlen, heads, d)

        q = _rand(gen, *shape(heads_q, seqlen_q), dtype=case.dtype)
        k, v = (_rand(gen, *shape(heads_kv, seqlen_k), dtype=case.dtype) for _ in range(2))
        mask = random_key_padding_mask(b, seqlen_k, gen) if case.masked else None
        packing = {}
    slopes, sinks = _features(case, gen, case.batch)
    scale = 1.0 / math.sqrt(d)
    left, right = oracle_window(*case.window, case.causal, seqlen_k)
    variant = Variant(window_left=left, window_right=right, softcap=case.softcap,
                      alibi_slopes=slopes, sinks=sinks, **packing)

    def call(q_, k_, v_):
        return flash_cann.attention(q_, k_, v_, layout=case.layout, causal=case.causal,
                                    scale=scale, key_padding_mask=mask, return_lse=True,
                                    window_size=case.window, softcap=case.softcap,
                                    alibi_slopes=slopes, sinks=sinks, **packing)

    backward = "full" if be.backward and SPEC.ops["fwd"].backward else "none"
    with running(be):
        return accuracy.check_against_oracle(
            call, q, k, v, scale=scale, causal=case.causal, layout=case.layout,
            key_padding_mask=mask, generator=gen, backward=backward, variant=variant)


def _kvcache_results(case: Case, be: Backend) -> list[accuracy.Comparison]:
    """A KV-cache case through flash_attn_with_kvcache (forward only: the op has no
    backward): the append lands in place, and out and lse of each sequence match the
    oracle over its cache rows leftpad .. cache_seqlens + seqlen_new - 1."""
    gen = torch.Generator().manual_seed(case.seed)
    (heads_q, heads_kv), d, batch = case.heads, case.head_dim, case.batch
    seqlen_q, capacity, new = case.seqlens[0], case.capacity, case.seqlen_new
    q = _rand(gen, batch, seqlen_q, heads_q, d, dtype=case.dtype)
    kwargs = {}
    if case.page_size:
        blocks = capacity // case.page_size
        pool = batch * blocks + 2
        table = torch.randperm(pool, generator=gen)[:batch * blocks].view(batch, blocks)
        k_cache, v_cache = (_rand(gen, pool, case.page_size, heads_kv, d, dtype=case.dtype)
                            for _ in range(2))
        kwargs["block_table"] = table.to(torch.int32)

        def dense(cache, b):
            return cache[table[b]].flatten(0, 1)
    else:
        rows = (torch.randperm(batch + 1, generator=gen)[:batch] if case.batch_idx
                else torch.arange(batch))
        k_cache, v_cache = (_rand(gen, batch + 1, capacity, heads_kv, d, dtype=case.dtype)
                            for _ in range(2))
        if case.batch_idx:
            kwargs["cache_batch_idx"] = rows.to(torch.int32)

        def dense(cache, b):
            return cache[int(rows[b])]
    k_new = v_new = None
    if new:
        k_new, v_new = (_rand(gen, batch, new, heads_kv, d, dtype=case.dtype) for _ in range(2))
    filled = torch.tensor(case.filled, dtype=torch.int32)
    leftpad = None if case.leftpad is None else torch.tensor(case.leftpad, dtype=torch.int32)
    slopes, sinks = _features(case, gen, batch)
    scale = 1.0 / math.sqrt(d)
    with running(be):
        out, lse = flash_cann.flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=filled, cache_leftpad=leftpad,
            softmax_scale=scale, causal=case.causal, window_size=case.window,
            softcap=case.softcap, alibi_slopes=slopes, sinks=sinks, return_softmax_lse=True,
            **kwargs)
    for b in range(batch):
        n = case.filled[b]
        if new:
            assert torch.equal(dense(k_cache, b)[n:n + new], k_new[b]), f"k not appended ({b})"
            assert torch.equal(dense(v_cache, b)[n:n + new], v_new[b]), f"v not appended ({b})"
    left, right = oracle_window(*case.window, case.causal, capacity)

    def oracle(compute_dtype):
        outs, lses = [], []
        for b in range(batch):
            n = case.filled[b] + new
            keys, values = (dense(cache, b)[:n].unsqueeze(0) for cache in (k_cache, v_cache))
            padding = None if leftpad is None or not n else (torch.arange(n) >= leftpad[b]).view(1, n)
            one = Variant(window_left=left, window_right=right, softcap=case.softcap,
                          alibi_slopes=None if slopes is None else slopes.expand(
                              batch, heads_q)[b:b + 1], sinks=sinks)
            high = compute_dtype == torch.float64
            o, s = reference.attention(
                *((t.double() if high else t) for t in (q[b:b + 1], keys, values)), padding,
                scale=scale, causal=case.causal, layout="BSND", compute_dtype=compute_dtype,
                variant=one)
            outs.append(o)
            lses.append(s)
        return torch.cat(outs), torch.cat(lses)

    exact, baseline = oracle(torch.float64), oracle(case.dtype)
    lse_baseline = oracle(accumulator_dtype(case.dtype))[1]
    return [accuracy.compare("out", "out", out, exact[0], baseline[0], case.dtype),
            accuracy.compare("softmax_lse", "lse", lse, exact[1], lse_baseline, case.dtype)]


@contextlib.contextmanager
def running(be: Backend):
    """CPU tensors go to ``be`` inside the block (the triton backend: through the
    interpreter, every output buffer poisoned with NaN so that an unwritten element
    fails)."""
    if be.name != "triton":
        with flash_cann.use_backend(be.name):
            yield
        return
    from flash_cann.backends.triton import buffers

    _patched_interpreter()
    previous = dict(ops._selected)
    ops._selected["cpu"] = "triton"
    ops.forget_plans()
    try:
        with buffers.poisoned_outputs():
            yield
    finally:
        ops._selected.clear()
        ops._selected.update(previous)
        ops.forget_plans()


@functools.lru_cache(maxsize=None)
def _patched_interpreter():
    import triton_interpreter_patch

    triton_interpreter_patch.patch_interpreter(setattr)  # this process is the interpreter run


def check_case(case: Case, be: Backend) -> None:
    results = (_kvcache_results if case.kind == "kvcache" else _attention_results)(case, be)
    assert all(r.ok for r in results), f"{be.name}: {case}\n" + "\n".join(map(str, results))


def fuzz(max_examples: int):
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@fuzz(max_examples=30)
@given(case=cases(CPU))
def test_cpu_fast_matches_oracle(case):
    """The fast tier's budget (a few seconds)."""
    check_case(case, CPU)


@fuzz(max_examples=150)
@given(case=cases(CPU))
def test_cpu_matches_oracle(case):
    check_case(case, CPU)


@pytest.fixture(scope="module")
def twin_library():
    from native_build import built

    built("twin/libflash_cann_twin.so")


@fuzz(max_examples=60)
@given(case=cases(TWIN))
def test_twin_matches_oracle(twin_library, case):
    check_case(case, TWIN)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_triton_interpreter_matches_oracle():
    """Runs test_triton_in_interpreter in a subprocess under TRITON_INTERPRET=1 (no time
    limit: a slow machine makes it slow, not red)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{__file__}::test_triton_in_interpreter"],
                         env=env, capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    assert "1 passed" in summary, run.stdout[-4000:]


@pytest.mark.skipif(not (HAS_TRITON and INTERPRETING),
                    reason="runs in test_triton_interpreter_matches_oracle's subprocess")
@fuzz(max_examples=15)
@given(case=cases(TRITON))
def test_triton_in_interpreter(case):
    check_case(case, TRITON)
