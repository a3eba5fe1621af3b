"""Bad input: a clear exception naming the argument and the rule, from eager calls,
from the public API, and at torch.compile trace time (the fake kernels run the same
checks)."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

import flash_cann
from flash_cann.contract import checks, spec

from conftest import make_qkv


def _qkv(**kw):
    args = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=8, seqlen_k=12, head_dim=16,
                dtype=torch.float32, layout="BNSD")
    args.update(kw)
    return make_qkv(**args)


def _op(q, k, v, mask=None, scale=0.25, causal=False, layout="BNSD"):
    return torch.ops.flash_cann.fwd(q, k, v, mask, scale, causal, layout)


@pytest.mark.parametrize("case, exc, pattern", [
    ("dtype mismatch", TypeError, "same dtype.*key float16"),
    ("device mismatch", ValueError, "key must be on the same device as query"),
    ("rank", ValueError, r"query must be 4-D \(batch, heads, seqlen, head_dim\)"),
    ("head_dim mismatch", ValueError, "same head_dim"),
    ("key head_dim differs", ValueError, r"same head_dim \(got 16, 8, 16\)"),
    ("value head_dim differs", ValueError, r"same head_dim \(got 16, 16, 8\)"),
    ("head_dim too large", ValueError, r"head_dim must be in \[1, 256\] \(got 264\)"),
    ("heads not divisible", ValueError, r"query heads \(3\) must be a multiple of key/value "
                                        r"heads \(2\)"),
    ("kv heads differ", ValueError, "key and value must have the same number of heads"),
    ("kv seqlen differ", ValueError, "key and value must have the same seqlen"),
    ("batch differ", ValueError, "same batch size"),
    ("empty", ValueError, "query must not be empty"),
    ("head_dim 0", ValueError, r"head_dim must be in \[1, 256\] \(got 0: query's last dim"),
    ("key head_dim 0", ValueError, r"head_dim must be in \[1, 256\] \(got 0: key's last dim"),
    ("int dtype", TypeError, "query dtype int32 is not supported on device type 'cpu'"),
    ("nan scale", ValueError, "softmax scale must be a finite number"),
    ("inf scale", ValueError, "softmax scale must be a finite number"),
    ("bad layout", ValueError, "layout must be one of BNSD, BSND"),
    ("mask dtype", TypeError, "key_padding_mask must be torch.bool"),
    ("mask shape", ValueError, r"key_padding_mask must have shape \(batch, seqlen_k\)"),
    ("not a tensor", RuntimeError, "Expected a value of type 'Tensor' for argument 'value'"),
])
def test_op_rejects(case, exc, pattern):
    q, k, v = _qkv()
    kwargs = {}
    if case == "dtype mismatch":
        k = k.half()
    elif case == "device mismatch":
        k = k.to("meta")
    elif case == "rank":
        q = q[0]
    elif case == "head_dim mismatch":
        k, v = k[..., :8], v[..., :8]
    elif case == "key head_dim differs":
        k = k[..., :8]
    elif case == "value head_dim differs":
        v = v[..., :8]
    elif case == "head_dim too large":
        q, k, v = _qkv(head_dim=264)
    elif case == "heads not divisible":
        q = q[:, :3]
    elif case == "kv heads differ":
        v = v[:, :1]
    elif case == "kv seqlen differ":
        v = v[:, :, :5]
    elif case == "batch differ":
        k = k[:1]
    elif case == "empty":
        q = q[:, :, :0]
    elif case == "head_dim 0":
        q, k, v = (t[..., :0] for t in (q, k, v))
    elif case == "key head_dim 0":
        k = k[..., :0]
    elif case == "int dtype":
        q, k, v = (t.int() for t in (q, k, v))
    elif case == "nan scale":
        kwargs["scale"] = math.nan
    elif case == "inf scale":
        kwargs["scale"] = math.inf
    elif case == "bad layout":
        kwargs["layout"] = "SBH"
    elif case == "mask dtype":
        kwargs["mask"] = torch.ones(2, 12, dtype=torch.uint8)
    elif case == "mask shape":
        kwargs["mask"] = torch.ones(2, 11, dtype=torch.bool)
    elif case == "not a tensor":
        v = v.tolist()
    with pytest.raises(exc, match=pattern):
        _op(q, k, v, **kwargs)


@pytest.mark.parametrize("api", ["flash_attn_func", "attention"])
def test_public_api_rejects_non_tensors(api):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="flash_cann: v must be a torch.Tensor"):
        getattr(flash_cann, api)(q, k, v.tolist())


def test_public_api_rejects_bad_masks():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="key_padding_mask must be a bool or integer tensor"):
        flash_cann.attention(q, k, v, key_padding_mask=torch.ones(2, 12))
    with pytest.raises(ValueError, match=r"\(batch, seqlen_k\) = \(2, 12\) or \(seqlen_k,\)"):
        flash_cann.attention(q, k, v, key_padding_mask=torch.ones(3, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask must be on the same device"):
        flash_cann.attention(q, k, v, key_padding_mask=torch.ones(12, dtype=torch.bool,
                                                                  device="meta"))


def test_public_api_rejects_bad_layout_arguments():
    q, k, v = _qkv(layout="BSH", heads_q=4, heads_kv=2, head_dim=16)
    with pytest.raises(ValueError, match="num_heads .* is required for layout 'BSH'"):
        flash_cann.attention(q, k, v, layout="BSH")
    with pytest.raises(ValueError, match="num_heads \\* head_dim"):
        flash_cann.attention(q, k, v, layout="BSH", num_heads=5)
    with pytest.raises(ValueError, match="layout must be one of BNSD, BSND, TND, BSH"):
        flash_cann.attention(q, k, v, layout="THD")
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="num_heads=3 does not match q's 4 heads"):
        flash_cann.attention(q, k, v, num_heads=3)


@pytest.mark.parametrize("feature", ["varlen", "kvcache"])
def test_a_backend_without_a_feature_names_itself_and_the_argument(feature):
    """Every backend has every feature today, so a twin without one stands in: the error
    names the backend, the feature and the argument, and which backends have it."""
    twin = spec.load().backends["twin"]
    lacking = dataclasses.replace(twin, features=tuple(f for f in twin.features if f != feature))
    q, k, v = (t.half() for t in _qkv(layout="BSND"))
    match = (f"backend 'twin' .* does not support {feature} yet \\(%s.*backends that do: "
             f"cpu, twin, triton, npu")
    if feature == "varlen":
        cu = torch.tensor([0, 3, 8], dtype=torch.int32)
        with pytest.raises(NotImplementedError, match=match % re.escape("layout='TND'")):
            checks.check_fwd(q[0], k[0], v[0], None, 0.25, False, "TND", lacking,
                             cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    else:
        with pytest.raises(NotImplementedError,
                           match=match % re.escape("torch.ops.flash_cann.fwd_kvcache")):
            checks.check_kvcache(q, k, v, None, None, None, None, None, 0.25, False,
                                 backend=lacking)


def test_packed_shapes_are_checked():
    with pytest.raises(ValueError, match="qkv must have shape"):
        flash_cann.flash_attn_qkvpacked_func(torch.randn(2, 8, 2, 4, 16))
    with pytest.raises(ValueError, match="kv must have shape"):
        flash_cann.flash_attn_kvpacked_func(torch.randn(2, 8, 4, 16), torch.randn(2, 8, 4, 16))


def test_backward_op_rejects_mismatched_lse():
    q, k, v = _qkv()
    out, lse = _op(q, k, v)
    with pytest.raises(ValueError, match=r"softmax_lse must be float32 of shape"):
        torch.ops.flash_cann.bwd(out, q, k, v, out, lse[:, :, :4], None, None, 0.25)
    with pytest.raises(ValueError, match=r"grad_out must match query"):
        torch.ops.flash_cann.bwd(out.half(), q, k, v, out, lse, None, None, 0.25)


def test_errors_surface_at_compile_time():
    """torch.compile traces through the fake kernel, which runs the same checks; dynamo
    raises its TorchRuntimeError with our message, our ValueError in its exception chain
    (as docs/api.md says)."""
    q, k, v = _qkv()

    @torch.compile(fullgraph=True, backend="eager")
    def fn(q_, k_, v_):
        return flash_cann.attention(q_, k_, v_)

    with pytest.raises(torch._dynamo.exc.TorchRuntimeError,
                       match="query heads \\(3\\) must be a multiple") as raised:
        fn(q[:, :3], k, v)
    chain, error = [], raised.value
    while error is not None:
        chain.append(type(error))
        error = error.__cause__ or error.__context__
    assert ValueError in chain, chain


@pytest.mark.parametrize("api, argument, value, message", [
    ("flash_attn_func", "softmax_scale", "0.1", "softmax_scale must be a real number or None "
                                                "(got str '0.1')"),
    ("flash_attn_func", "softmax_scale", True, "softmax_scale must be a real number"),
    ("flash_attn_func", "softcap", True, "softcap must be a real number (got bool True)"),
    ("attention", "scale", "abc", "scale must be a real number or None (got str 'abc')"),
    ("flash_attn_func", "causal", "yes", "causal must be a bool (or 0 / 1) (got str 'yes')"),
    ("attention", "causal", None, "causal must be a bool (or 0 / 1) (got NoneType None)"),
    ("flash_attn_func", "causal", 0.5, "causal must be a bool (or 0 / 1) (got float 0.5)"),
    ("flash_attn_func", "causal", 2, "causal must be a bool (or 0 / 1) (got int 2)"),
    ("attention", "return_lse", "no", "return_lse must be a bool (or 0 / 1) (got str 'no')"),
    ("flash_attn_func", "return_attn_probs", 2, "return_attn_probs must be a bool"),
    ("flash_attn_func", "deterministic", "false", "deterministic must be a bool"),
])
def test_public_api_takes_arguments_strictly(api, argument, value, message):
    q, k, v = _qkv(layout="BSND" if api == "flash_attn_func" else "BNSD")
    with pytest.raises(TypeError, match=re.escape(message)):
        getattr(flash_cann, api)(q, k, v, **{argument: value})


@pytest.mark.parametrize("causal", [np.bool_(True), 1], ids=["numpy-bool", "int-1"])
def test_public_api_takes_flags_as_flash_attn_does(causal):
    """flash-attn's binding converts its flags to bool: a numpy bool or 0 / 1 works."""
    q, k, v = _qkv(layout="BSND")
    torch.testing.assert_close(flash_cann.flash_attn_func(q, k, v, causal=causal),
                               flash_cann.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)
    out, lse, _ = flash_cann.flash_attn_func(q, k, v, return_attn_probs=np.bool_(True))
    assert lse.dim() == 3


def test_a_use_backend_block_refuses_tensors_its_backend_cannot_take():
    q, k, v = _qkv()
    with flash_cann.use_backend("triton"):
        with pytest.raises(ValueError, match="use_backend\\('triton'\\) is active, but the "
                                             "tensors are on device type 'cpu'"):
            flash_cann.attention(q, k, v)
    flash_cann.attention(q, k, v)  # the block is closed: the CPU backend again


def test_backend_for_takes_a_device_or_its_type():
    assert flash_cann.backend_for(torch.device("cpu")).name == "cpu"
    assert flash_cann.backend_for("cpu").name == "cpu"
    with pytest.raises(TypeError, match="backend_for takes a device type"):
        flash_cann.backend_for(0)


_BAD_SINKS = [
    (torch.zeros(4, dtype=torch.float16), r"sinks must be float32 of shape \(nheads,\) = "
                                          r"\(4,\): one logit per query head \(got float16"),
    (torch.zeros(2, 4), r"sinks must be float32 of shape \(nheads,\) = \(4,\).*\(got float32 "
                        r"\(2, 4\)\)"),
    (torch.zeros(2), r"sinks must be float32 of shape \(nheads,\) = \(4,\)"),
    (torch.zeros(4, device="meta"), "sinks must be on the same device as query"),
]


@pytest.mark.parametrize("sinks, message", _BAD_SINKS,
                         ids=["dtype", "per-batch", "per-kv-head", "device"])
def test_bad_sinks_are_refused_by_name(sinks, message):
    """Eagerly, by the forward and backward ops, and at torch.compile trace time."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=message):
        torch.ops.flash_cann.fwd(q, k, v, None, 0.25, sinks=sinks)
    out, lse = _op(q, k, v)
    with pytest.raises(ValueError, match=message):
        torch.ops.flash_cann.bwd(out, q, k, v, out, lse, None, None, 0.25, sinks=sinks)
    if sinks.device.type == "meta":
        return  # the compiled function below would trace on meta tensors itself

    @torch.compile(fullgraph=True, backend="eager")
    def fn(q_, k_, v_, s_):
        return torch.ops.flash_cann.fwd(q_, k_, v_, None, 0.25, sinks=s_)

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=message):
        fn(q, k, v, sinks)


@pytest.mark.parametrize("api", ["flash_attn_func", "attention", "flash_attn_with_kvcache"])
def test_public_api_refuses_sinks_that_are_not_a_tensor_or_not_per_head(api):
    q, k, v = _qkv(layout="BSND")
    layout = {"layout": "BSND"} if api == "attention" else {}
    with pytest.raises(TypeError, match=r"flash_cann: sinks must be a torch.Tensor \(got list\)"):
        getattr(flash_cann, api)(q, k, v, sinks=[0.0] * 4, **layout)
    with pytest.raises(ValueError, match=r"sinks must be float32 of shape \(nheads,\) = \(4,\)"):
        getattr(flash_cann, api)(q, k, v, sinks=torch.zeros(2), **layout)


@pytest.mark.parametrize("dtype, message", [
    (torch.bfloat16, r"fp16_scores=True is refused for bfloat16 inputs: scores held in bfloat16 "
                     r"keep an 8-bit mantissa"),
    (torch.float32, r"fp16_scores=True takes float16 inputs only \(got float32\)"),
])
def test_fp16_scores_is_refused_by_name_for_other_dtypes(dtype, message):
    """The same contract check on every backend (the flag is a permission the cpu backend
    ignores for fp16): eagerly by both ops and the public API, and at trace time."""
    q, k, v = _qkv(dtype=dtype)
    with pytest.raises(ValueError, match=message):
        torch.ops.flash_cann.fwd(q, k, v, None, 0.25, fp16_scores=True)
    out, lse = _op(q, k, v)
    with pytest.raises(ValueError, match=message):
        torch.ops.flash_cann.bwd(out, q, k, v, out, lse, None, None, 0.25, fp16_scores=True)
    with pytest.raises(ValueError, match=message):
        flash_cann.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), fp16_scores=True)

    @torch.compile(fullgraph=True, backend="eager")
    def fn(q_, k_, v_):
        return torch.ops.flash_cann.fwd(q_, k_, v_, None, 0.25, fp16_scores=True)

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=message):
        fn(q, k, v)
    with pytest.raises(TypeError, match=r"fp16_scores must be a bool \(or 0 / 1\) \(got str"):
        flash_cann.flash_attn_func(*(t.transpose(1, 2).half() for t in (q, k, v)),
                                   fp16_scores="yes")


def test_fp16_scores_reaches_the_backward_and_the_cpu_backend_ignores_it():
    """A permission: on the cpu backend (no fp16-score path) results equal the default
    path's bit for bit, forward and backward (autograd hands the flag to bwd)."""
    q, k, v = (t.transpose(1, 2).requires_grad_() for t in _qkv(dtype=torch.float16))
    grads = []
    for fp16_scores in (False, True):
        out = flash_cann.flash_attn_func(q, k, v, causal=True, fp16_scores=fp16_scores)
        grads.append((out, *torch.autograd.grad(out.float().sum(), (q, k, v))))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("api", ["attention", "flash_attn_func"])
def test_head_dim_0_is_named_eagerly_and_at_compile_time(api):
    """head_dim 0 names head_dim and its range (not 'query must not be empty'), through
    the public API's eager shortcut and the compiled trace's fake kernel alike."""
    q, k, v = (t[..., :0] for t in _qkv())
    if api == "flash_attn_func":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    message = r"head_dim must be in \[1, 256\] \(got 0: query's last dim"
    with pytest.raises(ValueError, match=message):
        getattr(flash_cann, api)(q, k, v)

    @torch.compile(fullgraph=True, backend="eager")
    def fn(q_, k_, v_):
        return getattr(flash_cann, api)(q_, k_, v_)

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=message):
        fn(q, k, v)
