"""The host path of a plain call (flash_cann.contract.eager, ops.plain_forward/plain_backward):
the eager shortcut is taken exactly where nothing can tell it from the op, gives the
op's results bit for bit, and the checks planned once per signature still refuse every
bad call. (The Triton launch replays: test_triton.py, on a GPU.)"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import flash_cann
from flash_cann.contract import eager, ops

from conftest import make_qkv, random_key_padding_mask


@pytest.fixture
def shortcut_calls(monkeypatch):
    """How many calls took the eager shortcut."""
    calls = []
    real = eager.attention

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(eager, "attention", counting)
    return calls


class _OpLog(TorchDispatchMode):
    """The ops the dispatcher sees."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _grads(fn, q, k, v):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    upstream = torch.linspace(-1, 1, out.numel()).view(out.shape).to(out.dtype)
    (out * upstream).sum().add(lse.sum()).backward()
    return out, lse, q.grad, k.grad, v.grad


@pytest.mark.parametrize("layout", ["BSND", "BNSD"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_shortcut_matches_the_op_bit_for_bit(layout, masked, shortcut_calls, gen):
    """Forward, lse and every gradient (lse's included), GQA, causal, with padding."""
    q, k, v = make_qkv(2, 4, 2, 33, 47, 16, torch.float32, layout, generator=gen)
    mask = random_key_padding_mask(2, 47, gen) if masked else None
    got = _grads(lambda *t: flash_cann.attention(*t, layout=layout, causal=True,
                                                 key_padding_mask=mask, return_lse=True),
                 q, k, v)
    assert len(shortcut_calls) == 1
    want = _grads(lambda *t: torch.ops.flash_cann.fwd(*t, mask, 0.25, True, layout), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_the_shortcut_is_taken_only_where_the_op_cannot_be_told_apart(shortcut_calls, gen):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, "BSND", generator=gen)
    flash_cann.flash_attn_func(q, k, v)
    flash_cann.flash_attn_func(q.requires_grad_(), k, v, causal=True).sum().backward()
    with torch.inference_mode():
        flash_cann.flash_attn_func(q, k, v)
    assert len(shortcut_calls) == 3
    # A feature, a dispatch mode (the op must be seen), a torch function mode, a tensor
    # subclass: the op.
    flash_cann.flash_attn_func(q, k, v, softcap=5.0)
    with _OpLog() as log:
        flash_cann.flash_attn_func(q, k, v)
    assert "flash_cann.fwd.default" in log.ops
    with torch.device("cpu"):
        flash_cann.flash_attn_func(q, k, v)
    flash_cann.flash_attn_func(torch.nn.Parameter(q.detach()), k, v)
    assert len(shortcut_calls) == 3
    meta = torch.empty(1, device="meta")
    assert not eager.applies(meta, meta, meta)


def test_compiled_calls_trace_the_op(shortcut_calls, gen):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, "BSND", generator=gen)
    compiled = torch.compile(lambda *t: flash_cann.flash_attn_func(*t, causal=True),
                             backend="eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), flash_cann.flash_attn_func(q, k, v, causal=True))
    assert len(shortcut_calls) == 1  # the eager call only


@pytest.mark.parametrize("path", ["shortcut", "op"])
def test_double_backward_is_refused(path, gen):
    """First derivatives with create_graph=True are right; a second one raises, through
    the eager shortcut and through the op, also for a gradient penalty (the upstream
    gradient needs no grad: once_differentiable alone would let it pass as zero)."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 8, 8, 16, torch.float32,
                                                    "BSND", generator=gen))
    if path == "op":
        out, _ = torch.ops.flash_cann.fwd(q, k, v, None, 0.25, False, "BSND")
    else:
        out = flash_cann.flash_attn_func(q, k, v)
    (grad_q,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    (want,) = torch.autograd.grad(flash_cann.flash_attn_func(q, k, v).sum(), q)
    assert torch.equal(grad_q, want)
    assert grad_q.requires_grad
    penalty = grad_q.square().sum() + out.sum()
    with pytest.raises(RuntimeError, match="differentiable once"):
        penalty.backward()


def test_a_repeated_signature_is_checked_once_and_bad_calls_still_fail(monkeypatch, gen):
    from flash_cann.contract import checks

    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, "BSND", generator=gen)
    checked = []
    real = checks.check_fwd
    monkeypatch.setattr(ops, "check_fwd", lambda *a, **kw: checked.append(a) or real(*a, **kw))
    ops.forget_plans()
    for _ in range(3):
        flash_cann.flash_attn_func(q, k, v, causal=True)
    assert len(checked) == 1
    # Each of these differs from the planned call in what its signature records, and
    # fails every time (refusals are never planned).
    for _ in range(2):
        with pytest.raises(TypeError, match="same dtype"):
            flash_cann.flash_attn_func(q, k.double(), v, causal=True)
        with pytest.raises(ValueError, match="same head_dim"):
            flash_cann.flash_attn_func(q, k[..., :8], v, causal=True)
        with pytest.raises(ValueError, match="finite"):
            flash_cann.flash_attn_func(q, k, v, softmax_scale=float("nan"))
        with pytest.raises(TypeError, match="key_padding_mask must be torch.bool"):
            torch.ops.flash_cann.fwd(q, k, v, torch.ones(1, 8, dtype=torch.int32), 0.25,
                                     False, "BSND")
    flash_cann.flash_attn_func(q, k, v, causal=True)
    assert len(checked) == 1 + 8


def test_plans_follow_the_backend_selection(monkeypatch, gen):
    """A call planned on the cpu backend runs on the twin inside use_backend("twin")."""
    from flash_cann.backends.twin import launcher as twin

    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float16, "BSND", generator=gen)
    flash_cann.flash_attn_func(q, k, v)
    served = []
    monkeypatch.setattr(twin, "forward", lambda *a, **kw: served.append(a) or (
        torch.zeros_like(q), torch.zeros(1, 2, 8)))
    with flash_cann.use_backend("twin"):
        assert flash_cann.flash_attn_func(q, k, v).abs().sum() == 0
    assert len(served) == 1
    assert flash_cann.flash_attn_func(q, k, v).abs().sum() > 0


def test_plans_are_bounded(monkeypatch, gen):
    monkeypatch.setattr(ops, "MAX_PLANS", 2)
    ops.forget_plans()
    for seqlen in (8, 9, 10, 11):
        q, k, v = make_qkv(1, 2, 2, seqlen, seqlen, 16, torch.float32, "BSND", generator=gen)
        flash_cann.flash_attn_func(q, k, v)
        assert len(ops._fwd_plans) <= 2
