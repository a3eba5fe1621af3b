"""The public API's conventions: flash-attn's return values, layouts, mask polarity,
bottom-right causal alignment, rows that see no key, GQA, strided inputs."""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann

from conftest import make_qkv


def _grads(fn, *tensors, upstream=None):
    """(out, *input grads) of fn(*tensors) for the loss sum(out * upstream); upstream
    defaults to a fixed ramp in out's shape."""
    tensors = [t.detach().requires_grad_() for t in tensors]
    out = fn(*tensors)
    out = out[0] if isinstance(out, tuple) else out
    if upstream is None:
        upstream = torch.linspace(-1, 1, out.numel()).view(out.shape).to(out.dtype)
    return (out, *torch.autograd.grad((out * upstream).sum(), tensors))


def test_flash_attn_func_return_conventions(gen):
    q, k, v = make_qkv(2, 4, 2, 9, 13, 16, torch.float32, "BSND", generator=gen)
    out = flash_cann.flash_attn_func(q, k, v, causal=True)
    assert out.shape == q.shape
    out2, lse, s_dmask = flash_cann.flash_attn_func(q, k, v, causal=True,
                                                    return_attn_probs=True)
    assert torch.equal(out, out2) and s_dmask is None
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    ref = flash_cann.attention(q, k, v, layout="BSND", causal=True)
    assert torch.equal(out, ref)


def test_packed_variants_match(gen):
    q, k, v = make_qkv(2, 4, 4, 11, 11, 16, torch.float32, "BSND", generator=gen)
    expected = flash_cann.flash_attn_func(q, k, v, causal=True, softmax_scale=0.3)
    qkv = torch.stack([q, k, v], dim=2)
    kv = torch.stack([k, v], dim=2)
    assert torch.equal(flash_cann.flash_attn_qkvpacked_func(qkv, causal=True,
                                                            softmax_scale=0.3), expected)
    assert torch.equal(flash_cann.flash_attn_kvpacked_func(q, kv, causal=True,
                                                           softmax_scale=0.3), expected)


def test_default_scale_is_inverse_sqrt_head_dim(gen):
    q, k, v = make_qkv(1, 2, 2, 7, 7, 36, torch.float32, generator=gen)
    assert torch.equal(flash_cann.attention(q, k, v),
                       flash_cann.attention(q, k, v, scale=1 / math.sqrt(36)))


@pytest.mark.parametrize("causal", [False, True])
def test_layouts_agree(causal, gen):
    """BNSD, BSND and BSH (a view of BSND) give the same outputs and gradients."""
    q, k, v = make_qkv(2, 4, 2, 10, 14, 16, torch.float32, "BNSD", generator=gen)
    mask = torch.rand(2, 14, generator=gen) > 0.2
    upstream = torch.randn(q.shape, generator=gen)
    ref = _grads(lambda *t: flash_cann.attention(*t, causal=causal, key_padding_mask=mask),
                 q, k, v, upstream=upstream)

    def bsnd(t):
        return t.transpose(1, 2).contiguous()

    got = _grads(lambda *t: flash_cann.attention(*t, layout="BSND", causal=causal,
                                                 key_padding_mask=mask),
                 bsnd(q), bsnd(k), bsnd(v), upstream=bsnd(upstream))
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b.transpose(1, 2), rtol=1e-6, atol=1e-6)
    got = _grads(lambda *t: flash_cann.attention(*t, layout="BSH", num_heads=4, causal=causal,
                                                 key_padding_mask=mask),
                 *(bsnd(t).flatten(-2) for t in (q, k, v)), upstream=bsnd(upstream).flatten(-2))
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b.unflatten(-1, (-1, 16)).transpose(1, 2),
                                   rtol=1e-6, atol=1e-6)


def test_mask_polarity_true_means_attend(gen):
    """Masking keys out equals removing them: True/nonzero = attend."""
    q, k, v = make_qkv(1, 2, 2, 6, 10, 16, torch.float32, generator=gen)
    keep = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 1, 0])
    idx = keep.nonzero().squeeze(1)
    expected = flash_cann.attention(q, k[:, :, idx], v[:, :, idx])
    for mask in (keep.bool(), keep, keep.view(1, 10), keep.to(torch.int8) * 7):
        torch.testing.assert_close(flash_cann.attention(q, k, v, key_padding_mask=mask),
                                   expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seqlen_q, seqlen_k, visible", [
    # The matrices of the interface docstring (1 = attend), bottom-right aligned.
    (2, 5, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
    (5, 2, [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]),
    (3, 3, [[1, 0, 0], [1, 1, 0], [1, 1, 1]]),
])
def test_causal_is_bottom_right_aligned(seqlen_q, seqlen_k, visible, gen):
    q, k, v = make_qkv(1, 1, 1, seqlen_q, seqlen_k, 8, torch.float64, generator=gen)
    out, lse = flash_cann.attention(q, k, v, causal=True, return_lse=True)
    for i, row in enumerate(visible):
        keys = [j for j, bit in enumerate(row) if bit]
        if not keys:
            assert torch.all(out[0, 0, i] == 0) and lse[0, 0, i] == -math.inf
            continue
        expected = flash_cann.attention(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys])
        torch.testing.assert_close(out[:, :, i:i + 1], expected)


def test_rows_that_see_no_key_give_zero_and_no_nan(gen):
    """Every key padded for one sequence, and causal rows above the diagonal."""
    q, k, v = make_qkv(2, 2, 1, 6, 4, 16, torch.float32, generator=gen)
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[1] = False
    tensors = [t.requires_grad_() for t in (q, k, v)]
    out, lse = flash_cann.attention(*tensors, causal=True, key_padding_mask=mask,
                                    return_lse=True)
    (out.sum() + lse.masked_fill(lse.isinf(), 0).sum()).backward()
    assert not any(torch.isnan(t).any() for t in (out, lse, q.grad, k.grad, v.grad))
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)
    assert torch.all(q.grad[1] == 0) and torch.all(k.grad[1] == 0) and torch.all(v.grad[1] == 0)
    # seqlen_q 6 > seqlen_k 4: the first two query rows see no key.
    assert torch.all(out[0, :, :2] == 0) and torch.all(lse[0, :, :2] == -math.inf)
    assert torch.all(q.grad[0, :, :2] == 0)
    assert torch.all(torch.isfinite(lse[0, :, 2:]))


def test_gqa_equals_mha_with_repeated_kv(gen):
    q, k, v = make_qkv(2, 6, 2, 9, 9, 16, torch.float32, generator=gen)
    got = _grads(lambda *t: flash_cann.attention(*t, causal=True), q, k, v)
    ref = _grads(lambda q_, k_, v_: flash_cann.attention(
        q_, k_.repeat_interleave(3, 1), v_.repeat_interleave(3, 1), causal=True), q, k, v)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_strided_inputs_work(gen):
    """Non-contiguous views are accepted and give the contiguous result."""
    base = torch.randn(2, 12, 3, 8, 16, generator=gen)  # (b, s, 3, h, d), packed qkv
    q, k, v = (t.transpose(1, 2) for t in base.unbind(2))  # BNSD views, non-contiguous
    assert not q.is_contiguous()
    got = _grads(lambda *t: flash_cann.attention(*t, causal=True), q, k, v)
    ref = _grads(lambda *t: flash_cann.attention(*t, causal=True),
                 q.contiguous(), k.contiguous(), v.contiguous())
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_results_are_deterministic(gen):
    q, k, v = make_qkv(2, 4, 2, 200, 300, 32, torch.bfloat16, generator=gen)
    first = _grads(lambda *t: flash_cann.attention(*t, causal=True), q, k, v)
    for _ in range(3):
        again = _grads(lambda *t: flash_cann.attention(*t, causal=True), q, k, v)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_use_backend_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        with flash_cann.use_backend("tpu"):
            pass


def test_every_public_function_takes_sinks(gen):
    """sinks= (one logit per query head) on the packed and varlen variants is the unpacked
    call's, gradient included; attention() and flash_attn_with_kvcache take it too."""
    q, k, v = make_qkv(2, 4, 4, 7, 7, 16, torch.float32, "BSND", generator=gen)
    sinks = torch.randn(4, generator=gen)
    want = flash_cann.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    same = [
        flash_cann.flash_attn_qkvpacked_func(torch.stack((q, k, v), 2), causal=True,
                                             sinks=sinks),
        flash_cann.flash_attn_kvpacked_func(q, torch.stack((k, v), 2), causal=True, sinks=sinks),
        flash_cann.attention(q, k, v, layout="BSND", causal=True, sinks=sinks),
        flash_cann.flash_attn_with_kvcache(q, k, v, causal=True, sinks=sinks),
    ]
    cu = torch.tensor([0, 7, 14], dtype=torch.int32)
    packed = [t.flatten(0, 1) for t in (q, k, v)]
    same += [t.unflatten(0, (2, 7)) for t in (
        flash_cann.flash_attn_varlen_func(*packed, cu, cu, 7, 7, causal=True, sinks=sinks),
        flash_cann.flash_attn_varlen_qkvpacked_func(torch.stack(packed, 1), cu, 7, causal=True,
                                                    sinks=sinks),
        flash_cann.flash_attn_varlen_kvpacked_func(packed[0], torch.stack(packed[1:], 1), cu,
                                                   cu, 7, 7, causal=True, sinks=sinks))]
    for out in same:
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(want, flash_cann.flash_attn_func(q, k, v, causal=True))
    sinks.requires_grad_()
    grads = [torch.autograd.grad(f().sum(), sinks)[0] for f in (
        lambda: flash_cann.flash_attn_func(q, k, v, causal=True, sinks=sinks),
        lambda: flash_cann.flash_attn_varlen_func(*packed, cu, cu, 7, 7, causal=True,
                                                  sinks=sinks))]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_default_softmax_scale_is_one_over_sqrt_head_dim():
    """softmax_scale=None is 1 / sqrt(head_dim), q's last axis (not its sequence axis),
    for the batched and the packed entry points."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 16, generator=g) for _ in range(3))
    torch.testing.assert_close(flash_cann.flash_attn_func(q, k, v),
                               flash_cann.flash_attn_func(q, k, v, softmax_scale=0.25))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    packed = [t[0] for t in (q, k, v)]
    torch.testing.assert_close(
        flash_cann.flash_attn_varlen_func(*packed, cu, cu, 3, 3),
        flash_cann.flash_attn_varlen_func(*packed, cu, cu, 3, 3, softmax_scale=0.25))
