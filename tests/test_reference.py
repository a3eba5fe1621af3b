"""The oracle's features against their definitions (flash_cann.contract.variant), by identities
that need no backend: a feature at its neutral value is plain attention, causal is the
window (-1, 0), packed sequences are batched ones, dropout with every entry kept
scales the output by 1 / (1 - p), and a sink is one more key whose value is zero."""

from __future__ import annotations

import math

import pytest
import torch

from flash_cann.contract import reference
from flash_cann.contract.variant import Variant

from conftest import make_qkv


def _qkv(gen, batch=2, seqlens=(7, 11), heads=(4, 2)):
    return make_qkv(batch, *heads, *seqlens, 8, torch.float64, "BSND", generator=gen)


def _attend(q, k, v, **kwargs):
    kwargs.setdefault("scale", 0.4)
    return reference.attention(q, k, v, layout="BSND", **kwargs)


def _same(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def test_neutral_features_are_plain_attention(gen):
    q, k, v = _qkv(gen)
    plain = _attend(q, k, v, causal=True)
    neutral = Variant(window_left=100, window_right=-1, softcap=0.0,
                      alibi_slopes=torch.zeros(4, dtype=torch.float32))
    _same(_attend(q, k, v, causal=True, variant=neutral), plain)


def test_causal_is_the_window_that_ends_at_the_diagonal(gen):
    q, k, v = _qkv(gen)
    _same(_attend(q, k, v, causal=True),
          _attend(q, k, v, variant=Variant(window_left=-1, window_right=0)))


@pytest.mark.parametrize("window", [(2, 0), (0, 3), (1, 1)])
def test_window_sees_exactly_its_band(window):
    vis = reference.visible(4, 6, False, window=window)[0, 0]
    for i in range(4):
        for j in range(6):
            diagonal_key = i + 6 - 4
            assert bool(vis[i, j]) == (diagonal_key - window[0] <= j <= diagonal_key + window[1])


def test_softcap_bounds_the_scores(gen):
    """With softcap c every score lies in (-c, c): lse <= c + log(seqlen_k)."""
    q, k, v = _qkv(gen)
    _, lse = _attend(q * 30, k, v, variant=Variant(softcap=2.0))
    assert (lse <= 2.0 + math.log(11)).all()


def test_alibi_is_a_distance_penalty(gen):
    """One key repeated everywhere: ALiBi alone decides the weights, exp(-slope * distance)."""
    q, k, v = _qkv(gen, batch=1, seqlens=(1, 5), heads=(1, 1))
    k = k[:, :1].expand(-1, 5, -1, -1)
    v = torch.arange(5, dtype=torch.float64).view(1, 5, 1, 1).expand(-1, -1, -1, 8)
    slope = 0.7
    out, _ = _attend(q, k, v, variant=Variant(alibi_slopes=torch.tensor([slope])))
    weights = torch.exp(-slope * torch.arange(4, -1, -1, dtype=torch.float64))
    torch.testing.assert_close(out[0, 0, 0, 0], (weights * torch.arange(5.0)).sum() / weights.sum())


def test_dropout_keeping_everything_scales_the_output(gen):
    q, k, v = _qkv(gen)
    keep_all = torch.ones(2, 4, 7, 11, dtype=torch.bool)
    out, lse = _attend(q, k, v, variant=Variant(dropout_p=0.25), dropout_mask=keep_all)
    plain_out, plain_lse = _attend(q, k, v)
    _same((out * 0.75, lse), (plain_out, plain_lse))


def test_packed_sequences_are_batched_sequences(gen):
    """TND of two sequences of equal lengths == BSND of the batch of them."""
    q, k, v = _qkv(gen)
    cu = lambda n: torch.tensor([0, n, 2 * n], dtype=torch.int32)  # noqa: E731
    variant = Variant(cu_seqlens_q=cu(7), cu_seqlens_k=cu(11), max_seqlen_q=7, max_seqlen_k=11,
                      window_left=3, alibi_slopes=torch.rand(2, 4))
    out, lse = reference.attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), scale=0.4,
                                   causal=True, layout="TND", variant=variant)
    batched = Variant(window_left=3, alibi_slopes=variant.alibi_slopes)
    ref_out, ref_lse = _attend(q, k, v, causal=True, variant=batched)
    _same((out, lse), (ref_out.flatten(0, 1), ref_lse.transpose(0, 1).flatten(1)))


def test_a_sink_is_a_key_with_a_zero_value(gen):
    """Attention with sinks = attention over one more key per head, at the front, whose
    score is the head's sink logit and whose value is 0 (out, lse and every gradient,
    the sink's included), causal and padded."""
    q, k, v = _qkv(gen, heads=(4, 4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    sinks = torch.tensor([0.5, -1.0, 2.0, -30.0], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1] = False  # a sequence whose rows see no key: out 0, lse = the sink
    out, lse = _attend(q, k, v, key_padding_mask=mask, causal=True, variant=Variant(sinks=sinks))
    # The extra key: scale * q . k_sink = sink for every row (k_sink = q's direction
    # cannot work for all rows at once, so extend the head_dim by one coordinate instead).
    scale = 0.4
    one = torch.ones(*q.shape[:-1], 1, dtype=q.dtype)
    q_ext = torch.cat((q, one), -1)
    k_ext = torch.cat((torch.zeros(2, 1, 4, 8, dtype=q.dtype), k), 1)
    k_ext = torch.cat((k_ext, torch.zeros(2, 12, 4, 1, dtype=q.dtype)), -1)
    k_ext[:, 0, :, -1] = sinks / scale
    v_ext = torch.cat((torch.zeros(2, 1, 4, 8, dtype=q.dtype), v), 1)
    v_ext = torch.cat((v_ext, torch.zeros(2, 12, 4, 1, dtype=q.dtype)), -1)
    # The sink sits left of every key: keep it visible for every row (causal with one
    # more key keeps the diagonal where it was).
    mask_ext = torch.cat((torch.ones(2, 1, dtype=torch.bool), mask), 1)
    want_out, want_lse = _attend(q_ext, k_ext, v_ext, key_padding_mask=mask_ext, causal=True)
    _same((out, lse), (want_out[..., :8], want_lse))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(lse[1], sinks.detach().view(4, 1).expand(4, 7), rtol=0, atol=0)
    grad = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    got = torch.autograd.grad((out * grad).sum() + lse.sum(), (q, k, v, sinks))
    want = torch.autograd.grad((want_out[..., :8] * grad).sum() + want_lse.sum(),
                               (q, k, v, sinks))
    _same(got, want)


def test_sinks_far_below_the_scores_are_plain_attention(gen):
    q, k, v = _qkv(gen)
    _same(_attend(q, k, v, variant=Variant(sinks=torch.full((4,), -1e4, dtype=torch.float64))),
          _attend(q, k, v))
