"""flash_cann.npu_fusion_attention over a grid of shapes and bounds, against a reference
written from torch_npu's documentation alone.

The reference (``documented_keep``) builds each sparse mode's visible (query, key)
pairs as op-plugin's docs/context/torch_npu-npu_fusion_attention.md draws and codes
them, as dense masks (True = masked out, as ``atten_mask``):

- mode 0: ``atten_mask`` OR the band outside [pre_tockens, next_tockens] from the top
  left, as the doc's example builds it: ``triu(ones, next + 1) | tril(ones, -pre - 1)``;
- mode 1: ``atten_mask`` alone (pre/next ignored);
- mode 2 (leftUpCausal): the compressed mask's top-left corner, ``triu(ones, 1)``;
- mode 3 (rightDownCausal): the same triangle anchored at the bottom-right corner,
  ``triu(ones, 1 + S2 - S1)``;
- mode 4 (band, "参数起点为右下角"): the top-left band shifted by S2 - S1:
  ``triu(ones, next + 1 + S2 - S1) | tril(ones, -pre - 1 + S2 - S1)``;
- modes 7 / 8 (TND): 3 / 2 for every sequence except the last / first, which takes
  the mode-4 band (the doc's cut long sequence).

Attention is then computed in float64 with a sink as the doc's sink example does it
(one extra logit column per head, softmax, the column dropped). Nothing here uses
flash_cann.api.fusion_masks. The grid: S1 < S2, S1 = S2, S2 < S1 < 2 * S2, S1 = 2 * S2
and S1 > 2 * S2; pre/next tokens 0, +-1, S1, S2 and 2^31 - 1; forward (out, lse) and
gradients (query, key, value, sink); a band (pre/next) that leaves nothing visible must be
refused, a full mask that does gives rows of 0.
"""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann
from test_npu_fusion_attention import to_bnsd

NO_BAND = 2**31 - 1
COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
SHAPES = [(3, 7), (5, 5), (7, 5), (8, 4), (10, 4)]  # (S1, S2): <, =, (S2, 2 S2), 2 S2, > 2 S2
HEADS_Q, HEADS_KV, HEAD_DIM, SCALE = 2, 1, 4, 0.5


def bounds(seqlen_q, seqlen_k):
    """pre/next tokens inside, at and past the matrix."""
    return sorted({0, 1, -1, seqlen_q, seqlen_k, NO_BAND})


def documented_keep(mode, seqlen_q, seqlen_k, pre=NO_BAND, nxt=NO_BAND, atten_mask=None):
    """(S1, S2) bool, True = the score takes part, as torch_npu documents the mode."""
    ones = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)

    def band_mask(pre, nxt, shift=0):  # the doc's example, clamped to int64-safe offsets
        upper, lower = min(nxt + 1 + shift, seqlen_k), max(-pre - 1 + shift, -seqlen_q)
        return torch.triu(ones, upper) | torch.tril(ones, lower)

    if mode == 0:
        masked = atten_mask.bool() | band_mask(pre, nxt)
    elif mode == 1:
        masked = atten_mask.bool()
    elif mode == 2:
        masked = torch.triu(ones, 1)
    elif mode == 3:
        masked = torch.triu(ones, 1 + seqlen_k - seqlen_q)
    else:
        masked = band_mask(pre, nxt, seqlen_k - seqlen_q)
    return ~masked


def reference(q, k, v, keep, scale, sink=None):
    """BNSD float64 attention over ``keep`` ((S1, S2) or broadcastable (B, 1, S1, S2)),
    with the doc's sink: (out, lse). Rows that see nothing: out 0, lse -inf (or sink)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~keep, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0, lse).unsqueeze(-1))
    if sink is not None:
        p = p[..., :-1]
    return p @ v, lse


def _leaves(gen, batch, seqlen_q, seqlen_k, sink):
    q = torch.randn(batch, HEADS_Q, seqlen_q, HEAD_DIM, generator=gen)
    k, v = (torch.randn(batch, HEADS_KV, seqlen_k, HEAD_DIM, generator=gen) for _ in range(2))
    tensors = [q, k, v] + ([torch.randn(HEADS_Q, generator=gen)] if sink else [])
    return tensors


def check_batched(gen, mode, seqlen_q, seqlen_k, pre, nxt, atten_mask=None, sink=False,
                  layout="BNSD", batch=2):
    """One call against the reference: out, lse and the gradients of a random loss on out
    (and on lse where finite), or, for a band that leaves nothing visible, a refusal."""
    keep = documented_keep(mode, seqlen_q, seqlen_k, pre, nxt,
                           None if atten_mask is None else atten_mask)
    leaves = _leaves(gen, batch, seqlen_q, seqlen_k, sink)
    mask_arg = atten_mask if mode in (0, 1) else COMPRESSED
    if mask_arg is not None and mask_arg.dim() == 4:
        keep = keep.unsqueeze(1) if keep.dim() == 3 else keep
    what = f"mode={mode} S1={seqlen_q} S2={seqlen_k} pre={pre} next={nxt} {layout}"
    tensors = [t.clone().requires_grad_() for t in leaves]
    q, k, v = (to_layout(t, layout) for t in tensors[:3])
    call = dict(atten_mask=mask_arg, scale=SCALE, sparse_mode=mode, pre_tockens=pre,
                next_tockens=nxt, sink=tensors[3] if sink else None)
    if not bool(keep.any()) and mode not in (0, 1):  # a full mask may hide everything
        with pytest.raises(ValueError, match="tockens|atten_mask|empty"):
            flash_cann.npu_fusion_attention(q, k, v, HEADS_Q, layout, **call)
        return
    out, softmax_max, softmax_sum = flash_cann.npu_fusion_attention(
        q, k, v, HEADS_Q, layout, **call)[:3]
    exact = [t.detach().double().requires_grad_() for t in leaves]
    ref, lse = reference(*exact[:3], keep, SCALE, exact[3] if sink else None)
    out = to_bnsd(out, layout, HEADS_Q)
    assert torch.allclose(out.double(), ref, atol=2e-5), what
    got_lse = softmax_max[..., 0] + torch.log(softmax_sum[..., 0])
    assert torch.allclose(got_lse.double(), lse, atol=2e-5), what
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    finite = torch.isfinite(lse)
    weight = torch.randn(lse.shape, generator=gen, dtype=torch.float64) * finite
    grads = torch.autograd.grad((out.double() * upstream).sum()
                                + (torch.where(finite, got_lse.double(), 0) * weight).sum(),
                                tensors)
    ref_grads = torch.autograd.grad((ref * upstream).sum() + (torch.where(
        finite, lse, 0) * weight).sum(), exact, allow_unused=True)
    for name, grad, ref_grad in zip("qkvs", grads, ref_grads):
        ref_grad = torch.zeros_like(grad.double()) if ref_grad is None else ref_grad
        assert torch.allclose(grad.double(), ref_grad, atol=1e-4), f"d{name}: {what}"


def to_layout(t, layout):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.transpose(1, 2).flatten(-2)
    return t.permute(2, 0, 1, 3).flatten(-2)  # SBH


# The cases, in every layout: left-up causal, a full top-left causal mask and a
# band whose next_tockens lies in [S2, S1 - 1), all with S1 >= 2 * S2.
@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
@pytest.mark.parametrize("seqlens", [(8, 4), (10, 4), (11, 3)])
def test_split_rows_when_s1_is_twice_s2(gen, layout, seqlens):
    seqlen_q, seqlen_k = seqlens
    causal = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).triu(1)
    check_batched(gen, 2, seqlen_q, seqlen_k, NO_BAND, NO_BAND, layout=layout)
    check_batched(gen, 0, seqlen_q, seqlen_k, NO_BAND, NO_BAND, atten_mask=causal, layout=layout)
    check_batched(gen, 1, seqlen_q, seqlen_k, NO_BAND, NO_BAND, atten_mask=causal, layout=layout)
    for nxt in range(seqlen_k, seqlen_q):
        check_batched(gen, 4, seqlen_q, seqlen_k, 1, nxt, layout=layout)
        check_batched(gen, 4, seqlen_q, seqlen_k, NO_BAND, nxt, layout=layout, sink=True)


@pytest.mark.parametrize("seqlens", SHAPES)
def test_band_mode_grid(gen, seqlens):
    """sparse_mode 4 at every pair of the bounds."""
    seqlen_q, seqlen_k = seqlens
    for pre in bounds(*seqlens):
        for nxt in bounds(*seqlens):
            check_batched(gen, 4, seqlen_q, seqlen_k, pre, nxt)


@pytest.mark.parametrize("seqlens", SHAPES)
def test_default_mask_grid(gen, seqlens):
    """sparse_mode 0: a full mask consistent with pre/next (the doc's band), at every pair
    of the bounds; and a top-left causal mask with key padding under the defaults."""
    seqlen_q, seqlen_k = seqlens
    ones = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    for pre in bounds(*seqlens):
        for nxt in bounds(*seqlens):
            mask = torch.triu(ones, min(nxt + 1, seqlen_k)) | torch.tril(ones, max(-pre - 1,
                                                                                 -seqlen_q))
            check_batched(gen, 0, seqlen_q, seqlen_k, pre, nxt, atten_mask=mask)
    padded = torch.zeros(2, 1, 1, seqlen_k, dtype=torch.bool)
    padded[1, ..., -1] = True
    mask = torch.triu(ones, 1) | padded
    check_batched(gen, 0, seqlen_q, seqlen_k, NO_BAND, NO_BAND, atten_mask=mask)


@pytest.mark.parametrize("seqlens", SHAPES)
def test_other_modes_grid(gen, seqlens):
    """sparse_mode 1 (full masks: top-left causal, bottom-right causal, bands) and 2 / 3
    (pre/next ignored: every bound given must change nothing), with and without sink."""
    seqlen_q, seqlen_k = seqlens
    ones = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    for mask in (torch.triu(ones, 1), torch.triu(ones, 1 + seqlen_k - seqlen_q),
                 torch.triu(ones, 2) | torch.tril(ones, -2)):
        if bool((~mask).any()):
            check_batched(gen, 1, seqlen_q, seqlen_k, 0, 0, atten_mask=mask)
    for mode in (2, 3):
        for bound in bounds(*seqlens):
            check_batched(gen, mode, seqlen_q, seqlen_k, bound, -bound if bound < NO_BAND else 0,
                          sink=bound == 1)


# TND: one batch holds every shape class; modes 7 and 8 take the band in the last / first
# sequence.
TND_Q, TND_K = [3, 5, 7, 8, 10], [7, 5, 5, 4, 4]


def _tnd_reference(leaves, mode, pre, nxt, sink):
    outs, lses, row, col = [], [], 0, 0
    q, k, v = leaves[:3]
    for b, (sq, sk) in enumerate(zip(TND_Q, TND_K)):
        seq_mode = {7: 4 if b == len(TND_Q) - 1 else 3, 8: 4 if b == 0 else 2}.get(mode, mode)
        view = [t[r:r + n].transpose(0, 1).unsqueeze(0)
                for t, r, n in ((q, row, sq), (k, col, sk), (v, col, sk))]
        out, lse = reference(*view, documented_keep(seq_mode, sq, sk, pre, nxt), SCALE,
                             leaves[3] if sink else None)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0].transpose(0, 1))
        row, col = row + sq, col + sk
    return torch.cat(outs), torch.cat(lses)


def check_tnd(gen, mode, pre, nxt, sink=False):
    leaves = [torch.randn(sum(TND_Q), HEADS_Q, HEAD_DIM, generator=gen),
              *(torch.randn(sum(TND_K), HEADS_KV, HEAD_DIM, generator=gen) for _ in range(2))]
    if sink:
        leaves.append(torch.randn(HEADS_Q, generator=gen))
    exact = [t.double().requires_grad_() for t in leaves]
    ref, lse = _tnd_reference(exact, mode, pre, nxt, sink)
    tensors = [t.clone().requires_grad_() for t in leaves]
    call = dict(atten_mask=COMPRESSED, scale=SCALE, sparse_mode=mode, pre_tockens=pre,
                next_tockens=nxt, actual_seq_qlen=torch.tensor(TND_Q).cumsum(0).tolist(),
                actual_seq_kvlen=torch.tensor(TND_K).cumsum(0).tolist(),
                sink=tensors[3] if sink else None)
    what = f"TND mode={mode} pre={pre} next={nxt}"
    last = len(TND_Q) - 1
    seen = [bool(documented_keep({7: 4 if b == last else 3, 8: 4 if b == 0 else 2}.get(
        mode, mode), sq, sk, pre, nxt).any()) for b, (sq, sk) in enumerate(zip(TND_Q, TND_K))]
    if not all(seen):  # a sequence's band leaves nothing visible
        with pytest.raises(ValueError, match="tockens|empty"):
            flash_cann.npu_fusion_attention(*tensors[:3], HEADS_Q, "TND", **call)
        return
    out, softmax_max = flash_cann.npu_fusion_attention(*tensors[:3], HEADS_Q, "TND", **call)[:2]
    assert torch.allclose(out.double(), ref, atol=2e-5), what
    assert torch.allclose(softmax_max[..., 0].double(), lse, atol=2e-5), what
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * upstream).sum(), tensors)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), exact)
    for name, grad, ref_grad in zip("qkvs", grads, ref_grads):
        assert torch.allclose(grad.double(), ref_grad, atol=1e-4), f"d{name}: {what}"


@pytest.mark.parametrize("mode", [2, 3, 4, 7, 8])
def test_tnd_grid(gen, mode):
    if mode in (2, 3):
        check_tnd(gen, mode, NO_BAND, NO_BAND)
        check_tnd(gen, mode, 1, -1, sink=True)  # pre/next ignored
        return
    values = sorted({0, 1, -1, 4, 7, NO_BAND})
    for pre in values:
        for nxt in values:
            check_tnd(gen, mode, pre, nxt)
    check_tnd(gen, mode, NO_BAND, 5, sink=True)


def test_left_bound_at_and_past_the_matrix_is_no_bound(gen):
    """The left side has no case like the right's: d >= -(S2 - 1) always, so pre_tockens
    from S2 - 1 on changes nothing (checked at S1 >= 2 * S2 and S1 < S2)."""
    for seqlen_q, seqlen_k in ((10, 4), (3, 7)):
        for pre in (seqlen_k - 2, seqlen_k - 1, seqlen_k, seqlen_q, NO_BAND):
            check_batched(gen, 4, seqlen_q, seqlen_k, pre, 0)


# npu_fusion_attention_grad at the grid's edges: the same gradients as autograd through
# the forward, from the forward's saved statistics (flash_cann's pair, or Huawei's
# genuine row max and sum) and output.
GRAD_CASES = [
    pytest.param("BNSD", 2, (10, 4), NO_BAND, NO_BAND, False, 1.0, id="mode2-split"),
    pytest.param("SBH", 4, (10, 4), 1, 5, True, 1.0, id="mode4-split-sink"),
    pytest.param("BSND", 4, (7, 5), 3, -1, False, 1.0, id="mode4-dropped-keys"),
    pytest.param("BSH", 4, (7, 5), -2, 4, True, 1.0, id="mode4-unseen-rows-sink"),
    pytest.param("BNSD", 3, (7, 5), NO_BAND, NO_BAND, True, 0.8, id="mode3-dropout-sink"),
    pytest.param("BNSD", 0, (8, 4), NO_BAND, NO_BAND, False, 1.0, id="mode0-causal-padding"),
    pytest.param("TND", 7, None, 7, -1, False, 1.0, id="tnd-mode7"),
    pytest.param("TND", 8, None, NO_BAND, 5, True, 0.7, id="tnd-mode8-dropout-sink"),
]


def _grad_inputs(gen, layout, mode, seqlens, sink):
    if layout == "TND":
        tensors = [torch.randn(sum(TND_Q), HEADS_Q, HEAD_DIM, generator=gen),
                   *(torch.randn(sum(TND_K), HEADS_KV, HEAD_DIM, generator=gen)
                     for _ in range(2))]
        extra = dict(actual_seq_qlen=torch.tensor(TND_Q).cumsum(0).tolist(),
                     actual_seq_kvlen=torch.tensor(TND_K).cumsum(0).tolist())
    else:
        seqlen_q, seqlen_k = seqlens
        tensors = [to_layout(t, layout) for t in _leaves(gen, 2, seqlen_q, seqlen_k, False)]
        extra = {}
    if mode == 0:
        ones = torch.ones(*seqlens, dtype=torch.bool)
        padded = torch.zeros(2, 1, 1, seqlens[1], dtype=torch.bool)
        padded[0, ..., -1] = True
        extra["atten_mask"] = torch.triu(ones, 1) | padded
    else:
        extra["atten_mask"] = COMPRESSED
    if sink:
        extra["sink"] = torch.randn(HEADS_Q, generator=gen)
    return tensors, extra


@pytest.mark.parametrize("layout,mode,seqlens,pre,nxt,sink,keep_prob", GRAD_CASES)
def test_grad_matches_autograd_of_the_forward(gen, layout, mode, seqlens, pre, nxt, sink,
                                              keep_prob):
    tensors, extra = _grad_inputs(gen, layout, mode, seqlens, sink)
    leaves = [t.clone().requires_grad_() for t in tensors]
    if sink:
        extra["sink"] = extra["sink"].clone().requires_grad_()
    args = dict(scale=SCALE, keep_prob=keep_prob, pre_tockens=pre, next_tockens=nxt,
                sparse_mode=mode, **extra)
    out, softmax_max, softmax_sum, softmax_in, seed, offset, numels = \
        flash_cann.npu_fusion_attention(*leaves, HEADS_Q, layout, **args)
    dy = torch.randn(out.shape, generator=gen)
    wrt = leaves + ([extra["sink"]] if sink else [])
    expected = torch.autograd.grad((out * dy).sum(), wrt)
    args["scale_value"] = args.pop("scale")
    grads = flash_cann.npu_fusion_attention_grad(
        *tensors, dy, HEADS_Q, layout, softmax_max=softmax_max, softmax_sum=softmax_sum,
        softmax_in=softmax_in, attention_in=out.detach(), seed=seed, offset=offset,
        numels=numels, **{**args, "sink": extra["sink"].detach() if sink else None})
    assert len(grads) == (5 if sink else 4) and grads[3].numel() == 0
    for name, grad, ref in zip(("dq", "dk", "dv", "dsink"), grads[:3] + grads[4:], expected):
        assert grad.shape == ref.shape, name
        assert torch.allclose(grad, ref, atol=1e-5), name
    if layout != "TND" and keep_prob == 1.0:  # Huawei's genuine pair: the row max and sum
        lse = softmax_max[..., 0].double()
        row_max = lse - torch.rand(lse.shape, generator=gen, dtype=torch.float64)
        genuine = [x.float().unsqueeze(-1).expand(*x.shape, 8)
                   for x in (row_max, torch.exp(lse - row_max))]
        again = flash_cann.npu_fusion_attention_grad(
            *tensors, dy, HEADS_Q, layout, softmax_max=genuine[0], softmax_sum=genuine[1],
            attention_in=out.detach(), seed=seed, offset=offset,
            **{**args, "sink": extra["sink"].detach() if sink else None})
        for grad, ref in zip(again[:3], expected):
            assert torch.allclose(grad, ref, atol=1e-4)


def test_grad_refusals_name_the_argument(gen):
    tensors, extra = _grad_inputs(gen, "BNSD", 3, (5, 5), False)
    out, softmax_max, softmax_sum = flash_cann.npu_fusion_attention(
        *tensors, HEADS_Q, "BNSD", sparse_mode=3, **extra)[:3]
    base = dict(softmax_max=softmax_max, softmax_sum=softmax_sum, attention_in=out,
                sparse_mode=3, **extra)
    for change, name in ((dict(attention_in=None), "attention_in"),
                         (dict(softmax_max=softmax_max[..., :3]), "softmax_max"),
                         (dict(softmax_in=torch.ones(3)), "softmax_in"),
                         (dict(pse=torch.ones(1)), "pse"),
                         (dict(seed=1.5), "seed")):
        with pytest.raises((ValueError, TypeError, NotImplementedError), match=name):
            flash_cann.npu_fusion_attention_grad(*tensors, out, HEADS_Q, "BNSD",
                                                 **{**base, **change})
    with pytest.raises(ValueError, match="dy"):
        flash_cann.npu_fusion_attention_grad(*tensors, out[:, :1], HEADS_Q, "BNSD", **base)


def test_v3_takes_tensor_lengths_and_returns_tensors(gen):
    tensors, extra = _grad_inputs(gen, "TND", 8, None, True)
    lengths = {name: torch.tensor(extra.pop(name), dtype=torch.int64)
               for name in ("actual_seq_qlen", "actual_seq_kvlen")}
    v1 = flash_cann.npu_fusion_attention(*tensors, HEADS_Q, "TND", sparse_mode=8, pre_tockens=7,
                                         next_tockens=1, **extra,
                                         **{n: t.tolist() for n, t in lengths.items()})
    v3 = flash_cann.npu_fusion_attention_v3(*tensors, HEADS_Q, "TND", sparse_mode=8,
                                            pre_tockens=7, next_tockens=1, **extra, **lengths)
    assert len(v3) == 6 and all(isinstance(t, torch.Tensor) for t in v3)
    for a, b in zip(v1[:3], v3[:3]):
        assert torch.equal(a, b)
    assert v3[4].dtype == torch.int64 and int(v3[4]) == v1[4] and int(v3[5]) == v1[5]
    with pytest.raises(TypeError, match="actual_seq_qlen"):
        flash_cann.npu_fusion_attention_v3(*tensors, HEADS_Q, "TND", **extra,
                                           actual_seq_qlen=lengths["actual_seq_qlen"].float(),
                                           actual_seq_kvlen=lengths["actual_seq_kvlen"])


def test_sink_is_the_docs_extra_logit_column(gen):
    """torch_npu's doc example: scores with one sink column per head, softmax, the column
    dropped -- no mask; and rows that see no key have lse = sink."""
    q, k, v, sink = _leaves(gen, 2, 6, 6, True)
    out, softmax_max = flash_cann.npu_fusion_attention(q, k, v, HEADS_Q, "BNSD", scale=SCALE,
                                                       sink=sink)[:2]
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) * SCALE).double()
    probs = torch.softmax(torch.cat([scores, sink.double().view(1, -1, 1, 1).expand(
        2, HEADS_Q, 6, 1)], -1), -1)[..., :-1]
    assert torch.allclose(out.double(), probs @ v.repeat_interleave(2, 1).double(), atol=2e-5)
    # mode 4 with pre_tockens = -2: the last 2 rows see no key
    out, softmax_max = flash_cann.npu_fusion_attention(
        q, k, v, HEADS_Q, "BNSD", scale=SCALE, sink=sink, atten_mask=COMPRESSED,
        sparse_mode=4, pre_tockens=-2, next_tockens=3)[:2]
    assert torch.equal(softmax_max[:, :, -2:, 0], sink.view(1, -1, 1).expand(2, -1, 2))
    assert not out[:, :, -2:].any()


def test_grad_sink_counts_rows_that_see_no_key(gen):
    """d sink = -sum over every row of P_sink * D, D = rowsum(dy * attention_in): rows this
    call hides from every key count too (their P_sink = exp(sink - lse) = 1), which
    matters when attention_in is a ring attention's merged output, not this call's 0."""
    tensors, extra = _grad_inputs(gen, "BNSD", 4, (7, 5), True)
    args = dict(sparse_mode=4, pre_tockens=-2, next_tockens=4, **extra)
    out, softmax_max, softmax_sum = flash_cann.npu_fusion_attention(
        *tensors, HEADS_Q, "BNSD", scale=SCALE, **args)[:3]
    dy = torch.randn(out.shape, generator=gen)
    call = dict(softmax_max=softmax_max, softmax_sum=softmax_sum, scale_value=SCALE, **args)
    plain = flash_cann.npu_fusion_attention_grad(*tensors, dy, HEADS_Q, "BNSD",
                                                 attention_in=out, **call)
    merged = out.clone()
    merged[:, :, -2:] = torch.randn(merged[:, :, -2:].shape, generator=gen)
    ring = flash_cann.npu_fusion_attention_grad(*tensors, dy, HEADS_Q, "BNSD",
                                                attention_in=merged, **call)
    share = (dy[:, :, -2:] * merged[:, :, -2:]).sum(-1).sum((0, 2))
    assert torch.allclose(ring[4], plain[4] - share, atol=1e-5)


def test_every_backend_declares_what_the_translation_uses():
    """docs/migration.md says every mapped mode reaches every backend: each backend of the
    spec must declare the features the translation produces (a window, dropout, TND's
    varlen, sinks), else that statement is wrong."""
    from flash_cann.contract.spec import load

    for name, backend in load().backends.items():
        missing = {"window", "dropout", "varlen", "sinks"} - set(backend.features)
        assert not missing, f"{name} lacks {missing}: update docs/migration.md"
