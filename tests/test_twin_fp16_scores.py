"""The fp16-score fast path (fp16_scores=True) of the forward and backward kernels on the
CPU twin, held to issue 25's accuracy rule: at the same shapes, its error against the
float64 oracle (max and mean absolute error of out, lse, dq, dk, dv; each path's backward
takes its own forward's out and lse) must be <= 3x the default (fp32-score) path's.

The rule does NOT hold everywhere, and this file says exactly where: KNOWN_VIOLATIONS
lists the (case, metric) cells that break it, as measured, and the test fails if a cell
breaks the rule that is not listed, or a listed cell keeps it (so the list cannot go
stale). Why they break (docs/kernel.md, "The fp16-score fast path"): the forward's Fixpipe
rounds the unscaled S = QK^T to fp16, an error of |scaled logit| x 2^-12 per score, where
the default path's probabilities carry only P's own fp16 rounding (2^-12 relative); lse,
fp32-exact on the default path, inherits the rounding of the row max, and the gradients
inherit both through out and lse. The backward rounds S - c instead, c a per-row offset
from lse (the cube subtracts it before the Fixpipe): on its own, given the default
forward's out and lse, it keeps the rule in every cell of these cases
(test_the_fast_backward_keeps_the_rule; docs/kernel.md has the shape it misses, peaked
rows over 4096 keys, measured once and not run here).

Scores past fp16's range (|QK^T| > 65504) overflow to inf in the Fixpipe (the twin does
not assume saturation); the vector cores clamp them to +-65504, so rows stay finite.
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
# measured on the twin (ratios in docs/kernel.md): lse in every case, and at large logits
# every metric (the forward's S rounding, which the backward inherits through out and lse).
KNOWN_VIOLATIONS = ({(case, m) for case in CASES for m in ("lse max", "lse mean")}
                    | {("large_logits", m) for m in METRICS})
GRADIENTS = [f"{name} {kind}" for name in ("dq", "dk", "dv") for kind in ("max", "mean")]


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
def ratios() -> dict[str, dict[tuple[str, str], float]]:
    """(case, metric) -> the fast path's error / the default path's, both vs float64:
    "path" the fast forward and its backward, "backward" the fast backward given the
    default forward's out and lse."""
    g = torch.Generator().manual_seed(25)
    tables = {"path": {}, "backward": {}}
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
        options = dict(scale=scale, causal=causal, layout="BNSD",
                       variant=_variant(hq, features, True))
        grads = twin.backward(grad_out, q, k, v, *forwards[0], None, None, **options)[:3]
        alone = _errors((*forwards[0], *grads), oracle)
        for metric in errors[0]:
            floor = max(errors[0][metric], 1e-12)
            tables["path"][(name, metric)] = errors[1][metric] / floor
            if metric in GRADIENTS:
                tables["backward"][(name, metric)] = alone[metric] / floor
    return tables


def _print(table) -> None:
    print("\n" + "\n".join(f"{case:<14} {metric:<8} {ratio:8.2f}"
                            for (case, metric), ratio in sorted(table.items())))


def test_fast_path_breaks_the_accuracy_rule_only_where_known(ratios):
    """Issue 25's rule, cell by cell: a new violation fails, and so does a listed cell that
    now keeps the rule (update KNOWN_VIOLATIONS and docs/kernel.md's ratios)."""
    _print(ratios["path"])
    broken = {cell for cell, ratio in ratios["path"].items() if ratio > RULE}
    assert broken - KNOWN_VIOLATIONS == set(), f"new violations: {broken - KNOWN_VIOLATIONS}"
    assert KNOWN_VIOLATIONS - broken == set(), (
        f"cells that now keep the rule: {KNOWN_VIOLATIONS - broken}")


def test_the_fast_backward_keeps_the_rule(ratios):
    """The backward's score offset (c from lse, subtracted on the cube before the Fixpipe):
    given the default forward's out and lse, its dq, dk and dv errors are within RULE x the
    default backward's in every case, large logits included."""
    _print(ratios["backward"])
    broken = {cell: round(r, 2) for cell, r in ratios["backward"].items() if r > RULE}
    assert broken == {}, f"the fast backward breaks the rule: {broken}"


def test_overflowing_scores_stay_finite():
    """|QK^T| beyond 65504 leaves the Fixpipe as +-inf in fp16; the vector cores clamp it,
    so no row turns NaN (inf - inf) and lse stays finite."""
    g = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(1, 2, 2, 64, 256, 64, torch.float16, "BNSD", generator=g)
    q, k = ((t.float() * 48).half() for t in (q, k))  # |q.k| up to ~1e5
    scores = q.float() @ k.float().transpose(-1, -2)
    assert scores.abs().max() > 65504  # the case exercises the overflow
    out, lse = twin.forward(q, k, v, None, scale=0.125, causal=False, layout="BNSD",
                            variant=Variant(fp16_scores=True))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_the_fast_kernels_allocate_what_the_planners_account():
    """Forward and backward on the fp16-score path: the bytes the kernels allocate per
    memory level (every InitBuffer, measured by the twin) are the planners' figures, which
    hold the fp16 S slices and their fp32 copies (s_ub, s_f32_ub)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = make_qkv(1, 2, 1, 96, 200, 48, torch.float16, "BNSD", generator=g)
    options = dict(scale=0.125, causal=True, layout="BNSD", variant=Variant(fp16_scores=True))
    sizes = dict(heads_kv=1, seqlen_k=200, dtype="float16", causal=True, scale=0.125,
                 features=planner.variant(fp16_scores=True))
    forward, backward = {}, {}
    out, lse = twin.forward(q, k, v, None, allocated=forward, **options)
    twin.backward(out, q, k, v, out, lse, None, None, allocated=backward, **options)
    for allocated, plan in ((forward, planner.plan("Ascend910B2", 1, 2, 96, 48, **sizes)),
                            (backward, planner.grad_plan("Ascend910B2", 1, 2, 96, 48, **sizes))):
        assert {b["name"] for b in plan["buffers"]} >= {"s_ub", "s_f32_ub"}
        assert allocated == {level["level"]: level["used"] for level in plan["levels"]}
