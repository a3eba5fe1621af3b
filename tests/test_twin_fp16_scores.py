"""The fp16-score fast path (fp16_scores=True) on the CPU twin, held to issue 25's accuracy
rule: at the same shapes, its error against the float64 oracle (max and mean absolute
error of out, lse, dq, dk, dv) must be <= 3x the default (fp32-score) path's, per output.

The path: the forward keeps fp32 S (fp16_scores=True runs the default forward, bit for
bit: its fp16-S variant broke the rule, lse by 100-2000x and out by 15.8x at large
logits, and was removed), then the fast backward, which rounds S - c to fp16, c a per-row
offset from lse (docs/kernel-backward.md, "The fp16-score fast path"). It keeps the rule in every
cell of these cases; KNOWN_VIOLATIONS lists the cells that break it (none), and the test
fails on a cell that breaks it unlisted or a listed one that keeps it. docs/kernel-backward.md has
the shape the backward misses (peaked rows over 4096 keys), measured once, not run here.

Scores past fp16's range (|S - c| > 65504) overflow to inf in the Fixpipe (the twin does
not assume saturation); the backward's vector cores clamp them to +-65504, so gradients
stay finite.
"""

from __future__ import annotations

import pytest
import torch

from flash_cann.ascend import planner
from flash_cann.backends.twin import launcher as twin
from flash_cann.contract import reference
from flash_cann.contract.variant import Variant

from conftest import make_qkv
from native_build import built

RULE = 3.0  # the fast path's error may be at most this multiple of the default path's

# name: (heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, amplitude of q and k,
# features). Amplitude 1: unit-variance scaled logits at scale 1/sqrt(head_dim); 3:
# logits of standard deviation 9 (the "large logit" case).
CASES = {
    "gqa_1536_keys": (2, 1, 128, 1536, 64, False, 1.0, {}),
    "causal": (2, 2, 384, 384, 64, True, 1.0, {}),
    "window_alibi": (2, 2, 256, 384, 32, False, 1.0,
                     dict(window_left=96, window_right=8, alibi_slopes=(0.25, 0.0625))),
    "large_logits": (2, 1, 128, 1024, 64, True, 3.0, {}),
    # softcap's tanh takes the scores themselves: the backward adds its offset back to
    # them, rather than folding it into lse.
    "softcap": (2, 2, 128, 256, 32, False, 1.5, dict(softcap=3.0)),
}

METRICS = [f"{name} {kind}" for name in ("out", "lse", "dq", "dk", "dv")
           for kind in ("max", "mean")]
# (case, metric) cells where the fast path's error exceeds RULE x the default path's, as
# measured on the twin (ratios in docs/kernel-backward.md): none.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def _variant(batch_heads: int, features: dict, fp16_scores: bool) -> Variant:
    slopes = features.get("alibi_slopes")
    return Variant(window_left=features.get("window_left", -1),
                   window_right=features.get("window_right", -1),
                   softcap=features.get("softcap", 0.0),
                   alibi_slopes=None if slopes is None else
                   torch.tensor(slopes, dtype=torch.float32).expand(1, batch_heads),
                   fp16_scores=fp16_scores)


def _errors(results, oracle) -> dict[str, float]:
    """Max and mean absolute error of each result (lse: where the row sees a key)."""
    errors = {}
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), results, oracle):
        diff = (got.double() - want).abs()
        diff = diff[torch.isfinite(oracle[1])] if name == "lse" else diff
        errors[f"{name} max"], errors[f"{name} mean"] = diff.max().item(), diff.mean().item()
    return errors


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """Per case: the forwards with fp16_scores False and True, and (case, metric) -> the
    fast path's error / the default path's, both against float64."""
    g = torch.Generator().manual_seed(25)
    results = {}
    for name, (hq, hk, sq, sk, d, causal, amplitude, features) in CASES.items():
        q, k, v = make_qkv(1, hq, hk, sq, sk, d, torch.float16, "BNSD", generator=g)
        q, k = ((t.float() * amplitude).half() for t in (q, k))
        grad_out = torch.randn(q.shape, generator=g).half()
        scale = d ** -0.5
        # The oracle: float64 from the fp16 inputs, nothing rounded.
        inputs = [t.double().requires_grad_() for t in (q, k, v)]
        ref_out, ref_lse = reference.attention(*inputs, scale=scale, causal=causal,
                                               variant=_variant(hq, features, False))
        oracle = (ref_out.detach(), ref_lse.detach(),
                  *torch.autograd.grad(ref_out, inputs, grad_out.double()))
        errors, forwards = [], []
        for fast in (False, True):
            options = dict(scale=scale, causal=causal, layout="BNSD",
                           variant=_variant(hq, features, fast))
            out, lse = twin.forward(q, k, v, None, **options)
            forwards.append((out, lse))
            grads = twin.backward(grad_out, q, k, v, out, lse, None, None, **options)[:3]
            errors.append(_errors((out, lse, *grads), oracle))
        ratios = {metric: errors[1][metric] / max(errors[0][metric], 1e-12)
                  for metric in METRICS}
        results[name] = dict(forwards=forwards, ratios=ratios)
    return results


def test_the_forward_with_fp16_scores_is_the_default_forward(runs):
    """fp16_scores=True permits the backward only: the forward's out and lse are the
    default forward's, bit for bit, in every case."""
    for name, run in runs.items():
        (out, lse), (fast_out, fast_lse) = run["forwards"]
        assert torch.equal(out, fast_out) and torch.equal(lse, fast_lse), name


def test_fast_path_keeps_the_accuracy_rule(runs):
    """Issue 25's rule, cell by cell (out, lse, dq, dk, dv; max and mean): a violation not
    in KNOWN_VIOLATIONS fails, and so does a listed cell that keeps the rule (update
    KNOWN_VIOLATIONS and docs/kernel-backward.md's ratios)."""
    table = {(case, metric): ratio for case, run in runs.items()
             for metric, ratio in run["ratios"].items()}
    print("\n" + "\n".join(f"{case:<14} {metric:<8} {ratio:8.2f}"
                            for (case, metric), ratio in sorted(table.items())))
    broken = {cell for cell, ratio in table.items() if ratio > RULE}
    assert broken - KNOWN_VIOLATIONS == set(), (
        f"new violations: { {c: round(table[c], 2) for c in broken - KNOWN_VIOLATIONS} }")
    assert KNOWN_VIOLATIONS - broken == set(), (
        f"cells that now keep the rule: {KNOWN_VIOLATIONS - broken}")


def test_overflowing_scores_stay_finite():
    """|S - c| beyond 65504 leaves the backward's Fixpipe as +-inf in fp16 (c is clamped to
    65504 in magnitude, and scores far below a row's offset overflow); the vector cores
    clamp them, so no row turns NaN (inf - inf) and the gradients stay finite."""
    g = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(1, 2, 2, 64, 256, 64, torch.float16, "BNSD", generator=g)
    q, k = ((t.float() * 48).half() for t in (q, k))  # |q.k| up to ~1e5
    scores = q.float() @ k.float().transpose(-1, -2)
    # The case exercises the overflow: some score is more than 65504 below its row's
    # largest, and the offset is near the largest (or clamped to 65504).
    assert (scores.amax(-1, keepdim=True).clamp(max=65504) - scores).max() > 65504
    options = dict(scale=0.125, causal=False, layout="BNSD", variant=Variant(fp16_scores=True))
    out, lse = twin.forward(q, k, v, None, **options)
    grads = twin.backward(out, q, k, v, out, lse, None, None, **options)[:3]
    assert all(torch.isfinite(t).all() for t in (out, lse, *grads))


def test_scores_far_above_the_clamped_offset_stay_finite():
    """The other side: with |c| clamped to 65504, a row whose largest scores pass
    2 x 65504 leaves S - c above fp16's range (+inf from the Fixpipe); the vector cores
    clamp it too, so the gradients stay finite."""
    g = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(1, 2, 2, 64, 256, 64, torch.float16, "BNSD", generator=g)
    q, k = ((t.float() * 80).half() for t in (q, k))  # |q.k| up to ~3e5
    scores = q.float() @ k.float().transpose(-1, -2)
    assert (scores - scores.amax(-1, keepdim=True).clamp(max=65504)).max() > 65504
    options = dict(scale=0.125, causal=False, layout="BNSD", variant=Variant(fp16_scores=True))
    out, lse = twin.forward(q, k, v, None, **options)
    grads = twin.backward(out, q, k, v, out, lse, None, None, **options)[:3]
    assert all(torch.isfinite(t).all() for t in (out, lse, *grads))


def test_the_fast_kernels_allocate_what_the_planners_account():
    """Forward and backward with fp16_scores: the bytes the kernels allocate per memory
    level (every InitBuffer, measured by the twin) are the planners' figures; the backward
    holds the fp16 S rows and their fp32 copy (s_ub, s_f32_ub), the forward plans as the
    default path (no s_f32_ub)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = make_qkv(1, 2, 1, 96, 200, 48, torch.float16, "BNSD", generator=g)
    options = dict(scale=0.125, causal=True, layout="BNSD", variant=Variant(fp16_scores=True))
    sizes = dict(heads_kv=1, seqlen_k=200, dtype="float16", causal=True, scale=0.125)
    fast = dict(sizes, features=planner.variant(fp16_scores=True))
    forward, backward = {}, {}
    out, lse = twin.forward(q, k, v, None, allocated=forward, **options)
    twin.backward(out, q, k, v, out, lse, None, None, allocated=backward, **options)
    forward_plan = planner.plan("Ascend910B2", 1, 2, 96, 48, **fast)
    assert forward_plan == planner.plan("Ascend910B2", 1, 2, 96, 48, **sizes)
    grad_plan = planner.grad_plan("Ascend910B2", 1, 2, 96, 48, **fast)
    assert {b["name"] for b in grad_plan["buffers"]} >= {"s_ub", "s_f32_ub"}
    for allocated, plan in ((forward, forward_plan), (backward, grad_plan)):
        assert allocated == {level["level"]: level["used"] for level in plan["levels"]}
