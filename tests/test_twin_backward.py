"""The Ascend C backward kernel (op_kernel/flash_cann_attention_grad.cpp) run on the CPU
twin: gradients match the float64 oracle under the project's tolerance rule across
dtypes, masks, GQA/MQA, head dims, tails and core counts, and the kernel allocates
exactly the bytes the backward planner accounts for; fully masked rows get zero
gradients; the deterministic dQ variant gets no atomic adds from two cores in an order
the hardware does not fix (the race detector's report; the fast variant does) and is
bitwise repeatable across runs and across core counts that split the work differently.

What this verifies and what it cannot: docs/twin.md and docs/kernel-backward.md ("What the twin proves")."""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann
from flash_cann.tools import accuracy
from flash_cann.ascend import planner
from flash_cann.contract import layout as layouts
from flash_cann.backends.cpu import attention as cpu
from flash_cann.backends.twin import launcher as twin

from conftest import make_qkv, random_key_padding_mask
from native_build import built


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


class _TwinGrad(torch.autograd.Function):
    """The CPU forward (its out and lse are what the op saves), the twin's backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask, options):
        out, lse = cpu.forward(q, k, v, mask, scale=options["scale"], causal=options["causal"],
                               layout=options["layout"])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.options = mask, options
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        grads = twin.backward(grad_out, q, k, v, out, lse, ctx.mask, grad_lse, **ctx.options)
        return (*grads[:3], None, None)


def _planned_bytes(q, k, mask, causal, layout, options):
    """The backward planner's per-level buffer figures (plan["levels"])."""
    b, hq, sq, d = layouts.sizes(q, layout)
    hk, sk = layouts.sizes(k, layout)[1:3]
    plan = planner.grad_plan("Ascend910B2", b, hq, sq, d, heads_kv=hk, seqlen_k=sk,
                             dtype=str(q.dtype).removeprefix("torch."), layout=layout,
                             causal=causal, has_mask=mask is not None,
                             deterministic=options.get("deterministic", False),
                             aic_cores=options.get("ai_cores") or 0)
    return {level["level"]: level["used"] for level in plan["levels"]}


def _check(q, k, v, mask, causal, layout, gen, **options):
    """The twin's gradients match the oracle, and the bytes the kernel allocated per
    memory level (every InitBuffer, measured by the twin) are the planner's figures."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    allocated = {}
    options = dict(scale=scale, causal=causal, layout=layout, allocated=allocated, **options)
    results = accuracy.check_against_oracle(
        lambda q_, k_, v_: _TwinGrad.apply(q_, k_, v_, mask, options), q, k, v, scale=scale,
        causal=causal, layout=layout, key_padding_mask=mask, generator=gen)
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))
    assert allocated == _planned_bytes(q, k, mask, causal, layout, options)


# Each feature at least once, not the cartesian product: dtype x causal x mask x heads.
@pytest.mark.parametrize("dtype, causal, masked, heads, layout", [
    (torch.float16, True, True, (4, 2), "BSND"),
    (torch.bfloat16, False, True, (4, 4), "BNSD"),
    (torch.float16, False, False, (4, 1), "BNSD"),
    (torch.bfloat16, True, False, (6, 2), "BSND"),
], ids=["fp16-causal-mask-gqa", "bf16-full-mask-mha", "fp16-full-mqa", "bf16-causal-gqa"])
def test_matches_oracle(dtype, causal, masked, heads, layout, gen):
    q, k, v = make_qkv(2, *heads, 100, 150, 64, dtype, layout, generator=gen)
    mask = random_key_padding_mask(2, 150, gen) if masked else None
    _check(q, k, v, mask, causal, layout, gen)


@pytest.mark.parametrize("head_dim", [128, 80, 17, 256, 200])
def test_head_dims(head_dim, gen):
    """Head dims that are not powers of two (80; 17, padded to 32) and the maximum, 256,
    whose dK/dV accumulators leave room for 64 x 48 blocks only with the fast dQ in four
    64-column pieces; 200 (padded to 208) ends in a narrower, 16-column piece."""
    q, k, v = make_qkv(1, 2, 1, 70, 90, head_dim, torch.float16, "BNSD", generator=gen)
    _check(q, k, v, random_key_padding_mask(1, 90, gen), True, "BNSD", gen)


@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (1000, 1000), (17, 1000), (1000, 17)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_sequence_tails(seqlens, gen):
    q, k, v = make_qkv(1, 2, 1, *seqlens, 32, torch.bfloat16, "BNSD", generator=gen)
    _check(q, k, v, random_key_padding_mask(1, seqlens[1], gen), True, "BNSD", gen)


def test_partial_key_block_without_a_mask_when_every_score_is_very_negative(gen):
    """Without a key mask the last key block's padded columns still need their -inf bias.
    The padding of K and V is zero, so its scores are 0 and, with a bias left out, only
    exp(0 - lse) is at stake: harmless while lse is small, inf once every real score of a
    row is below -88 (here about -128), and inf x the zero K rows is NaN in dQ."""
    q, k, v = make_qkv(1, 2, 1, 40, 100, 64, torch.float16, "BNSD", generator=gen)
    q = (4 + 0.1 * q.float()).to(q.dtype)
    k = (-4 - 0.1 * k.float()).to(k.dtype)
    _check(q, k, v, None, False, "BNSD", gen)


@pytest.mark.parametrize("cores", [1, 5])
def test_core_counts(cores, gen):
    """The fast variant (atomic dQ adds from several cores) on splits that do not divide
    the 12 units evenly."""
    q, k, v = make_qkv(2, 4, 2, 130, 200, 32, torch.float16, "BNSD", generator=gen)
    _check(q, k, v, None, True, "BNSD", gen, ai_cores=cores)


def test_units_of_one_step(gen):
    """One core, one query block, three key blocks: every unit is a single step, and the
    last unit's first Mmad into the dK/dV accumulators follows the previous unit's Fixpipe
    out of them with no product in between (the FIX -> M flag in WriteKeyValueGrad orders
    them; dropping it is a race the detector reports)."""
    q, k, v = make_qkv(1, 1, 1, 100, 300, 32, torch.float16, "BNSD", generator=gen)
    _check(q, k, v, None, False, "BNSD", gen, ai_cores=1)


@pytest.mark.parametrize("seqlens", [(100, 150), (40, 2200)], ids=["few-key-blocks", "many-key-blocks"])
def test_deterministic_variant_matches_oracle(seqlens, gen):
    q, k, v = make_qkv(1, 4, 2, *seqlens, 64, torch.bfloat16, "BSND", generator=gen)
    mask = random_key_padding_mask(1, seqlens[1], gen)
    _check(q, k, v, mask, True, "BSND", gen, deterministic=True)


def test_deterministic_query_pass_reaches_the_diagonal_key_block(gen):
    """The query pass walks, per query block, the key blocks its rows see; with causal the
    last row's diagonal key is the last one. seqlen = blockK + 1 puts that key alone at
    the start of the last key block, so a walk that ends one key early (the mutant
    kernel-bwd-query-pass-misses-a-key-block) drops the block, one term of the last row's
    dQ: too small for the oracle's tolerance, so dQ is held to the fast variant's, which
    differs from it only in the order of fp32 sums (an fp16 rounding step at most)."""
    block_k = planner.grad_plan("Ascend910B2", 1, 2, 64, 64, deterministic=True,
                                causal=True)["tiling"]["block_k"]
    q, k, v = make_qkv(1, 2, 1, block_k + 1, block_k + 1, 64, torch.float16, "BNSD", generator=gen)
    out, lse = cpu.forward(q, k, v, None, scale=0.125, causal=True, layout="BNSD")
    grad_out = torch.randn(out.shape, generator=gen).to(out.dtype)
    dq = [twin.backward(grad_out, q, k, v, out, lse, None, None, scale=0.125, causal=True,
                        layout="BNSD", deterministic=deterministic)[0]
          for deterministic in (True, False)]
    torch.testing.assert_close(dq[0], dq[1], rtol=2e-3, atol=2e-4)


def _backward_args(seqlens, gen):
    q, k, v = make_qkv(2, 4, 2, *seqlens, 64, torch.float16, "BNSD", generator=gen)
    mask = random_key_padding_mask(2, seqlens[1], gen)
    out, lse = cpu.forward(q, k, v, mask, scale=0.125, causal=True, layout="BNSD")
    grad_out = torch.randn(out.shape, generator=gen).to(out.dtype)
    grad_lse = torch.randn(lse.shape, generator=gen)
    return (grad_out, q, k, v, out, lse, mask, grad_lse)


def _assert_deterministic(args, deterministic):
    """What the deterministic variant promises, checked two ways. Structurally: no tensor
    the kernel writes gets atomic adds from two cores in an order no happens-before edge
    fixes (the race detector's report). By outcome: the same bits for every run and for 1,
    3 and 7 cores, which cut the units (batch x kv head x key block) at different places
    while several cores contribute to the same dQ rows. The outcome alone cannot catch
    the atomic path: fp16 rounding hides most fp32 reorderings and the twin's atomics
    arrive in a nearly fixed order, so the structural check is the one that fails."""
    *tensors, mask, grad_lse = args
    first = None
    for cores in (3, 3, 1, 7):
        unordered = []
        grads = twin.backward(*tensors, mask, grad_lse, scale=0.125, causal=True, layout="BNSD",
                              deterministic=deterministic, ai_cores=cores,
                              unordered_atomic_adds=unordered)
        assert unordered == [], f"unordered atomic adds into {unordered}, {cores} cores"
        first = first or grads
        for name, a, b in zip(("dq", "dk", "dv"), first, grads):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name}, {cores} cores"


@pytest.mark.parametrize("seqlens", [(96, 333), (40, 2200)], ids=["few-key-blocks", "many-key-blocks"])
def test_deterministic_variant_is_bitwise_repeatable(seqlens, gen):
    """With 2200 keys a query unit of the query pass accumulates many key blocks in L0C,
    and the cores' query-unit ranges differ with the core count."""
    _assert_deterministic(_backward_args(seqlens, gen), deterministic=True)


def test_determinism_check_fails_on_the_atomic_path(gen):
    """The mutation of routing the deterministic key to the atomic dQ path: the fast
    variant under the same assertions fails them, on its unordered fp32 adds into the dQ
    accumulator in the workspace (dK/dV are owned by one core: no atomics there)."""
    args = _backward_args((96, 333), gen)
    with pytest.raises(AssertionError, match=r"unordered atomic adds into \['workspace'\]"):
        _assert_deterministic(args, deterministic=False)


def test_fully_masked_rows_get_zero_gradients(gen):
    """Rows that see no key (the second batch is fully padded; causal with seqlen_q >
    seqlen_k hides every key from the first rows) get exactly zero dQ, and keys that
    no row sees get zero dK and dV; nothing is NaN."""
    q, k, v = make_qkv(2, 2, 2, 40, 24, 32, torch.float16, "BNSD", generator=gen)
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[1] = False
    mask[0, 20:] = False
    out, lse = cpu.forward(q, k, v, mask, scale=0.2, causal=True, layout="BNSD")
    grad_out = torch.randn(out.shape, generator=gen).to(out.dtype)
    dq, dk, dv, grad_sinks = twin.backward(grad_out, q, k, v, out, lse, mask, None, scale=0.2,
                                           causal=True, layout="BNSD")
    assert grad_sinks is None
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))
    assert torch.all(dq[1] == 0) and torch.all(dk[1] == 0) and torch.all(dv[1] == 0)
    assert torch.all(dq[0, :, :16] == 0) and torch.any(dq[0, :, 16:] != 0)
    assert torch.all(dk[0, :, 20:] == 0) and torch.all(dv[0, :, 20:] == 0)


def test_reachable_through_the_op_contract(gen):
    """loss.backward() through flash_cann.attention on the twin backend runs the twin's
    forward and backward kernels; an unused lse reaches the kernel as no dLSE."""
    q, k, v = make_qkv(1, 4, 2, 50, 60, 64, torch.bfloat16, "BSND", generator=gen)
    grad_out = torch.randn(q.shape, generator=gen).to(q.dtype)

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flash_cann.attention(*leaves, layout="BSND", causal=True)
        out.backward(grad_out)
        return [t.grad for t in leaves]

    with flash_cann.use_backend("twin"):
        got = grads()
    for g, ref in zip(got, grads()):  # the cpu backend
        torch.testing.assert_close(g, ref, atol=3e-2, rtol=3e-2)


def test_planner_refusal_is_reported(gen):
    q, k, v = make_qkv(1, 3, 2, 8, 8, 16, torch.float16, generator=gen)
    out = torch.zeros_like(q)
    lse = torch.zeros(1, 3, 8)
    with pytest.raises(twin.TwinViolation, match="planner refused: heads_q"):
        twin.backward(out, q, k, v, out, lse, None, None, scale=0.1, causal=False, layout="BNSD")


def test_a_plan_with_more_blocks_than_the_device_has_cores_is_reported():
    """asc-devkit SyncAll: a kernel that synchronises across blocks must launch no more
    blocks than the AI cores running it. A backward planned for 4 cores, launched on a
    device of 3, is stopped at its SyncAll; on 4 cores the same plan runs."""
    gen = torch.Generator().manual_seed(41)
    q, k, v = make_qkv(1, 4, 4, 256, 256, 64, torch.float16, generator=gen)
    scale = 0.125
    out, lse = cpu.forward(q, k, v, None, scale=scale, causal=False, layout="BNSD")
    grad = torch.randn(out.shape, generator=gen).half()
    assert planner.grad_plan("Ascend910B2", 1, 4, 256, 64, aic_cores=4)["block_dim"] == 4
    call = dict(scale=scale, causal=False, layout="BNSD", ai_cores=4)
    with twin.device_cores(3), pytest.raises(
            twin.TwinViolation, match=r"\[R98\] SyncAll in a launch of 4 blocks on 3 AI cores"):
        twin.backward(grad, q, k, v, out, lse, None, None, **call)
    twin.backward(grad, q, k, v, out, lse, None, None, **call)
