"""flash-attn 2.8's private entry points (flash_cann.api.flash_attn_private), served as
flash_attn.flash_attn_interface._flash_attn_* by the alias: flash-attn's parameter lists
(names, order, defaults: libraries fill them by name), its returns, the backward writing
into the given dq/dk/dv, and the same numbers as flash_attn_func / flash_attn_varlen_func
with autograd. CPU backend. (That the alias serves them: tests/test_flash_attn_alias.py.)"""

from __future__ import annotations

import inspect

import pytest
import torch

import flash_cann
from flash_cann.api import flash_attn_private as private

# flash-attn 2.8, flash_attn/flash_attn_interface.py: (name, default or EMPTY)
E = inspect.Parameter.empty
SIGNATURES = {
    "_flash_attn_forward": [("q", E), ("k", E), ("v", E), ("dropout_p", E),
                            ("softmax_scale", E), ("causal", E), ("window_size_left", E),
                            ("window_size_right", E), ("softcap", E), ("alibi_slopes", E),
                            ("return_softmax", E)],
    "_flash_attn_varlen_forward": [
        ("q", E), ("k", E), ("v", E), ("cu_seqlens_q", E), ("cu_seqlens_k", E),
        ("max_seqlen_q", E), ("max_seqlen_k", E), ("dropout_p", E), ("softmax_scale", E),
        ("causal", E), ("window_size_left", -1), ("window_size_right", -1), ("softcap", 0.0),
        ("alibi_slopes", None), ("return_softmax", False), ("block_table", None),
        ("leftpad_k", None), ("seqused_k", None)],
    "_flash_attn_backward": [
        ("dout", E), ("q", E), ("k", E), ("v", E), ("out", E), ("softmax_lse", E), ("dq", E),
        ("dk", E), ("dv", E), ("dropout_p", E), ("softmax_scale", E), ("causal", E),
        ("window_size_left", E), ("window_size_right", E), ("softcap", E),
        ("alibi_slopes", E), ("deterministic", E), ("rng_state", None)],
    "_flash_attn_varlen_backward": [
        ("dout", E), ("q", E), ("k", E), ("v", E), ("out", E), ("softmax_lse", E), ("dq", E),
        ("dk", E), ("dv", E), ("cu_seqlens_q", E), ("cu_seqlens_k", E), ("max_seqlen_q", E),
        ("max_seqlen_k", E), ("dropout_p", E), ("softmax_scale", E), ("causal", E),
        ("window_size_left", E), ("window_size_right", E), ("softcap", E),
        ("alibi_slopes", E), ("deterministic", E), ("rng_state", None)],
}


@pytest.mark.parametrize("name", SIGNATURES)
def test_signatures_are_flash_attns(name):
    function = getattr(private, name)
    assert inspect.isfunction(function)  # ring-flash-attn's get_default_args needs one
    got = [(p.name, p.default) for p in inspect.signature(function).parameters.values()]
    assert got == SIGNATURES[name]


def _reference(fn, inputs, dout):
    leaves = [t.detach().requires_grad_() for t in inputs]
    out, lse, _ = fn(*leaves)
    out.backward(dout)
    return out.detach(), lse.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (3, 2))])
def test_dense_forward_and_backward(causal, window):
    g = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(2, 9, 4, 16, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 11, 2, 16, generator=g) for _ in range(2))
    out, lse, grads = _reference(lambda *t: flash_cann.flash_attn_func(
        *t, causal=causal, window_size=window, softcap=3.0, return_attn_probs=True),
        (q, k, v), dout)
    got = private._flash_attn_forward(q, k, v, 0.0, 0.25, causal, *window, 3.0, None, False)
    assert len(got) == 4 and got[2].numel() == 0 and got[3].shape == (2,)
    # flash_attn_func's default scale is 1/sqrt(16) = 0.25 too
    torch.testing.assert_close(got[0], out, rtol=0, atol=0)
    torch.testing.assert_close(got[1], lse, rtol=0, atol=0)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    d = private._flash_attn_backward(dout, q, k, v, got[0], got[1], dq, dk, dv, 0.0, 0.25,
                                     causal, *window, 3.0, None, False, got[3])
    for given, want in zip((dq, dk, dv), grads):
        torch.testing.assert_close(given, want, rtol=1e-6, atol=1e-6)
    assert d.shape == (2, 4, 128) and d.dtype == torch.float32
    torch.testing.assert_close(d[..., :9], (dout * out).sum(-1).transpose(1, 2))
    assert not d[..., 9:].any()


def test_window_bounds_of_none_are_unbounded():
    """window_size_left / right None are -1 (unbounded), as the public API's -1."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 6, 2, 16, generator=g) for _ in range(3))
    for causal in (False, True):
        unbounded = private._flash_attn_forward(q, k, v, 0.0, 0.25, causal, -1, -1, 0.0, None,
                                                False)
        none = private._flash_attn_forward(q, k, v, 0.0, 0.25, causal, None, None, 0.0, None,
                                           False)
        torch.testing.assert_close(none[0], unbounded[0], rtol=0, atol=0)


def test_varlen_forward_and_backward():
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 3, 10, 16], dtype=torch.int32)
    q, k, v, dout = (torch.randn(16, 2, 8, generator=g) for _ in range(4))
    out, lse, grads = _reference(lambda *t: flash_cann.flash_attn_varlen_func(
        *t, cu, cu, 7, 7, causal=True, return_attn_probs=True), (q, k, v), dout)
    got = private._flash_attn_varlen_forward(q, k, v, cu, cu, 7, 7, 0.0, 8 ** -0.5, True)
    torch.testing.assert_close(got[0], out, rtol=0, atol=0)
    torch.testing.assert_close(got[1], lse, rtol=0, atol=0)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    d = private._flash_attn_varlen_backward(dout, q, k, v, got[0], got[1], dq, dk, dv, cu, cu,
                                            7, 7, 0.0, 8 ** -0.5, True, -1, -1, 0.0, None,
                                            False)
    for given, want in zip((dq, dk, dv), grads):
        torch.testing.assert_close(given, want, rtol=1e-6, atol=1e-6)
    assert d.shape == (2, 16 + 128 * 3)


def test_dropout_state_round_trips():
    """The forward's rng_state makes the backward drop what the forward dropped: the
    same gradients as flash_attn_func's autograd under the same seed."""
    g = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(1, 8, 2, 16, generator=g) for _ in range(4))
    torch.manual_seed(7)
    out, lse, grads = _reference(lambda *t: flash_cann.flash_attn_func(
        *t, dropout_p=0.3, return_attn_probs=True), (q, k, v), dout)
    torch.manual_seed(7)
    got = private._flash_attn_forward(q, k, v, 0.3, None, False, -1, -1, 0.0, None, True)
    torch.testing.assert_close(got[0], out, rtol=0, atol=0)
    assert got[2].shape == (1, 2, 8, 8) and bool((got[2] < 0).any())  # S_dmask, signed
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    private._flash_attn_backward(dout, q, k, v, got[0], got[1], dq, dk, dv, 0.3, None, False,
                                 -1, -1, 0.0, None, False, got[3])
    for given, want in zip((dq, dk, dv), grads):
        torch.testing.assert_close(given, want, rtol=1e-6, atol=1e-6)


def test_paged_arguments_are_refused_by_name():
    t = torch.zeros(4, 1, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="seqused_k"):
        private._flash_attn_varlen_forward(t, t, t, cu, cu, 4, 4, 0.0, None, False,
                                           seqused_k=cu[1:])
