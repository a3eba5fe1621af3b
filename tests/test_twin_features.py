"""The forward Ascend C kernel's features on the CPU twin (race detector on): sliding
window, softcap, ALiBi, attention sinks, alone and combined, against the float64 oracle;
window blocks really skipped; results bit for bit independent of the batch and of the
split over cores. Called through flash_cann.backends.twin.launcher.forward(variant=...)
directly (the spec's twin features are the lead's to switch on once the backward has
them too)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from flash_cann.ascend import planner
from flash_cann.backends.twin import launcher as twin
from flash_cann.contract import layout as layouts
from flash_cann.contract.variant import Variant, keep_mask
from flash_cann.tools import accuracy

from conftest import make_qkv, random_key_padding_mask
from native_build import built


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def _features(variant: Variant, batch: int) -> planner.Variant:
    """The planner's encoding of a Variant, as the launcher hands it to the kernel."""
    slopes = variant.alibi_slopes
    alibi = None
    if slopes is not None:
        alibi = "head" if slopes.dim() == 1 or slopes.stride(0) == 0 else "batch_head"
    return planner.variant(window=(variant.window_left, variant.window_right),
                           softcap=variant.softcap, dropout_p=variant.dropout_p, alibi=alibi,
                           sinks=getattr(variant, "sinks", None) is not None)


def _with_sinks(out, lse, sinks, layout):
    """(out, lse) of the same call with one more logit per head in every row's denominator
    (contract.variant): lse' = log(exp(lse) + exp(sink)), out' = out exp(lse - lse'); a row
    that sees no key gets out 0 and lse' = sink."""
    sink = sinks.to(lse.dtype).view(1, -1, 1).expand_as(lse)
    joint = torch.logaddexp(lse, sink)
    factor = layouts.from_bnsd(torch.exp(lse - joint).unsqueeze(-1), layout)
    return (out.to(lse.dtype) * factor).to(out.dtype), joint


def _check(q, k, v, causal, variant, cores=None, mask=None, layout="BNSD"):
    """The twin's result matches the float64 oracle (judged as accuracy.compare judges every
    backend; dropout: the oracle applies contract.variant.keep_mask of the same
    rng_state), and the kernel allocated exactly the planner's buffers."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    b, hq, sq, d = layouts.sizes(q, layout)
    hk, sk = layouts.sizes(k, layout)[1:3]
    allocated = {}
    sinks = getattr(variant, "sinks", None)
    plain_features = dataclasses.replace(variant, sinks=None) if sinks is not None else variant
    keep = None
    if variant.dropout_p > 0:
        keep = keep_mask(variant.rng_state, variant.dropout_p, torch.arange(b).view(-1, 1, 1, 1),
                         torch.arange(hq).view(1, -1, 1, 1), torch.arange(sq).view(1, 1, -1, 1),
                         torch.arange(sk).view(1, 1, 1, -1))
    with torch.no_grad():
        got = twin.forward(q, k, v, mask, scale=scale, causal=causal, layout=layout,
                           variant=variant, ai_cores=cores, allocated=allocated)
        oracle = accuracy._materialising(mask, scale, causal, layout, plain_features, keep,
                                         torch.float64)(q.double(), k.double(), v.double())
        baseline = accuracy._materialising(mask, scale, causal, layout, plain_features, keep,
                                           q.dtype)(q, k, v)
        lse_baseline = accuracy._materialising(mask, scale, causal, layout, plain_features, keep,
                                               torch.float32)(q, k, v)[1]
    baseline = (baseline[0], lse_baseline)
    if sinks is not None:
        oracle = _with_sinks(*oracle, sinks.double(), layout)
        baseline = _with_sinks(*baseline, sinks, layout)
    results = [accuracy.compare(name, kind, got[i], oracle[i], baseline[i], q.dtype)
               for name, kind, i in (("out", "out", 0), ("softmax_lse", "lse", 1))]
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))
    plan = planner.plan("Ascend910B2", b, hq, sq, d, heads_kv=hk, seqlen_k=sk,
                        dtype=str(q.dtype).removeprefix("torch."), layout=layout, causal=causal,
                        has_mask=mask is not None, scale=scale, features=_features(variant, b))
    assert allocated == {level["level"]: level["used"] for level in plan["levels"]}
    return got


def _slopes(heads, gen, batch=None):
    shape = (heads,) if batch is None else (batch, heads)
    return torch.rand(shape, generator=gen) * 0.5 + 0.05


FEATURES = {
    "window": (False, dict(window_left=40, window_right=25)),
    "window-left": (False, dict(window_left=60)),
    "window-right": (False, dict(window_right=0)),
    "window-causal": (True, dict(window_left=50)),
    "softcap": (False, dict(softcap=3.0)),
    "softcap-causal": (True, dict(softcap=30.0)),
    "alibi-head": (False, "head"),
    "alibi-batch-head": (True, "batch_head"),
    "sinks": (False, "sinks"),
    "sinks-causal": (True, "sinks"),
    "dropout": (False, dict(dropout_p=0.3)),
    "dropout-causal": (True, dict(dropout_p=0.7)),
}


def _rng_state(gen):
    """(seed, offset): a seed using both 32-bit words, an offset past 2^31."""
    return torch.tensor([int(torch.randint(1, 2**62, (1,), generator=gen)),
                         int(torch.randint(2**31, 2**32 - 8, (1,), generator=gen))])


@pytest.mark.parametrize("name", list(FEATURES))
def test_each_feature_matches_oracle(name, gen):
    """Each feature alone, GQA, a key length with several rounds and a partial last block."""
    causal, spec = FEATURES[name]
    q, k, v = make_qkv(2, 4, 2, 90, 600, 64, torch.float16, "BNSD", generator=gen)
    if spec == "head":
        variant = Variant(alibi_slopes=_slopes(4, gen).expand(2, 4))
    elif spec == "batch_head":
        variant = Variant(alibi_slopes=_slopes(4, gen, batch=2))
    elif spec == "sinks":
        variant = Variant(sinks=torch.randn(4, generator=gen) * 2)
    elif "dropout_p" in spec:
        variant = Variant(rng_state=_rng_state(gen), **spec)
    else:
        variant = Variant(**spec)
    _check(q, k, v, causal, variant, cores=3)


COMBINED = [(64, torch.float16), (128, torch.bfloat16), (256, torch.float16),
            (256, torch.bfloat16), (17, torch.float16), (80, torch.bfloat16)]


@pytest.mark.parametrize("head_dim,dtype", COMBINED, ids=lambda x: str(x).removeprefix("torch."))
def test_all_features_combined(head_dim, dtype, gen):
    """Window + causal + GQA + ALiBi + softcap + dropout + sinks at once, for head dims up
    to 256 and odd ones, fp16 and bf16; seqlen_q > seqlen_k, so early rows see no key."""
    q, k, v = make_qkv(2, 4, 2, 160, 130, head_dim, dtype, "BNSD", generator=gen)
    variant = Variant(window_left=45, softcap=20.0, alibi_slopes=_slopes(4, gen, batch=2),
                          dropout_p=0.25, rng_state=_rng_state(gen),
                          sinks=torch.randn(4, generator=gen))
    _check(q, k, v, True, variant, cores=2)


def test_key_padding_mask_and_bsnd_with_features(gen):
    """The features beside a key padding mask, in layout BSND."""
    q, k, v = make_qkv(2, 4, 2, 120, 300, 48, torch.bfloat16, "BSND", generator=gen)
    variant = Variant(window_left=80, window_right=10, softcap=15.0,
                          alibi_slopes=_slopes(4, gen), sinks=torch.randn(4, generator=gen))
    _check(q, k, v, False, variant, cores=3, mask=random_key_padding_mask(2, 300, gen),
           layout="BSND")


def test_rows_without_keys_give_zero_and_the_sink(gen):
    """A row that sees no key (here: a window of width 1 past the keys' end): out 0 and
    lse = the sink's logit, not -inf."""
    q, k, v = make_qkv(1, 2, 2, 64, 16, 64, torch.float16, "BNSD", generator=gen)
    sinks = torch.tensor([0.75, -2.5])
    out, lse = twin.forward(q, k, v, None, scale=0.125, causal=True, layout="BNSD",
                            variant=Variant(window_left=0, sinks=sinks), ai_cores=1)
    blind = torch.arange(64) < 48  # rows i with i + (16 - 64) < 0
    assert torch.equal(out[:, :, blind], torch.zeros_like(out[:, :, blind]))
    assert torch.equal(lse[0, :, blind], sinks.view(2, 1).expand(2, int(blind.sum())))


def test_window_skips_key_blocks_outside_the_band(gen):
    """Keys no row of any tile sees are never read: K and V there are NaN, and a visited
    block would carry NaN into the output (P = 0 times V = NaN)."""
    q, k, v = make_qkv(1, 2, 1, 128, 2048, 64, torch.float16, "BNSD", generator=gen)
    variant = Variant(window_left=100)
    # rows see keys [1920 + i - 100, 1920 + i]: every key before 1820 is outside the band
    k[:, :, :1792] = float("nan")
    v[:, :, :1792] = float("nan")
    out, lse = twin.forward(q, k, v, None, scale=0.125, causal=True, layout="BNSD",
                            variant=variant, ai_cores=2)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    k[:, :, :1792] = 0
    v[:, :, :1792] = 0
    _check(q, k, v, True, variant, cores=2)


def _all_features(heads, batch, gen):
    return Variant(window_left=70, window_right=30, softcap=10.0,
                       alibi_slopes=_slopes(heads, gen, batch=batch), dropout_p=0.2,
                       rng_state=_rng_state(gen), sinks=torch.randn(heads, generator=gen))


def test_batch_invariance(gen):
    """The same sequence alone and as element 3 of a batch of 7 (other tiles, another
    split over cores) gives identical bits: rounds lie on one key grid for every tile.
    (Dropout's counter holds the batch index: alone, the sequence is batch 0, so its
    rng_state offset is the batch's + 3, which draws the same mask.)"""
    q, k, v = make_qkv(7, 2, 1, 200, 600, 32, torch.float16, "BNSD", generator=gen)
    variant = _all_features(2, 7, gen)
    out, lse = twin.forward(q, k, v, None, scale=0.125, causal=False, layout="BNSD",
                            variant=variant)
    alone = dataclasses.replace(variant, alibi_slopes=variant.alibi_slopes[3:4].clone(),
                                rng_state=variant.rng_state + torch.tensor([0, 3]))
    out1, lse1 = twin.forward(q[3:4], k[3:4], v[3:4], None, scale=0.125, causal=False,
                              layout="BNSD", variant=alone)
    assert torch.equal(out[3:4].view(torch.int16), out1.view(torch.int16))
    assert torch.equal(lse[3:4].view(torch.int32), lse1.view(torch.int32))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_core_count_invariance(causal, gen):
    """1, 5 and 24 cores cut the rows into different tiles: the same bits."""
    q, k, v = make_qkv(2, 2, 2, 233, 700, 32, torch.bfloat16, "BNSD", generator=gen)
    variant = _all_features(2, 2, gen)
    if causal:
        variant = dataclasses.replace(variant, window_right=-1)
    runs = [twin.forward(q, k, v, None, scale=0.125, causal=causal, layout="BNSD",
                         variant=variant, ai_cores=cores) for cores in (1, 5, 24)]
    for out, lse in runs[1:]:
        assert torch.equal(out.view(torch.int16), runs[0][0].view(torch.int16))
        assert torch.equal(lse.view(torch.int32), runs[0][1].view(torch.int32))


def test_alibi_per_head_forms_agree(gen):
    """Slopes (heads_q,), their stride-0 (batch, heads_q) expansion and an explicit
    (batch, heads_q) copy select the same bias."""
    q, k, v = make_qkv(2, 4, 4, 70, 90, 32, torch.float16, "BNSD", generator=gen)
    slopes = _slopes(4, gen)
    runs = [twin.forward(q, k, v, None, scale=0.2, causal=False, layout="BNSD",
                         variant=Variant(alibi_slopes=s), ai_cores=2)
            for s in (slopes, slopes.expand(2, 4), slopes.expand(2, 4).clone())]
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])


@pytest.mark.parametrize("features,message", [
    (dict(window=(-2, -1)), "window bounds must be >= -1"),
    (dict(softcap=-1.0), "softcap must be finite and >= 0"),
    (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
])
def test_planner_names_what_it_cannot_plan(features, message):
    with pytest.raises(planner.PlanRefused, match=message):
        planner.plan("Ascend910B2", 1, 2, 64, 64, features=planner.variant(**features))


def test_every_feature_fits_at_head_dim_256():
    """The extra buffers (band template, ALiBi distances, Philox scratch) all fit beside a
    head_dim 256 tile, with causal and a key mask too."""
    features = planner.variant(window=(100, -1), softcap=30.0, dropout_p=0.1, alibi="batch_head",
                               sinks=True)
    plan = planner.plan("Ascend910B2", 2, 8, 4096, 256, causal=True, has_mask=True,
                        features=features)
    names = {b["name"] for b in plan["buffers"]}
    assert {"diag_ub", "alibi_ub", "philox_ub", "keep_ub"} <= names
    assert all(level["used"] <= level["capacity"] for level in plan["levels"])
