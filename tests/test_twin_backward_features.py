"""The Ascend C backward kernel's features on the CPU twin, race detector on: sliding
window (with and without causal, key blocks outside the band skipped), ALiBi (per head
and per (batch, head)), softcap with its chain rule, attention sinks with their gradient,
each alone and combined, head_dim 64/128/256/odd, fp16/bf16, against the float64 oracle
under the project's tolerance rule (tools/accuracy.py). Determinism across core counts
and batch invariance with every feature on; the CPU backend's batch invariance.

The forward outputs the backward consumes (out, lse) come from the materialising
reference in float32 (the forward kernel's features are another branch's): the backward
takes out and lse from any correct forward. Sinks join the oracle as their definition
says: lse' = log(exp(sink) + exp(lse)), out' = out exp(lse - lse')."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from flash_cann.ascend import planner
from flash_cann.backends.cpu import attention as cpu
from flash_cann.backends.twin import launcher as twin
from flash_cann.contract import reference
from flash_cann.contract.variant import Variant, keep_mask, window_bounds
from flash_cann.tools import accuracy

from conftest import make_qkv, random_key_padding_mask
from native_build import built


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def _with_sinks(variant: Variant, sinks):
    """The variant with sink logits."""
    return dataclasses.replace(variant, sinks=sinks)


def _keep(variant: Variant, b, hq, sq, sk):
    """Dropout's keep mask, from the contract's Philox (variant.keep_mask), or None."""
    if not variant.dropout_p:
        return None
    return keep_mask(variant.rng_state, variant.dropout_p, torch.arange(b).view(-1, 1, 1, 1),
                     torch.arange(hq).view(1, -1, 1, 1), torch.arange(sq).view(1, 1, -1, 1),
                     torch.arange(sk).view(1, 1, 1, -1))


def _attention(q, k, v, sinks, mask, causal, variant, compute_dtype):
    """The materialising reference with sinks joining each row's denominator."""
    keep = _keep(variant, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    out, lse = reference.attention(q, k, v, mask, scale=1 / math.sqrt(q.shape[-1]),
                                   causal=causal, compute_dtype=compute_dtype, variant=variant,
                                   dropout_mask=keep)
    if sinks is None:
        return out, lse
    sink = sinks.to(lse.dtype).view(1, -1, 1).expand_as(lse)
    merged = torch.logaddexp(lse, sink)
    out = (out.to(merged.dtype) * torch.exp(lse - merged).unsqueeze(-1)).to(out.dtype)
    return out, merged


def _gradients(fn, q, k, v, sinks, grad_out, grad_lse):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.detach().to(q.dtype if q.dtype == torch.float64 else torch.float32)
                      .requires_grad_())
    out, lse = fn(*leaves[:3], leaves[3] if sinks is not None else None)
    loss = (out.double() * grad_out.double()).sum()
    loss = loss + (lse.masked_fill(torch.isinf(lse), 0.0).double() * grad_lse.double()).sum()
    return torch.autograd.grad(loss, leaves)


def _forward(q, k, v, sinks, mask, causal, variant):
    """out (input dtype) and lse of the call, the backward's inputs."""
    with torch.no_grad():
        out, lse = _attention(q, k, v, sinks, mask, causal, variant, torch.float32)
    return out.to(q.dtype), lse


def _twin_gradients(q, k, v, sinks, mask, causal, variant, grad_out, grad_lse, forward=None,
                    **options):
    out, lse = forward or _forward(q, k, v, sinks, mask, causal, variant)
    grads = twin.backward(grad_out, q, k, v, out, lse, mask, grad_lse,
                          scale=1 / math.sqrt(q.shape[-1]), causal=causal, layout="BNSD",
                          variant=_with_sinks(variant, sinks), **options)
    return grads if sinks is not None else grads[:3]


def _variant(b, hq, sq, sk, causal, gen, window=(-1, -1), softcap=0.0, alibi=None, dropout=0.0):
    left, right = window_bounds(*window, causal, sk)
    slopes = None
    if alibi == "head":
        slopes = (torch.rand(hq, generator=gen) * 0.5 + 0.05).expand(b, hq)
    elif alibi == "batch_head":
        slopes = torch.rand(b, hq, generator=gen) * 0.5 + 0.05
    rng = torch.tensor([int(torch.randint(1 << 40, (1,), generator=gen)), 3]) if dropout else None
    return Variant(window_left=left, window_right=right, softcap=softcap, alibi_slopes=slopes,
                   dropout_p=dropout, rng_state=rng)


def _check(b, hq, hk, sq, sk, d, dtype, causal, gen, masked=False, sinks=False, **features):
    q, k, v = make_qkv(b, hq, hk, sq, sk, d, dtype, "BNSD", generator=gen)
    mask = random_key_padding_mask(b, sk, gen) if masked else None
    sink = torch.randn(hq, generator=gen) if sinks else None
    variant = _variant(b, hq, sq, sk, causal, gen, **features)
    grad_out = torch.randn(q.shape, generator=gen).to(dtype)
    grad_lse = torch.randn(b, hq, sq, generator=gen)
    got = _twin_gradients(q, k, v, sink, mask, causal, variant, grad_out, grad_lse)
    assert all(not torch.isnan(g).any() for g in got)

    def fn(dtype_):
        return lambda q_, k_, v_, s_: _attention(q_, k_, v_, s_, mask, causal, variant, dtype_)

    oracle = _gradients(fn(torch.float64), q.double(), k.double(), v.double(),
                        None if sink is None else sink.double(), grad_out, grad_lse)
    baseline = _gradients(fn(dtype), q, k, v, sink, grad_out, grad_lse)
    names = ("dq", "dk", "dv", "grad_sinks")
    results = [accuracy.compare(n, "grad", g, o, bl, dtype)
               for n, g, o, bl in zip(names, got, oracle, baseline)]
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))


# Each feature alone, then together; dtypes, head dims (odd: padded), GQA spread over them.
@pytest.mark.parametrize("case", [
    dict(b=1, hq=2, hk=2, sq=150, sk=150, d=64, dtype=torch.float16, causal=False,
         window=(40, 10)),
    dict(b=1, hq=2, hk=1, sq=96, sk=200, d=64, dtype=torch.bfloat16, causal=True, window=(30, -1)),
    dict(b=1, hq=2, hk=2, sq=100, sk=100, d=128, dtype=torch.float16, causal=False, softcap=2.0),
    dict(b=2, hq=2, hk=1, sq=80, sk=120, d=37, dtype=torch.bfloat16, causal=True, alibi="head"),
    dict(b=2, hq=2, hk=2, sq=90, sk=70, d=64, dtype=torch.float16, causal=False,
         alibi="batch_head", masked=True),
    dict(b=2, hq=2, hk=1, sq=100, sk=130, d=64, dtype=torch.float16, causal=True, sinks=True,
         masked=True),
    dict(b=1, hq=4, hk=2, sq=160, sk=200, d=72, dtype=torch.bfloat16, causal=True,
         window=(60, -1), alibi="head", softcap=3.0, sinks=True),
    dict(b=1, hq=2, hk=1, sq=64, sk=96, d=256, dtype=torch.float16, causal=False,
         window=(20, 30), alibi="batch_head", softcap=5.0, sinks=True, masked=True),
    dict(b=2, hq=2, hk=2, sq=70, sk=100, d=64, dtype=torch.float16, causal=False, dropout=0.2),
    dict(b=1, hq=2, hk=1, sq=90, sk=110, d=128, dtype=torch.bfloat16, causal=True, dropout=0.3,
         window=(40, -1), alibi="head", softcap=4.0, sinks=True, masked=True),
], ids=["window", "window-causal-gqa", "softcap-d128", "alibi-head-d37",
        "alibi-batch-head-mask", "sinks-causal-mask", "all-causal-d72", "all-d256",
        "dropout", "all-dropout-d128"])
def test_matches_oracle(case, gen):
    _check(**case, gen=gen)


def test_window_edge_row_opens_a_query_block(gen):
    """The last query row that sees a key block (its last key at the row's left window
    edge) is the first row of a query block: the key block's unit must walk that query
    block for one row. The window is chosen from the plan's blocks so that some key
    block's edge row starts a query block, with a left bound small enough that the row is
    one of few that see that key."""
    b, h, s, d = 1, 1, 1024, 64
    tiling = planner.grad_plan("Ascend910B2", b, h, s, d, dtype="float16",
                               features=planner.variant(window=(1, 0)))["tiling"]
    block_q, block_k = tiling["block_q"], tiling["block_k"]
    left, _ = min((left, last_key) for left in range(1, block_q + 1)
                    for last_key in range(block_k - 1, s, block_k)
                    if (last_key + left) % block_q == 0 and last_key + left < s)
    assert left <= 8, (block_q, block_k, left)  # few rows (left + 1) see the edge key
    assert planner.grad_plan("Ascend910B2", b, h, s, d, dtype="float16",
                             features=planner.variant(window=(left, 0)))["tiling"] == tiling
    _check(b=b, hq=h, hk=h, sq=s, sk=s, d=d, dtype=torch.float16, causal=False,
           window=(left, 0), gen=gen)


def test_window_skips_key_blocks_that_no_query_sees(gen):
    """A window that hides keys from every query: the units of those key blocks have no
    step (the plan's work is the band's), and their dK, dV are exact zeros, not the
    poison the launcher fills them with; the keys inside the band match the oracle."""
    b, hq, sq, sk, d = 1, 2, 64, 320, 32
    variant = _variant(b, hq, sq, sk, False, gen, window=(16, 0))
    q, k, v = make_qkv(b, hq, hq, sq, sk, d, torch.float16, "BNSD", generator=gen)
    grad_out = torch.randn(q.shape, generator=gen).to(q.dtype)
    dq, dk, dv = _twin_gradients(q, k, v, None, None, False, variant, grad_out, None)
    first_seen = sk - sq - 16  # row 0 sees keys sk - sq - 16 .. sk - sq
    assert torch.all(dk[:, :, :first_seen] == 0) and torch.all(dv[:, :, :first_seen] == 0)
    assert torch.any(dk[:, :, first_seen:] != 0)
    # At 4096 a (256, 0) window is 1/16 of the square: the plan's steps are the band's.
    plan = planner.grad_plan("Ascend910B2", 1, 2, 4096, d, dtype="float16",
                             features=planner.variant(window=(256, 0)))
    full = planner.grad_plan("Ascend910B2", 1, 2, 4096, d, dtype="float16")
    steps = sum(c["steps"] for c in plan["cores"])
    assert 0 < steps < sum(c["steps"] for c in full["cores"]) / 8


def _all_features(b, gen, sq=130, sk=150, hq=2, hk=1, d=64):
    q, k, v = make_qkv(b, hq, hk, sq, sk, d, torch.float16, "BNSD", generator=gen)
    variant = _variant(b, hq, sq, sk, True, gen, window=(50, -1), softcap=4.0, alibi="head",
                       dropout=0.15)
    sinks = torch.randn(hq, generator=gen)
    grad_out = torch.randn(q.shape, generator=gen).to(q.dtype)
    grad_lse = torch.randn(b, hq, sq, generator=gen)
    return q, k, v, sinks, variant, grad_out, grad_lse


def _sequence(variant: Variant, i: int) -> Variant:
    """The variant of sequence i of a batch as a batch of its own: its ALiBi slopes, and
    dropout's counter offset moved by i (the counter's batch word is b + offset)."""
    rng = variant.rng_state
    return dataclasses.replace(
        variant, alibi_slopes=variant.alibi_slopes[i:i + 1],
        rng_state=None if rng is None else rng + torch.tensor([0, i]))


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_deterministic_with_every_feature_across_core_counts(gen):
    """Window + causal + GQA + ALiBi + softcap + dropout + sinks, deterministic: the same bits
    for two runs and for 1, 3 and 7 cores (different cuts of the units), and no atomic adds
    from two cores in an order the hardware does not fix."""
    q, k, v, sinks, variant, grad_out, grad_lse = _all_features(2, gen)
    first = None
    for cores in (3, 3, 1, 7):
        unordered = []
        grads = _twin_gradients(q, k, v, sinks, None, True, variant, grad_out, grad_lse,
                                deterministic=True, ai_cores=cores,
                                unordered_atomic_adds=unordered)
        assert unordered == [], f"unordered atomic adds into {unordered}, {cores} cores"
        first = first or grads
        for name, a, b in zip(("dq", "dk", "dv", "grad_sinks"), first, grads):
            assert torch.equal(_bits(a), _bits(b)), f"{name}, {cores} cores"


def test_batch_invariant_with_every_feature(gen):
    """A sequence's dq, dk, dv do not depend on the rest of the batch: each of 7 sequences
    alone (batch 1, dropout's offset moved to its index) gives the bits it gets inside the
    batch of 7 (deterministic). The
    sink gradient sums over the batch: it equals the fixed-order float32 sum of the
    sequences' own sink gradients."""
    batch = 7
    q, k, v, sinks, variant, grad_out, grad_lse = _all_features(batch, gen, sq=70, sk=90)
    out, lse = _forward(q, k, v, sinks, None, True, variant)  # the same inputs for both
    together = _twin_gradients(q, k, v, sinks, None, True, variant, grad_out, grad_lse,
                               forward=(out, lse), deterministic=True, ai_cores=3)
    total = torch.zeros(q.shape[1])
    for i in range(batch):
        one = _sequence(variant, i)
        alone = _twin_gradients(q[i:i + 1], k[i:i + 1], v[i:i + 1], sinks, None, True, one,
                                grad_out[i:i + 1], grad_lse[i:i + 1],
                                forward=(out[i:i + 1], lse[i:i + 1]), deterministic=True,
                                ai_cores=2)
        for name, a, b in zip(("dq", "dk", "dv"), together, alone):
            assert torch.equal(_bits(a[i:i + 1]), _bits(b)), f"{name} of sequence {i}"
        total = total + -alone[3]  # the kernel's order: sequence by sequence, negated last
    assert torch.equal(_bits(together[3]), _bits(-total))


def test_cpu_backend_is_batch_invariant(gen):
    """The CPU backend, deterministic: out, lse, dq, dk, dv of a sequence alone are the
    bits it gets inside a batch of 7."""
    b, hq, hk, sq, sk, d = 7, 2, 1, 70, 90, 32
    q, k, v = make_qkv(b, hq, hk, sq, sk, d, torch.float16, "BNSD", generator=gen)
    variant = _variant(b, hq, sq, sk, True, gen, window=(40, -1), softcap=3.0, alibi="batch_head",
                       dropout=0.2)
    grad_out = torch.randn(q.shape, generator=gen).to(q.dtype)
    grad_lse = torch.randn(b, hq, sq, generator=gen)

    def run(rows, v_):
        args = (q[rows], k[rows], v[rows])
        out, lse = cpu.forward(*args, None, scale=0.125, causal=True, layout="BNSD", variant=v_)
        grads = cpu.backward(grad_out[rows], *args, out, lse, None, grad_lse[rows], scale=0.125,
                             causal=True, layout="BNSD", deterministic=True, variant=v_)
        return (out, lse, *grads[:3])

    together = run(slice(0, b), variant)
    for i in (0, 4, 6):
        alone = run(slice(i, i + 1), _sequence(variant, i))
        for name, a, c in zip(("out", "lse", "dq", "dk", "dv"), together, alone):
            assert torch.equal(_bits(a[i:i + 1]), _bits(c)), f"{name} of sequence {i}"


def test_alibi_past_exact_fp32_distances_is_refused():
    with pytest.raises(Exception, match="ALiBi at seqlen 16777217"):
        planner.grad_plan("Ascend910B2", 1, 1, 16, 64, seqlen_k=(1 << 24) + 1, dtype="float16",
                          features=planner.variant(alibi="head"))
