"""The host path of a plain call (flash_cann.contract.eager, ops.plain_forward/plain_backward):
the eager shortcut is taken exactly where nothing can tell it from the op, gives the
op's results bit for bit, and the checks planned once per signature still refuse every
bad call. (The Triton launch replays: test_triton.py, on a GPU.)"""

from __future__ import annotations

from pathlib import Path

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


# --------------------------------------------------------------------------------------
# The plan key, argument by argument (issue 29): for every argument of the planned ops,
# taken from the spec, a call that differs from a planned call in that argument alone
# must not replay the plan, unless the argument cannot change any backend's result
# (NEVER_IN_THE_KEY, each with the test that shows it).
# --------------------------------------------------------------------------------------

# The ops that plan (ops.plain_forward / plain_backward) and their plans. fwd_kvcache
# does not plan: test_kvcache_is_checked_on_every_call.
PLANNED_OPS = {"fwd": "_fwd_plans", "bwd": "_bwd_plans"}


def _restrided(t):
    """The same values with other strides (dims 1 and 2 swapped in memory)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


# How each argument is varied, alone. Shapes are square in (seqlen, heads), so that
# layout BSND and BNSD both accept the same tensors (and the same lse).
VARY = {
    "query": _restrided, "key": _restrided, "value": _restrided, "out": _restrided,
    "grad_out": _restrided, "softmax_lse": _restrided,
    "key_padding_mask": lambda _: torch.ones(1, 4, dtype=torch.bool),
    "grad_softmax_lse": lambda _: torch.zeros(1, 4, 4),
    "scale": lambda s: s * 2, "causal": lambda c: not c,
    "layout": lambda _: "BNSD", "deterministic": lambda d: not d,
    "fp16_scores": lambda f: not f,
    # The features: a call with any of them is not plain and never replays a plan (it
    # may also be refused on its own, e.g. cu_seqlens without layout TND).
    "cu_seqlens_q": lambda _: torch.tensor([0, 4], dtype=torch.int32),
    "cu_seqlens_k": lambda _: torch.tensor([0, 4], dtype=torch.int32),
    "max_seqlen_q": lambda _: 4, "max_seqlen_k": lambda _: 4,
    "alibi_slopes": lambda _: torch.full((4,), 0.5),
    "rng_state": lambda _: torch.tensor([1, 2]),
    "window_left": lambda _: 1, "window_right": lambda _: 1,
    "softcap": lambda _: 5.0, "dropout_p": lambda _: 0.25,
    "sinks": lambda _: torch.zeros(4),
}

# (op, argument) -> why the plan may ignore it; each is proven by a test below.
NEVER_IN_THE_KEY = {
    ("fwd", "deterministic"): "autograd_only: only the backward reads it "
                              "(test_deterministic_cannot_change_a_forward)",
}


def _base_arguments(op_name, gen):
    q, k, v = make_qkv(1, 4, 4, 4, 4, 16, torch.float32, "BSND", generator=gen)
    fwd = ops.SPEC.ops["fwd"]
    args = {t.name: None for t in fwd.inputs if t.optional}
    args.update((a.name, a.default) for a in fwd.attrs if a.has_default)
    args.update(query=q, key=k, value=v, scale=0.25, layout="BSND")
    if op_name == "bwd":
        out, lse = torch.ops.flash_cann.fwd(*(args[n] for n in fwd.argument_names()))
        bwd = ops.SPEC.ops["bwd"]
        args = {t.name: None for t in bwd.inputs if t.optional}
        args.update((a.name, a.default) for a in bwd.attrs if a.has_default)
        args.update(query=q, key=k, value=v, out=out, softmax_lse=lse, scale=0.25,
                    layout="BSND", grad_out=torch.randn(q.shape, generator=gen))
    return args


def _call(op_name, args):
    op = getattr(torch.ops.flash_cann, op_name)
    return op(*(args[n] for n in ops.SPEC.ops[op_name].argument_names()))


def test_every_op_argument_has_a_variation():
    """A new argument of a planned op fails here until it is added to VARY (and so to
    the property test below)."""
    for op_name in PLANNED_OPS:
        missing = set(ops.SPEC.ops[op_name].argument_names()) - set(VARY)
        assert not missing, f"{op_name}: add a variation for {sorted(missing)} to VARY"


def _argument_cases():
    return [(o, n) for o in PLANNED_OPS for n in ops.SPEC.ops[o].argument_names()]


@pytest.mark.parametrize("op_name, name", _argument_cases(),
                         ids=[f"{o}-{n}" for o, n in _argument_cases()])
def test_changing_one_argument_never_replays_the_plan(op_name, name, gen):
    """Plan a plain call, then change ``name`` alone: the planned call must not serve it
    (a new key, a non-plain call, or a refusal)."""
    ops.forget_plans()
    args = _base_arguments(op_name, gen)
    plans = getattr(ops, PLANNED_OPS[op_name])
    ops.forget_plans()
    base = _call(op_name, args)
    assert len(plans) == 1
    (signature, plan), = plans.items()
    replays = []
    plans[signature] = lambda *a: replays.append(a) or plan(*a)
    again = _call(op_name, args)
    assert len(replays) == 1, "the same call must replay its plan"
    for a, b in zip(base, again):
        assert torch.equal(a, b)
    varied = dict(args, **{name: VARY[name](args[name])})
    try:
        _call(op_name, varied)
    except (ValueError, TypeError, NotImplementedError):
        pass  # refused: refusals are never planned (test_a_repeated_signature_...)
    if (op_name, name) in NEVER_IN_THE_KEY:
        return
    assert len(replays) == 1, (f"{op_name}: a call differing only in {name} replayed the "
                               f"plan of the original call")


def test_deterministic_cannot_change_a_forward():
    """fwd's ``deterministic`` (autograd_only) reaches no forward: the planned path does
    not take it, and no backend's forward function (or its planned form) has it."""
    import ast
    import inspect

    assert "deterministic" not in inspect.signature(ops.plain_forward).parameters
    assert "deterministic" not in ops._FWD_CORE
    backends = Path(ops.__file__).parents[1] / "backends"
    seen = 0
    for path in sorted(backends.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in ("forward", "forward_planned"):
                names = {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}
                assert "deterministic" not in names, f"{path.name}:{node.name}"
                seen += 1
    assert seen >= 5


def test_deterministic_reaches_a_backend_that_uses_it(monkeypatch, gen):
    """On the twin (deterministic selects the ordered dQ variant), a deterministic
    backward after a fast one of the same shapes is a deterministic backward."""
    from flash_cann.backends.twin import launcher as twin

    received = []

    def backward(*a, deterministic=False, **kw):
        received.append(deterministic)
        return (*(torch.zeros_like(t) for t in a[1:4]), None)

    monkeypatch.setattr(twin, "backward", backward)
    monkeypatch.delattr(twin, "backward_planned", raising=False)
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float16, "BSND", generator=gen)
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 8)
    with flash_cann.use_backend("twin"):
        for deterministic in (False, True, False, True):
            torch.ops.flash_cann.bwd(out, q, k, v, out, lse, None, None, 0.25, False, "BSND",
                                     deterministic)
    assert received == [False, True, False, True]


def test_kvcache_is_checked_on_every_call(monkeypatch, gen):
    """fwd_kvcache plans nothing: every call runs its checks (no key to go stale)."""
    from flash_cann.contract import checks

    calls = []
    monkeypatch.setattr(ops, "check_kvcache",
                        lambda *a, **kw: calls.append(a) or checks.check_kvcache(*a, **kw))
    q = torch.randn(1, 1, 2, 16, generator=gen)
    cache = torch.randn(1, 8, 2, 16, generator=gen)
    for _ in range(3):
        flash_cann.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4)
    assert len(calls) == 3
