"""flash_cann.npu_fusion_attention: torch_npu's signature, outputs and sparse modes.

The oracle here is written from Huawei's documented definitions (op-plugin
docs/context/torch_npu-npu_fusion_attention.md), not from flash_cann's translation:
each mode's visible (query, key) pairs are built densely, attention is computed in
float64 over them, and the translation (window, causal, key padding, dropped keys,
one call per run of TND sequences) must reproduce it.
"""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann
from flash_cann.contract.variant import keep_mask

from conftest import make_qkv

NO_BAND = 2147483647
COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # sparse_mode 2-4, 7, 8


def huawei_visible(mode, seqlen_q, seqlen_k, pre=NO_BAND, nxt=NO_BAND, atten_mask=None):
    """(…, S1, S2) bool, True = the score takes part, as Huawei documents each mode."""
    i = torch.arange(seqlen_q).view(-1, 1)
    j = torch.arange(seqlen_k).view(1, -1)
    bottom_right = j - i - (seqlen_k - seqlen_q)
    if mode == 0:
        return ~atten_mask.bool() & (j - i >= -pre) & (j - i <= nxt)
    if mode == 1:
        return ~atten_mask.bool()
    if mode == 2:
        return j <= i
    if mode == 3:
        return bottom_right <= 0
    return (bottom_right >= -pre) & (bottom_right <= nxt)  # 4, and 7/8's cut sequence


def dense_attention(q, k, v, visible, scale, keep=None, keep_prob=1.0):
    """BNSD float64 attention over an explicit visibility mask: (out, lse). Rows that see
    nothing give 0 and -inf."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0, lse).unsqueeze(-1))
    if keep is not None:
        p = p * keep / keep_prob
    return p @ v, lse


def to_bnsd(t, layout, heads):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.unflatten(-1, (heads, -1)).transpose(1, 2)
    return t.unflatten(-1, (heads, -1)).permute(1, 2, 0, 3)  # SBH


def qkv(gen, layout, batch=2, heads_q=4, heads_kv=2, seqlen_q=6, seqlen_k=9, head_dim=8):
    fmt = "BSH" if layout in ("BSH", "SBH") else layout
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, torch.float32,
                       fmt, generator=gen)
    if layout == "SBH":
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    return q, k, v


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_layouts_match_the_oracle_with_gradients(gen, layout):
    q, k, v = qkv(gen, layout)
    tensors = [t.requires_grad_() for t in (q, k, v)]
    out, softmax_max, softmax_sum, softmax_out, seed, offset, numels = \
        flash_cann.npu_fusion_attention(*tensors, 4, layout, atten_mask=COMPRESSED,
                                        scale=0.35, sparse_mode=3)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert softmax_max.shape == softmax_sum.shape == (2, 4, 6, 8)
    assert softmax_max.dtype == softmax_sum.dtype == torch.float32
    assert softmax_out.numel() == 0 and (seed, offset, numels) == (0, 0, 2 * 4 * 6 * 9)
    bnsd = [to_bnsd(t.detach().double(), layout, h).requires_grad_()
            for t, h in zip(tensors, (4, 2, 2))]
    ref, lse = dense_attention(*bnsd, huawei_visible(3, 6, 9), 0.35)
    assert torch.allclose(to_bnsd(out, layout, 4).double(), ref, atol=2e-5)
    assert torch.allclose(softmax_max[..., 0].double(), lse, atol=2e-5)
    # softmax_max is the logsumexp: a loss may use it, and its gradient is lse's.
    upstream = torch.randn(out.shape, generator=gen)
    lse_weight = torch.randn(lse.shape, generator=gen)
    grads = torch.autograd.grad((out * upstream).sum() + (softmax_max[..., 0] * lse_weight).sum(),
                                tensors)
    ref_grads = torch.autograd.grad((ref * to_bnsd(upstream, layout, 4).double()).sum()
                                    + (lse * lse_weight.double()).sum(), bnsd)
    for grad, ref_grad, heads in zip(grads, ref_grads, (4, 2, 2)):
        assert torch.allclose(to_bnsd(grad, layout, heads).double(), ref_grad, atol=5e-5)


def _dense_masks(mode, batch, seqlen_q, seqlen_k, gen):
    """A full atten_mask flash_cann can express: sparse_mode 0 a top-left band (with
    pre/next) and key padding, 1 a bottom-right causal mask and key padding."""
    i = torch.arange(seqlen_q).view(-1, 1)
    j = torch.arange(seqlen_k).view(1, -1)
    padded = torch.rand(batch, 1, 1, seqlen_k, generator=gen) < 0.3
    padded[..., 0] = False
    if mode == 0:
        return padded | (j - i > 1) | (i - j > 2), (2, 1)
    return padded | (j - i > seqlen_k - seqlen_q), (NO_BAND, NO_BAND)


# Modes 2 and 3 ignore pre/next (given as (1, 1) to show it). Mode 4's bands: a right
# edge left of the diagonal (drops keys), a left edge right of it (drops the last query
# rows), and an ordinary window.
# (10, 4): S1 >= 2 * S2, where mode 2's right bound S1 - S2 >= S2 splits the rows
# (fusion_masks); tests/test_npu_fusion_attention_grid.py has the whole grid.
@pytest.mark.parametrize("seqlens", [(6, 9), (9, 6), (7, 7), (10, 4)])
@pytest.mark.parametrize("mode,band", [(0, None), (1, None), (2, (1, 1)), (3, (1, 1)),
                                       (4, (3, -1)), (4, (-2, 4)), (4, (1, 2))])
def test_sparse_modes_match_the_oracle(gen, mode, band, seqlens):
    seqlen_q, seqlen_k = seqlens
    q, k, v = qkv(gen, "BNSD", seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    if mode in (0, 1):
        atten_mask, (pre, nxt) = _dense_masks(mode, 2, seqlen_q, seqlen_k, gen)
    else:
        atten_mask, (pre, nxt) = COMPRESSED, band
    out, softmax_max, softmax_sum = flash_cann.npu_fusion_attention(
        q, k, v, 4, "BNSD", atten_mask=atten_mask, scale=0.4, sparse_mode=mode,
        pre_tockens=pre, next_tockens=nxt)[:3]
    visible = huawei_visible(mode, seqlen_q, seqlen_k, pre, nxt, atten_mask)
    ref, lse = dense_attention(q, k, v, visible, 0.4)
    assert torch.allclose(out.double(), ref, atol=2e-5)
    # flash_cann's pair: softmax_max = lse, softmax_sum = 1, so max + log(sum) = lse.
    combined = softmax_max + torch.log(softmax_sum)
    assert torch.allclose(combined[..., 0].double(), lse, atol=2e-5)
    assert torch.equal(combined, combined[..., :1].expand_as(combined))


def test_masks_map_onto_flash_cann_arguments(gen):
    """A causal + key padding atten_mask (1 = masked out) is flash_cann's causal with
    key_padding_mask (True = attend): the same call, bit for bit."""
    q, k, v = qkv(gen, "BSND", seqlen_q=5, seqlen_k=8)
    attend = torch.rand(2, 8, generator=gen) < 0.7
    attend[:, -1] = True
    i, j = torch.arange(5).view(-1, 1), torch.arange(8).view(1, -1)
    atten_mask = ~attend.view(2, 1, 1, 8) | (j - i > 3)
    out, softmax_max = flash_cann.npu_fusion_attention(q, k, v, 4, "BSND", atten_mask=atten_mask,
                                                       scale=0.3, sparse_mode=1)[:2]
    ref, lse = flash_cann.attention(q, k, v, layout="BSND", causal=True, scale=0.3,
                                    key_padding_mask=attend, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(softmax_max[..., 0], lse)


def _tnd(gen, lengths_q, lengths_k, heads_q=4, heads_kv=2, head_dim=8):
    q = torch.randn(sum(lengths_q), heads_q, head_dim, generator=gen)
    k, v = (torch.randn(sum(lengths_k), heads_kv, head_dim, generator=gen) for _ in range(2))
    cumulative = [list(torch.tensor(x).cumsum(0).tolist()) for x in (lengths_q, lengths_k)]
    return q, k, v, *cumulative


def _tnd_oracle(q, k, v, lengths_q, lengths_k, mode, pre, nxt, scale, keeps=None,
                keep_prob=1.0):
    """Per sequence: mode 7 is 3 but the last sequence takes the band, 8 is 2 but the
    first does (Huawei's cut long sequence)."""
    outs, lses, row, col = [], [], 0, 0
    for b, (sq, sk) in enumerate(zip(lengths_q, lengths_k)):
        seq_mode = {7: 4 if b == len(lengths_q) - 1 else 3, 8: 4 if b == 0 else 2}.get(mode, mode)
        view = [t[r:r + n].transpose(0, 1).unsqueeze(0)
                for t, r, n in ((q, row, sq), (k, col, sk), (v, col, sk))]
        out, lse = dense_attention(*view, huawei_visible(seq_mode, sq, sk, pre, nxt), scale,
                                   None if keeps is None else keeps[b], keep_prob)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0].transpose(0, 1))
        row, col = row + sq, col + sk
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("mode,pre,nxt", [(2, NO_BAND, NO_BAND), (3, NO_BAND, NO_BAND),
                                          (4, 2, 0), (4, -1, 2), (7, 6, -2), (8, 4, 1)])
def test_tnd_sparse_modes_match_the_oracle(gen, mode, pre, nxt):
    lengths_q, lengths_k = [3, 5, 2], [4, 5, 6]  # S1 > S2, ==, < (mode 2 drops keys)
    q, k, v, cu_q, cu_k = _tnd(gen, lengths_q, lengths_k)
    tensors = [t.requires_grad_() for t in (q, k, v)]
    out, softmax_max, softmax_sum, _, _, _, numels = flash_cann.npu_fusion_attention(
        *tensors, 4, "TND", atten_mask=COMPRESSED, scale=0.3, sparse_mode=mode,
        pre_tockens=pre, next_tockens=nxt, actual_seq_qlen=cu_q, actual_seq_kvlen=cu_k)
    assert softmax_max.shape == (10, 4, 8) and numels == 4 * (12 + 25 + 12)
    leaves = [t.detach().double().requires_grad_() for t in tensors]
    ref, lse = _tnd_oracle(*leaves, lengths_q, lengths_k, mode, pre, nxt, 0.3)
    assert torch.allclose(out.double(), ref, atol=2e-5)
    assert torch.allclose(softmax_max[..., 0].double(), lse, atol=2e-5)
    upstream = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * upstream).sum(), tensors)
    ref_grads = torch.autograd.grad((ref * upstream.double()).sum(), leaves)
    for grad, ref_grad in zip(grads, ref_grads):
        assert torch.allclose(grad.double(), ref_grad, atol=5e-5)


@pytest.mark.parametrize("mode", [2, 3])
def test_tnd_sequences_without_queries(gen, mode):
    """Huawei allows a sequence with no query rows (actual_seq_qlen repeats a value)."""
    lengths_q, lengths_k = [3, 0, 4, 0], [4, 2, 6, 3]
    q, k, v, cu_q, cu_k = _tnd(gen, lengths_q, lengths_k)
    out, softmax_max = flash_cann.npu_fusion_attention(
        q, k, v, 4, "TND", atten_mask=COMPRESSED, scale=0.3, sparse_mode=mode,
        actual_seq_qlen=cu_q, actual_seq_kvlen=cu_k)[:2]
    ref, lse = _tnd_oracle(q, k, v, lengths_q, lengths_k, mode, NO_BAND, NO_BAND, 0.3)
    assert torch.allclose(out.double(), ref, atol=2e-5)
    assert torch.allclose(softmax_max[..., 0].double(), lse, atol=2e-5)


def test_dropout_is_flash_cann_philox_reproducible_by_seed(gen):
    """keep_prob < 1: dropout_p = 1 - keep_prob with flash_cann's Philox mask, whose seed
    is returned; torch.manual_seed repeats the call. TND runs of sequences (mode 2 here
    splits the batch into three calls) draw what one call would: the oracle applies
    the mask of each sequence's global index."""
    lengths_q, lengths_k = [3, 4, 2], [3, 6, 2]
    q, k, v, cu_q, cu_k = _tnd(gen, lengths_q, lengths_k)
    args = dict(atten_mask=COMPRESSED, scale=0.3, keep_prob=0.7, sparse_mode=2,
                actual_seq_qlen=cu_q, actual_seq_kvlen=cu_k)
    torch.manual_seed(5)
    first = flash_cann.npu_fusion_attention(q, k, v, 4, "TND", **args)
    torch.manual_seed(5)
    second = flash_cann.npu_fusion_attention(q, k, v, 4, "TND", **args)
    assert torch.equal(first[0], second[0]) and first[4:6] == second[4:6]
    seed, offset = first[4:6]
    assert seed != 0 and offset == 0
    rng_state = torch.tensor([seed, offset])
    keeps = [keep_mask(rng_state, 0.3, b, torch.arange(4).view(-1, 1, 1),
                       torch.arange(sq).view(-1, 1), torch.arange(sk))
             for b, (sq, sk) in enumerate(zip(lengths_q, lengths_k))]
    ref, _ = _tnd_oracle(q, k, v, lengths_q, lengths_k, 2, NO_BAND, NO_BAND, 0.3, keeps, 0.7)
    assert torch.allclose(first[0].double(), ref, atol=2e-5)


def test_batched_dropout_seed_drives_flash_cann_op(gen):
    q, k, v = qkv(gen, "BSND")
    torch.manual_seed(3)
    out, _, _, _, seed, offset, _ = flash_cann.npu_fusion_attention(
        q, k, v, 4, "BSND", scale=0.3, keep_prob=0.8)
    same, _ = torch.ops.flash_cann.fwd(q, k, v, None, rng_state=torch.tensor([seed, offset]),
                                       scale=0.3, layout="BSND", dropout_p=0.2)
    assert torch.equal(out, same)
    plain = flash_cann.npu_fusion_attention(q, k, v, 4, "BSND", scale=0.3)[0]
    assert not torch.allclose(out, plain)


def test_no_mask_computes_full_attention_as_torch_npu_documents(gen):
    q, k, v = qkv(gen, "BNSD")
    with pytest.warns(UserWarning, match="FULL attention"):
        out = flash_cann.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.3, sparse_mode=3)[0]
    assert torch.equal(out, flash_cann.attention(q, k, v, layout="BNSD", scale=0.3))
    # the default scale is torch_npu's 1.0, not 1 / sqrt(head_dim)
    out = flash_cann.npu_fusion_attention(q, k, v, 4, "bnsd")[0]
    assert torch.equal(out, flash_cann.attention(q, k, v, layout="BNSD", scale=1.0))


def _refusal(name, exc, **kwargs):
    return pytest.param(name, exc, kwargs, id="-".join([name, *kwargs]))


@pytest.mark.parametrize("name,exc,kwargs", [
    _refusal("pse", NotImplementedError, pse=torch.zeros(1, 4, 6, 9)),
    _refusal("padding_mask", NotImplementedError, padding_mask=torch.zeros(1)),
    _refusal("sink", ValueError, sink=torch.zeros(3)),                 # not (head_num,)
    _refusal("prefix", NotImplementedError, prefix=[2, 2]),
    _refusal("sparse_mode", NotImplementedError, sparse_mode=5),
    _refusal("sparse_mode", NotImplementedError, sparse_mode=6),
    _refusal("sparse_mode", ValueError, sparse_mode=9),
    _refusal("sparse_mode", ValueError, sparse_mode=7, atten_mask=COMPRESSED),
    _refusal("keep_prob", ValueError, keep_prob=0.0),
    _refusal("keep_prob", ValueError, keep_prob=1.5),
    _refusal("inner_precise", ValueError, inner_precise=3),
    _refusal("input_layout", ValueError, input_layout="BHSD"),
    _refusal("head_num", ValueError, head_num=3),
    _refusal("scale", TypeError, scale="0.3"),
    _refusal("pre_tockens", TypeError, pre_tockens=1.5),
    _refusal("sync", TypeError, sync=None),
    _refusal("softmax_layout", ValueError, softmax_layout="TND"),
    _refusal("actual_seq_qlen", ValueError, actual_seq_qlen=[6, 12]),
    _refusal("atten_mask", TypeError, atten_mask=torch.zeros(6, 9)),
    _refusal("atten_mask", ValueError, atten_mask=torch.zeros(6, 8, dtype=torch.bool)),
    _refusal("atten_mask", NotImplementedError, sparse_mode=1,
             atten_mask=torch.eye(6, 9, dtype=torch.bool)),            # per-query pattern
    _refusal("atten_mask", NotImplementedError, sparse_mode=1,
             atten_mask=torch.arange(4).view(1, 4, 1, 1).expand(2, 4, 6, 9) == 1),  # per head
    _refusal("atten_mask", NotImplementedError, sparse_mode=3,
             atten_mask=torch.ones(6, 9, dtype=torch.bool).triu(1)),   # not the compressed one
    _refusal("atten_mask", ValueError, sparse_mode=2, atten_mask=~COMPRESSED),
    _refusal("pre_tockens", ValueError, sparse_mode=4, atten_mask=COMPRESSED,
             pre_tockens=-6, next_tockens=8),
    _refusal("next_tockens", ValueError, sparse_mode=4, atten_mask=COMPRESSED,
             pre_tockens=20, next_tockens=-9),
])
def test_refusals_name_the_argument(gen, name, exc, kwargs):
    q, k, v = qkv(gen, "BNSD")
    args = dict(head_num=4, input_layout="BNSD", atten_mask=None)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        flash_cann.npu_fusion_attention(q, k, v, **args)


@pytest.mark.parametrize("kwargs,name", [
    (dict(actual_seq_qlen=[3, 2], actual_seq_kvlen=[3, 5]), "actual_seq_qlen"),
    (dict(actual_seq_qlen=[3, 4], actual_seq_kvlen=[3, 5]), "actual_seq_qlen"),
    (dict(actual_seq_qlen=[-1, 5], actual_seq_kvlen=[3, 5]), "actual_seq_qlen"),  # negative first
    (dict(actual_seq_qlen=[3, 5], actual_seq_kvlen=[5]), "actual_seq_kvlen"),
    (dict(actual_seq_qlen=[3, 5], actual_seq_kvlen=[3, 5], sparse_mode=0,
          atten_mask=torch.zeros(3, 3, dtype=torch.bool)), "atten_mask"),
])
def test_tnd_refusals_name_the_argument(gen, kwargs, name):
    q, k, v, _, _ = _tnd(gen, [3, 2], [3, 2])
    with pytest.raises((ValueError, NotImplementedError, TypeError), match=name):
        flash_cann.npu_fusion_attention(q, k, v, 4, "TND", **kwargs)


@pytest.mark.parametrize("backend", ["twin", "npu"])
def test_causal_and_padding_masks_reach_backends_without_windows(gen, backend):
    """Mode 3, mode 2 with S1 == S2 and a causal + key padding full mask become plain
    causal attention with key padding (no window argument), which the Ascend C backends
    take. Checked against the backend's declared features, without running it."""
    from flash_cann.api import fusion_masks
    from flash_cann.contract.checks import check_fwd
    from flash_cann.contract.spec import load

    q, k, v = (t.half() for t in qkv(gen, "BNSD", seqlen_q=7, seqlen_k=7))
    i, j = torch.arange(7).view(-1, 1), torch.arange(7).view(1, -1)
    padded = torch.tensor([False] * 5 + [True] * 2).view(1, 1, 1, 7).expand(2, 1, 1, 7)
    dense, padding = fusion_masks.dense_mask_as_flash_cann(padded | (j > i), 2, 4, 7, 7)
    bands = [fusion_masks.bottom_right_band(None, 0, 7, 7, "pre", "next"),
             fusion_masks.bottom_right_band(None, 7 - 7, 7, 7, "pre", "next"), dense]
    for band in bands:
        assert band.op_arguments() == dict(causal=True, window_left=-1, window_right=-1)
        check_fwd(q, k, v, padding if band is dense else None, 0.3, layout="BNSD",
                  backend=load().backends[backend], **band.op_arguments())
    assert padding is not None and padding[:, :5].all() and not padding[:, 5:].any()
    shorter_q = fusion_masks.bottom_right_band(None, 5 - 7, 5, 7, "pre", "next")  # mode 2
    assert shorter_q.keys == 5 and shorter_q.op_arguments()["causal"]
    assert shorter_q.op_arguments()["window_right"] == -1
