"""Packed sequences (layout TND) in the Ascend C forward and backward, on the CPU twin with
the race detector on: cu_seqlens read by the kernels on the device, the work walked and
split there (op_kernel/flash_cann_packed.h).

Random lengths including 0 and 1, unequal query and key lengths, GQA, and every feature
(causal, window, ALiBi per sequence, softcap, dropout, sinks), forward and backward,
against the float64 cpu backend (the op's contract) under the project's tolerance rule;
the split's independence of the core count, bit for bit; a sequence's rows equal to the
same sequence run alone (dense); the deterministic dQ bitwise the same on 1, 3 and 7
cores with no unordered atomic adds. Called through the op (torch.ops.flash_cann with
use_backend("twin")), so the spec's checks and the twin launcher are on the path."""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann
from flash_cann.backends.twin import launcher as twin
from flash_cann.contract.variant import Variant
from flash_cann.tools import accuracy

from native_build import built


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def _packed(lens_q, lens_k, heads_q, heads_kv, head_dim, dtype, gen):
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(int(cu_k[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    v = torch.randn(int(cu_k[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    packing = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(max(lens_q), 1),
                   max_seqlen_k=max(max(lens_k), 1))
    return q, k, v, packing


def _forward(backend, q, k, v, causal, args):
    with flash_cann.use_backend(backend):
        return torch.ops.flash_cann.fwd(q, k, v, None, 1.0 / math.sqrt(q.shape[-1]), causal,
                                        "TND", **args)


def _backward(backend, do, q, k, v, out, lse, causal, deterministic, args):
    with flash_cann.use_backend(backend):
        return torch.ops.flash_cann.bwd(do, q, k, v, out, lse, None, None,
                                        1.0 / math.sqrt(q.shape[-1]), causal, "TND",
                                        deterministic, **args)


def _double(args):
    """The arguments of the float64 oracle: sinks in the accumulator dtype."""
    return {n: (a.double() if n == "sinks" else a) for n, a in args.items()}


def _judge(names, kinds, got, oracle, baseline, dtype):
    results = [accuracy.compare(name, kind, g.double(), o, b.double(), dtype)
               for name, kind, g, o, b in zip(names, kinds, got, oracle, baseline)]
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))


# (lengths q, lengths k, heads_q, heads_kv, head_dim, dtype, causal, features)
CASES = {
    "causal-gqa": ([5, 0, 1, 70, 33, 129], [9, 4, 0, 70, 100, 129], 4, 2, 32, torch.float16,
                   True, {}),
    "window": ([40, 1, 150, 0], [60, 3, 150, 7], 2, 1, 64, torch.bfloat16, False,
               dict(window_left=30, window_right=5)),
    "alibi-per-sequence": ([33, 0, 90], [17, 5, 200], 2, 2, 40, torch.float16, True, "alibi"),
    "softcap-sinks": ([1, 77, 20], [1, 130, 0], 4, 1, 48, torch.bfloat16, False, "softcap-sinks"),
    "dropout": ([17, 64, 0, 9], [30, 64, 12, 1], 2, 1, 32, torch.float16, True, "dropout"),
}


def _features(spec, batch, heads_q, gen):
    if spec == "alibi":
        return dict(alibi_slopes=torch.rand(batch, heads_q, generator=gen) * 0.5 + 0.05)
    if spec == "softcap-sinks":
        return dict(softcap=4.0, sinks=torch.randn(heads_q, generator=gen) * 2)
    if spec == "dropout":
        return dict(dropout_p=0.3, rng_state=torch.tensor([0x1234_5678_9ABC, 2**31 + 5]))
    return dict(spec)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_match_the_oracle(name, gen):
    """Each case: the forward's out and lse, then dq, dk, dv (and grad_sinks), against the
    float64 cpu backend, on 3 AI cores (several cores share the sequences)."""
    lens_q, lens_k, hq, hk, d, dtype, causal, spec = CASES[name]
    q, k, v, packing = _packed(lens_q, lens_k, hq, hk, d, dtype, gen)
    args = {**packing, **_features(spec, len(lens_q), hq, gen)}
    twin.AI_CORES = 3
    try:
        got = _forward("twin", q, k, v, causal, args)
        oracle = _forward("cpu", q.double(), k.double(), v.double(), causal, _double(args))
        baseline = _forward("cpu", q, k, v, causal, args)
        _judge(("out", "softmax_lse"), ("out", "lse"), got, oracle, baseline, dtype)
        do = torch.randn(q.shape, generator=gen).to(dtype)
        bwd_args = {n: a for n, a in args.items()}
        grads = _backward("twin", do, q, k, v, *got, causal, False, bwd_args)
        oracle_grads = _backward("cpu", do.double(), q.double(), k.double(), v.double(),
                                 *oracle, causal, False, _double(bwd_args))
        baseline_grads = _backward("cpu", do, q, k, v, *baseline, causal, False, bwd_args)
    finally:
        twin.AI_CORES = 0
    count = 4 if "sinks" in args else 3
    _judge(("dq", "dk", "dv", "grad_sinks")[:count], ("grad",) * count, grads[:count],
           oracle_grads[:count], baseline_grads[:count], dtype)


def test_split_over_cores_does_not_change_a_bit(gen):
    """The device-side split decides only which core computes a tile: out and lse are the
    same bits on 1, 3 and 7 AI cores (rounds lie on one grid per sequence)."""
    q, k, v, packing = _packed([70, 1, 0, 200, 31], [90, 1, 5, 200, 31], 4, 2, 32,
                               torch.float16, gen)
    variant = Variant(**packing)
    results = [twin.forward(q, k, v, None, scale=0.125, causal=True, layout="TND",
                            variant=variant, ai_cores=cores) for cores in (1, 3, 7)]
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


def test_a_sequence_gives_the_bits_it_gives_alone(gen):
    """Sequence b's rows of a packed call equal those of the same sequence run alone in a
    dense (BSND) call, bit for bit: the kernel addresses each sequence through its own
    cu_seqlens offsets and lengths (a wrong offset or causal alignment would show)."""
    lens_q, lens_k = [40, 0, 100, 1], [60, 8, 100, 1]
    q, k, v, packing = _packed(lens_q, lens_k, 2, 1, 64, torch.bfloat16, gen)
    out, lse = twin.forward(q, k, v, None, scale=0.125, causal=True, layout="TND",
                            variant=Variant(**packing), ai_cores=2)
    cu_q, cu_k = packing["cu_seqlens_q"].tolist(), packing["cu_seqlens_k"].tolist()
    for b in (0, 2, 3):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alone = twin.forward(q[rows][None], k[keys][None], v[keys][None], None, scale=0.125,
                             causal=True, layout="BSND", ai_cores=1)
        assert torch.equal(out[rows], alone[0][0]), f"sequence {b}"
        assert torch.equal(lse[:, rows], alone[1][0]), f"sequence {b}"
    # sequence 1 has no query row; nothing of it is written and nothing else is NaN
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()


def test_deterministic_backward_across_core_counts(gen):
    """The deterministic dQ with packed sequences: dQ chunks are never cut between cores
    (the device split keeps them whole), so dq, dk, dv are bitwise the same on 1, 3 and 7
    cores and no tensor receives atomic adds from two cores without an order; the
    features on (but the window, so that every key block adds into the long sequence's
    rows)."""
    # 2100 keys: 17 key blocks, more than the 16 dQ slots, so the chunks hold 2 blocks and a
    # split that cut one would have two cores add into one slot's rows.
    lens_q, lens_k = [40, 1, 0, 97], [2100, 1, 4, 60]
    q, k, v, packing = _packed(lens_q, lens_k, 2, 1, 32, torch.float16, gen)
    variant = Variant(softcap=5.0, alibi_slopes=torch.rand(4, 2) * 0.2,
                      dropout_p=0.2, rng_state=torch.tensor([7, 11]),
                      sinks=torch.randn(2, generator=gen), **packing)
    out, lse = twin.forward(q, k, v, None, scale=0.125, causal=False, layout="TND",
                            variant=variant)
    do = torch.randn(q.shape, generator=gen).to(q.dtype)
    first = None
    for cores in (1, 3, 7):
        unordered = []
        grads = twin.backward(do, q, k, v, out, lse, None, None, scale=0.125, causal=False,
                              layout="TND", deterministic=True, variant=variant, ai_cores=cores,
                              unordered_atomic_adds=unordered)
        assert unordered == [], f"{cores} cores: unordered atomic adds into {unordered}"
        assert not any(torch.isnan(g).any() for g in grads)
        if first is None:
            first = grads
        else:
            assert all(torch.equal(a, b) for a, b in zip(grads, first)), f"{cores} cores"


def test_flash_attn_varlen_func_runs_on_the_twin():
    """flash-attn's varlen entry point on the twin (the public API's path; before issue 24
    the twin refused it by name): a finite output of the query's shape."""
    q = torch.randn(8, 4, 16).half()
    k, v = torch.randn(12, 2, 16).half(), torch.randn(12, 2, 16).half()
    cu_q, cu_k = (torch.tensor([0, 3, n], dtype=torch.int32) for n in (8, 12))
    with flash_cann.use_backend("twin"):
        out = flash_cann.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 9, causal=True)
    expected = flash_cann.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 9, causal=True)
    assert out.shape == q.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=0)
