"""torchair graph mode: the converters of torch.ops.flash_cann.* against a recording
stand-in of torchair's converter interface (tests/npu_standins/torchair_ge; torchair
itself needs torch_npu and CANN). The stand-in checks what torchair checks, plus what GE
checks against the op proto -- which the tests build from the YAML op spec, read here
independently of flash_cann.contract.spec. Each layout, GQA/MQA, and both ops through
torch.compile (forward and backward graphs)."""

from __future__ import annotations

import dataclasses

import sys
from pathlib import Path

import pytest
import torch

import flash_cann
from flash_cann.contract.spec import load
from flash_cann.integrations import torchair as torchair_converters

import contract
from conftest import make_qkv, random_key_padding_mask

STANDIN = Path(__file__).resolve().parent / "npu_standins" / "torchair_ge"
# How op_host's OpDef declares each spec attribute type (Float(), Bool(), Int(), String()).
PROTO_ATTR_CLASSES = {"float": "Float", "bool": "Bool", "int": "Int", "str": "Str"}
RAW_OPS = contract.OPS


@pytest.fixture
def torchair(monkeypatch):
    """The stand-in imported as `torchair`, knowing the spec's op protos."""
    for name in [m for m in sys.modules if m == "torchair" or m.startswith("torchair.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(STANDIN))
    import torchair as standin
    for op in contract.CANN_OPS:
        standin.ge.register_ir(op["cann_op_type"], standin.ge.IrDef(
            inputs=[(t["name"], bool(t.get("optional", False))) for t in contract.cann_inputs(op)],
            attrs=[(a["name"], PROTO_ATTR_CLASSES[a["type"]]) for a in contract.cann_attrs(op)],
            outputs=[t["name"] for t in contract.cann_outputs(op)]))
    yield standin
    for name in [m for m in sys.modules if m == "torchair" or m.startswith("torchair.")]:
        del sys.modules[name]


@pytest.fixture
def registered(torchair):
    assert torchair_converters.register_if_loaded()
    return torchair


@pytest.fixture
def no_npu_backward(monkeypatch):
    """The spec as it read before the package had an Ascend backward kernel."""
    spec = load()
    monkeypatch.setitem(spec.backends, "npu",
                        dataclasses.replace(spec.backends["npu"], backward=False))


def _ge_inputs(torchair, names):
    return [torchair.ge.Data(name) for name in names]


def _meta_outputs(torchair, op, *args):
    """What torchair passes as meta_outputs: the fake kernel's outputs."""
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    return [torchair.ge.TensorSpec(t) for t in op(*meta)]


# The features' attributes of a plain call: the schema's defaults, as GE attrs.
# The attributes after the shared ones in a plain call: the features', then fp16_scores.
PLAIN_FEATURE_ATTRS = {"max_seqlen_q": ("Int", 0), "max_seqlen_k": ("Int", 0),
                       "window_left": ("Int", -1), "window_right": ("Int", -1),
                       "softcap": ("Float", 0.0), "dropout_p": ("Float", 0.0),
                       "fp16_scores": ("Bool", False)}
PLAIN_FEATURE_INPUTS = {"cu_seqlens_q": None, "cu_seqlens_k": None, "alibi_slopes": None,
                        "rng_state": None, "sinks": None}

FWD_CASES = [  # layout, heads_q, heads_kv, masked, causal, how the FX node passes attributes
    ("BNSD", 4, 4, False, False, "positional"),
    ("BNSD", 8, 2, True, True, "keywords"),
    ("BSND", 6, 3, True, False, "keywords"),
    ("BSND", 4, 1, False, True, "positional"),
    ("BNSD", 2, 2, False, False, "defaults"),
]


@pytest.mark.parametrize("layout, hq, hk, masked, causal, style", FWD_CASES, ids=str)
def test_fwd_converter_emits_the_spec_op(registered, layout, hq, hk, masked, causal, style, gen):
    ge = registered.ge
    q, k, v = make_qkv(2, hq, hk, 5, 7, 16, torch.float16, layout, generator=gen)
    mask = random_key_padding_mask(2, 7, gen) if masked else None
    op = torch.ops.flash_cann.fwd.default
    ge_q, ge_k, ge_v = _ge_inputs(registered, ["q", "k", "v"])
    ge_mask = ge.Data("mask") if masked else None
    if style == "positional":
        args, kwargs = (ge_q, ge_k, ge_v, ge_mask, 0.25, causal, layout), {}
    elif style == "keywords":
        args, kwargs = (ge_q, ge_k, ge_v, ge_mask), dict(scale=0.25, causal=causal, layout=layout)
    else:  # the schema's defaults: causal=False, layout="BNSD"
        args, kwargs = (ge_q, ge_k, ge_v, ge_mask, 0.25), {}
    meta = _meta_outputs(registered, op, q, k, v, mask, 0.25, causal, layout)
    outputs = registered.convert_node(op, args, kwargs, meta)

    node = ge.GRAPH.nodes[-1]
    assert node.type == "FlashCannAttention"
    assert node.inputs == {"query": ge_q, "key": ge_k, "value": ge_v, "key_padding_mask": ge_mask,
                           **PLAIN_FEATURE_INPUTS}
    assert node.attrs == {"scale": ("Float", 0.25), "causal": ("Bool", causal),
                          "layout": ("Str", layout), **PLAIN_FEATURE_ATTRS}
    assert [(o.node, o.index) for o in outputs] == [(node, 0), (node, 1)]
    assert [m.size for m in meta] == [list(q.shape), [2, hq, 5]]


@pytest.mark.parametrize("with_mask, with_grad_lse, deterministic",
                         [(False, False, False), (True, True, True)])
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_bwd_converter_emits_the_spec_op(registered, layout, with_mask, with_grad_lse,
                                        deterministic, gen):
    ge = registered.ge
    q, k, v = make_qkv(1, 6, 2, 4, 9, 8, torch.bfloat16, layout, generator=gen)
    mask = random_key_padding_mask(1, 9, gen) if with_mask else None
    out, lse = torch.ops.flash_cann.fwd(q, k, v, mask, 0.5, True, layout)
    grad_lse = torch.zeros_like(lse) if with_grad_lse else None
    names = ["grad_out", "query", "key", "value", "out", "softmax_lse"]
    tensors = dict(zip(names, _ge_inputs(registered, names)))
    tensors["key_padding_mask"] = ge.Data("mask") if with_mask else None
    tensors["grad_softmax_lse"] = ge.Data("grad_lse") if with_grad_lse else None
    op = torch.ops.flash_cann.bwd.default
    meta = _meta_outputs(registered, op, out, q, k, v, out, lse, mask, grad_lse, 0.5, True, layout,
                         deterministic)
    outputs = registered.convert_node(
        op, tuple(tensors.values()),
        dict(scale=0.5, causal=True, layout=layout, deterministic=deterministic), meta)

    node = next(n for n in ge.GRAPH.nodes[::-1] if n.type == "FlashCannAttentionGrad")
    assert node.inputs == {**tensors, **PLAIN_FEATURE_INPUTS}
    assert node.attrs == {"scale": ("Float", 0.5), "causal": ("Bool", True),
                          "layout": ("Str", layout), "deterministic": ("Bool", deterministic),
                          **PLAIN_FEATURE_ATTRS}
    assert node.outputs == [t["name"] for t in contract.cann_outputs(contract.OPS["bwd"])]
    # The torch op's grad_sinks: the Grad node's while the npu backend lists sinks, else
    # a constant of zeros (its value without sinks).
    assert [m.size for m in meta] == [list(q.shape), list(k.shape), list(v.shape), [6]]
    assert [(o.node, o.index) for o in outputs[:3]] == [(node, 0), (node, 1), (node, 2)]
    if "sinks" in contract.NPU_FEATURES:  # the Grad node's own output, zeros without sinks
        assert (outputs[3].node, outputs[3].index) == (node, 3)
    else:
        assert outputs[3].node.type == "Const"
        assert outputs[3].node.attrs["value"] == ("Tensor", [0.0] * 6)


def test_converters_carry_the_features_to_the_ge_nodes(registered, gen):
    """window, softcap, ALiBi slopes, dropout (rng_state) and sinks on both nodes, as the
    FX node has them: the window as the user wrote it (op_host normalises it as the checks
    do), the window bounds as ge.attr.Int, softcap and dropout_p as ge.attr.Float, the
    slopes, rng_state and sinks as the optional inputs after the op's own; the Grad node
    outputs grad_sinks."""
    ge = registered.ge
    q, k, v = make_qkv(2, 4, 2, 5, 7, 16, torch.float16, "BNSD", generator=gen)
    slopes, rng_state, sinks = torch.rand(2, 4), torch.tensor([7, 0]), torch.randn(4)
    features = dict(window_left=3, window_right=1, softcap=30.0, dropout_p=0.125,
                    fp16_scores=True)
    fwd = torch.ops.flash_cann.fwd.default
    names = ["query", "key", "value", "alibi_slopes", "rng_state", "sinks"]
    ge_in = dict(zip(names, _ge_inputs(registered, names)))
    optional = {n: ge_in[n] for n in ("alibi_slopes", "rng_state", "sinks")}
    meta = _meta_outputs(registered, fwd, q, k, v, None, 0.25)
    registered.convert_node(fwd, (ge_in["query"], ge_in["key"], ge_in["value"], None, 0.25),
                            dict(**optional, **features), meta)
    node = ge.GRAPH.nodes[-1]
    assert node.inputs == {**{n: ge_in[n] for n in names[:3]}, "key_padding_mask": None,
                           "cu_seqlens_q": None, "cu_seqlens_k": None, **optional}
    assert node.attrs == {"scale": ("Float", 0.25), "causal": ("Bool", False),
                          "layout": ("Str", "BNSD"), "max_seqlen_q": ("Int", 0),
                          "max_seqlen_k": ("Int", 0), "window_left": ("Int", 3),
                          "window_right": ("Int", 1), "softcap": ("Float", 30.0),
                          "dropout_p": ("Float", 0.125), "fp16_scores": ("Bool", True)}

    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.25, alibi_slopes=slopes,
                                        rng_state=rng_state, sinks=sinks, **features)
    bwd = torch.ops.flash_cann.bwd.default
    grads = ["grad_out", "out", "softmax_lse"]
    ge_in.update(zip(grads, _ge_inputs(registered, grads)))
    meta = _meta_outputs(registered, bwd, out, q, k, v, out, lse, None, None, 0.25)
    outputs = registered.convert_node(
        bwd, tuple(ge_in[n] for n in ["grad_out", "query", "key", "value", "out",
                                      "softmax_lse"]) + (None, None),
        dict(scale=0.25, **optional, **features), meta)
    node = next(n for n in ge.GRAPH.nodes[::-1] if n.type == "FlashCannAttentionGrad")
    assert list(node.inputs)[-3:] == ["alibi_slopes", "rng_state", "sinks"]
    assert {n: node.inputs[n] for n in optional} == optional
    assert node.outputs == ["grad_query", "grad_key", "grad_value", "grad_sinks"]
    assert [(o.node, o.index) for o in outputs] == [(node, i) for i in range(4)]
    assert {k: node.attrs[k] for k in features} == {
        "window_left": ("Int", 3), "window_right": ("Int", 1), "softcap": ("Float", 30.0),
        "dropout_p": ("Float", 0.125), "fp16_scores": ("Bool", True)}


@pytest.mark.parametrize("name, value, kind", [
    ("window_left", 2.0, "int"), ("window_right", True, "int"), ("softcap", "30", "float"),
    ("dropout_p", torch.tensor(0.1), "float"),
])
def test_feature_attribute_of_the_wrong_type_is_refused(registered, name, value, kind):
    """A GE attr takes a constant of its proto type: an int window bound, a float softcap."""
    convert = torch.ops.flash_cann.fwd.default._ge_converter
    with pytest.raises(TypeError, match=f"attribute {name!r} must be a Python {kind}"):
        convert(*_ge_inputs(registered, "qkv"), None, 0.25, **{name: value},
                meta_outputs=[None, None])


def test_compiled_model_with_features_lowers_both_ops(registered, gen):
    """torch.compile of a model with every feature: both graphs' nodes carry them (the
    backward gets the forward's rng_state, slopes and sinks through autograd, and its
    grad_sinks output becomes the sinks' gradient)."""
    ge = registered.ge
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 4, 2, 6, 10, 16, torch.float32, "BSND",
                                                    generator=gen))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    sinks = torch.randn(4, generator=gen).requires_grad_()

    def model(q_, k_, v_, sinks_):
        a = flash_cann.flash_attn_func(q_, k_, v_, dropout_p=0.25, causal=True,
                                       window_size=(4, 0), softcap=20.0, alibi_slopes=slopes)
        b, _ = torch.ops.flash_cann.fwd(q_, k_, v_, None, 0.25, False, "BSND", sinks=sinks_)
        return a.sum() + b.sum()

    torch._dynamo.reset()
    ge.GRAPH.reset()
    compiled = torch.compile(model, backend=registered.get_npu_backend(), fullgraph=True)
    grads = torch.autograd.grad(compiled(q, k, v, sinks), (q, k, v, sinks))
    emitted = [n for n in ge.GRAPH.nodes if n.type.startswith("FlashCann")]
    assert sorted(n.type for n in emitted) == ["FlashCannAttention"] * 2 + [
        "FlashCannAttentionGrad"] * 2
    featured = [n for n in emitted if n.inputs["sinks"] is None]
    with_sinks = [n for n in emitted if n.inputs["sinks"] is not None]
    assert len(featured) == len(with_sinks) == 2
    for node in featured:
        assert {k: node.attrs[k][1] for k in ("causal", "window_left", "softcap", "dropout_p")} == {
            "causal": True, "window_left": 4, "softcap": 20.0, "dropout_p": 0.25}, node.type
        assert node.inputs["alibi_slopes"] is not None and node.inputs["rng_state"] is not None
    for node in with_sinks:
        assert node.attrs["dropout_p"][1] == 0.0 and node.inputs["rng_state"] is None
    grad_node = next(n for n in with_sinks if n.type == "FlashCannAttentionGrad")
    assert grad_node.outputs[-1] == "grad_sinks"
    # the stand-in then runs the graph: the sinks' gradient is the op's
    torch.testing.assert_close(grads[3], torch.autograd.grad(model(q, k, v, sinks), sinks)[0])


def test_bwd_converter_refuses_when_the_spec_says_there_is_no_ascend_backward_kernel(
        registered, no_npu_backward, gen):
    """With npu.backward false in the spec, converting a backward node fails at compile
    time with the reason, not later inside GE."""
    q, k, v = make_qkv(1, 2, 2, 4, 4, 8, torch.bfloat16, "BNSD", generator=gen)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.5, False, "BNSD")
    ge_inputs = _ge_inputs(registered, ["grad_out", "query", "key", "value", "out", "lse"])
    op = torch.ops.flash_cann.bwd.default
    meta = _meta_outputs(registered, op, out, q, k, v, out, lse, None, None, 0.5, False, "BNSD")
    with pytest.raises(NotImplementedError, match="FlashCannAttentionGrad has no Ascend kernel"):
        registered.convert_node(op, (*ge_inputs, None, None),
                                dict(scale=0.5, causal=False, layout="BNSD"), meta)


def test_compiled_inference_lowers_the_forward_op(registered, gen):
    """Today's use of graph mode: forward (inference) graphs."""
    ge = registered.ge
    q, k, v = make_qkv(1, 4, 2, 6, 10, 16, torch.float32, "BSND", generator=gen)
    torch._dynamo.reset()
    ge.GRAPH.reset()
    compiled = torch.compile(lambda a, b, c: flash_cann.flash_attn_func(a, b, c, causal=True),
                             backend=registered.get_npu_backend(), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), flash_cann.flash_attn_func(q, k, v, causal=True))
    assert [n.type for n in ge.GRAPH.nodes if n.type.startswith("FlashCann")] == [
        "FlashCannAttention"]


def test_compiled_model_lowers_both_ops_for_each_layout_and_gqa(registered, gen):
    """torch.compile through the stand-in backend: forward and backward graphs, the FX
    args as AOT autograd really passes them, meta_outputs from the fake kernels."""
    ge = registered.ge
    q, k, v = make_qkv(2, 4, 2, 6, 10, 16, torch.float32, "BSND", generator=gen)
    mask = random_key_padding_mask(2, 10, gen)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def model(q_, k_, v_):
        a = flash_cann.flash_attn_func(q_, k_, v_, causal=True, deterministic=True)  # BSND
        b = flash_cann.attention(q_.transpose(1, 2), k_.transpose(1, 2), v_.transpose(1, 2),
                                 layout="BNSD", key_padding_mask=mask)            # BNSD, GQA
        c = flash_cann.attention(q_.flatten(-2), k_[:, :, :1].flatten(-2),
                                 v_[:, :, :1].flatten(-2), layout="BSH", num_heads=4)  # MQA
        return a.sum() + b.sum() + c.sum()

    torch._dynamo.reset()
    ge.GRAPH.reset()
    compiled = torch.compile(model, backend=registered.get_npu_backend(), fullgraph=True)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))

    assert ge.GRAPH.graphs == 2  # forward and backward
    emitted = [n for n in ge.GRAPH.nodes if n.type.startswith("FlashCann")]
    summary = [(n.type, n.attrs["layout"][1], n.attrs["causal"][1],
                n.inputs["key_padding_mask"] is not None) for n in emitted]
    expected = [("BSND", True, False), ("BNSD", False, True), ("BSND", False, False)]
    assert sorted(summary) == sorted([("FlashCannAttention", *e) for e in expected]
                                     + [("FlashCannAttentionGrad", *e) for e in expected])
    # deterministic reaches the Grad node through autograd; the forward node has no such attr.
    assert sorted((n.attrs["layout"][1], n.attrs["causal"][1], n.attrs["deterministic"][1])
                  for n in emitted if n.type == "FlashCannAttentionGrad") == [
        ("BNSD", False, False), ("BSND", False, False), ("BSND", True, True)]
    assert not any("deterministic" in n.attrs for n in emitted if n.type == "FlashCannAttention")
    torch.testing.assert_close(loss, model(q, k, v))  # the stand-in then runs the graph
    for got, want in zip(grads, torch.autograd.grad(model(q, k, v), (q, k, v))):
        torch.testing.assert_close(got, want)


def test_symbolic_attribute_is_refused_with_the_reason(registered):
    """A scale that reaches the converter as a graph value cannot become a GE attr."""
    ge_q, ge_k, ge_v, ge_scale = _ge_inputs(registered, ["q", "k", "v", "scale"])
    convert = torch.ops.flash_cann.fwd.default._ge_converter
    with pytest.raises(TypeError, match=r"attribute 'scale' must be a Python float .* got "
                                        r"Tensor .*pass it as a constant"):
        convert(ge_q, ge_k, ge_v, None, ge_scale, False, "BNSD", meta_outputs=[None, None])
    with pytest.raises(TypeError, match="attribute 'scale' must be a Python float"):
        convert(ge_q, ge_k, ge_v, None, True, False, "BNSD", meta_outputs=[None, None])


def test_meta_output_count_is_checked(registered):
    ge_q, ge_k, ge_v = _ge_inputs(registered, ["q", "k", "v"])
    convert = torch.ops.flash_cann.fwd.default._ge_converter
    with pytest.raises(ValueError, match="FlashCannAttention has 2 outputs, torchair passed 3"):
        convert(ge_q, ge_k, ge_v, None, 0.5, meta_outputs=[None] * 3)


@pytest.mark.parametrize("break_it, message", [
    (lambda kw: kw["attrs"].update(scale=0.5), r"attr 'scale' must be a ge.attr.X\(value\)"),
    (lambda kw: kw["attrs"].update(causal=kw["ge"].attr.Int(1)),
     "attr 'causal' is ge.attr.Bool in the proto, got ge.attr.Int"),
    (lambda kw: kw["inputs"].pop("key_padding_mask"), "inputs .* must be the proto's, in order"),
    (lambda kw: kw.update(outputs=["softmax_lse", "out"]), "outputs .* must be the proto's"),
    (lambda kw: kw["inputs"].update(query=None), "required input 'query' is None"),
    (lambda kw: kw["attrs"].update(window_left=kw["ge"].attr.Float(3.0)),
     "attr 'window_left' is ge.attr.Int in the proto, got ge.attr.Float"),
    (lambda kw: kw["attrs"].pop("dropout_p"), "attrs .* must be the proto's"),
    (lambda kw: kw["inputs"].update(rng_state=kw["inputs"].pop("alibi_slopes")),
     "inputs .* must be the proto's, in order"),
])
def test_standin_rejects_what_ge_would(registered, break_it, message):
    """The stand-in is strict: a converter that got the proto wrong would fail here."""
    ge = registered.ge
    kw = {"ge": ge, "inputs": dict(zip(["query", "key", "value"], _ge_inputs(registered, "qkv"))),
          "attrs": {"scale": ge.attr.Float(0.5), "causal": ge.attr.Bool(False),
                    "layout": ge.attr.Str("BNSD"), "max_seqlen_q": ge.attr.Int(0),
                    "max_seqlen_k": ge.attr.Int(0), "window_left": ge.attr.Int(-1),
                    "window_right": ge.attr.Int(-1), "softcap": ge.attr.Float(0.0),
                    "dropout_p": ge.attr.Float(0.0), "fp16_scores": ge.attr.Bool(False)},
          "outputs": ["out", "softmax_lse"]}
    kw["inputs"].update(key_padding_mask=None, **PLAIN_FEATURE_INPUTS)
    ge.custom_op("FlashCannAttention", inputs=kw["inputs"], outputs=kw["outputs"],
                 attrs=kw["attrs"])  # as given: accepted
    break_it(kw)
    with pytest.raises(AssertionError, match=message):
        ge.custom_op("FlashCannAttention", inputs=kw["inputs"], outputs=kw["outputs"],
                     attrs=kw["attrs"])


def test_unknown_op_type_is_refused_like_ge(registered):
    with pytest.raises(RuntimeError, match="No AscendIR FlashCannAttentionV9 was found"):
        registered.ge.custom_op("FlashCannAttentionV9", inputs={}, outputs=[], attrs={})


def test_registration_needs_torchair_loaded_or_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchair", None)  # `import torchair` fails
    monkeypatch.setattr(torchair_converters, "_registered_with", None)
    with pytest.raises(ImportError, match=r"enable_torchair\(\) needs torchair, which ships "
                                          r"with torch_npu.*install torch_npu"):
        torchair_converters.enable_torchair()
    monkeypatch.delitem(sys.modules, "torchair")
    assert not torchair_converters.register_if_loaded()


def test_enable_torchair_registers_every_spec_op(torchair):
    torchair_converters.enable_torchair()
    for name in RAW_OPS:
        converter = getattr(torch.ops.flash_cann, name).default._ge_converter
        assert converter.require_meta


def test_packed_sequences_reach_both_nodes(registered, gen):
    """Layout TND: cu_seqlens_q/k as the nodes' optional inputs (tensors the kernel reads on
    the device), max_seqlen_q/k as ge.attr.Int, the layout passed through; the Grad node's
    softmax_lse is (heads_q, tokens_q)."""
    ge = registered.ge
    q, k, v = (torch.randn(t, h, 16, generator=gen).half() for t, h in ((9, 4), (12, 2), (12, 2)))
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 12],
                                                                         dtype=torch.int32)
    packed = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=7)
    names = ["query", "key", "value", "cu_seqlens_q", "cu_seqlens_k"]
    ge_in = dict(zip(names, _ge_inputs(registered, names)))
    fwd = torch.ops.flash_cann.fwd.default
    meta = [registered.ge.TensorSpec(t) for t in fwd(*(x.to("meta") for x in (q, k, v)), None,
                                                     0.25, True, "TND",
                                                     cu_seqlens_q=cu_q.to("meta"),
                                                     cu_seqlens_k=cu_k.to("meta"),
                                                     max_seqlen_q=5, max_seqlen_k=7)]
    registered.convert_node(fwd, (ge_in["query"], ge_in["key"], ge_in["value"], None, 0.25, True,
                                  "TND"),
                            dict(cu_seqlens_q=ge_in["cu_seqlens_q"],
                                 cu_seqlens_k=ge_in["cu_seqlens_k"], max_seqlen_q=5,
                                 max_seqlen_k=7), meta)
    node = ge.GRAPH.nodes[-1]
    assert node.type == "FlashCannAttention"
    assert {n: node.inputs[n] for n in names} == ge_in
    assert {n: node.attrs[n] for n in ("layout", "max_seqlen_q", "max_seqlen_k")} == {
        "layout": ("Str", "TND"), "max_seqlen_q": ("Int", 5), "max_seqlen_k": ("Int", 7)}
    assert list(meta[1].size) == [4, 9]  # softmax_lse (heads_q, tokens_q)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.25, True, "TND", **packed)
    bwd = torch.ops.flash_cann.bwd.default
    grads = ["grad_out", "out", "softmax_lse"]
    ge_in.update(zip(grads, _ge_inputs(registered, grads)))
    meta = _meta_outputs(registered, bwd, out, q, k, v, out, lse, None, None, 0.25, True, "TND",
                         False, False, cu_q, cu_k, None, None, None, 5, 7)
    registered.convert_node(
        bwd, tuple(ge_in[n] for n in ["grad_out", "query", "key", "value", "out",
                                      "softmax_lse"]) + (None, None, 0.25, True, "TND"),
        dict(cu_seqlens_q=ge_in["cu_seqlens_q"], cu_seqlens_k=ge_in["cu_seqlens_k"],
             max_seqlen_q=5, max_seqlen_k=7), meta)
    node = next(n for n in ge.GRAPH.nodes[::-1] if n.type == "FlashCannAttentionGrad")
    assert {n: node.inputs[n] for n in ("cu_seqlens_q", "cu_seqlens_k")} == {
        n: ge_in[n] for n in ("cu_seqlens_q", "cu_seqlens_k")}
    assert node.attrs["max_seqlen_k"] == ("Int", 7) and node.attrs["layout"] == ("Str", "TND")


@pytest.fixture
def no_npu_varlen(monkeypatch):
    """The spec as it read before the Ascend kernels had packed sequences (the CANN ops'
    arguments follow the npu backend's features)."""
    spec = load()
    features = tuple(f for f in spec.backends["npu"].features if f != "varlen")
    monkeypatch.setitem(spec.backends, "npu",
                        dataclasses.replace(spec.backends["npu"], features=features))
    for name, op in list(spec.ops.items()):
        monkeypatch.setitem(spec.ops, name, dataclasses.replace(op, cann_features=frozenset(features)))


@pytest.mark.parametrize("feature, kwargs", [("varlen", dict(max_seqlen_q=8))])
def test_features_the_ascend_op_lacks_are_refused_at_conversion(no_npu_varlen, registered,
                                                                 feature, kwargs):
    """The CANN op has only the npu backend's features: a graph that uses another must not
    be converted into an op that silently drops it (here varlen, as before the Ascend
    kernels had it)."""
    ge = registered.ge
    args = (*_ge_inputs(registered, ["q", "k", "v"]), None, 0.25)
    converter = torch.ops.flash_cann.fwd.default._ge_converter
    with pytest.raises(NotImplementedError, match=f"does not support {feature} yet .* backends "
                                                  f"with it: cpu, twin, triton"):
        converter(*args, **kwargs, meta_outputs=[None, None])
    assert not any(n.type == "FlashCannAttention" for n in ge.GRAPH.nodes)


def test_an_op_without_an_ascend_kernel_is_refused_at_conversion(registered):
    """The spec as it read before the decode kernel: fwd_kvcache was not a CANN op."""
    spec = load()
    op = spec.ops["fwd_kvcache"]
    op = dataclasses.replace(op, cann_features=op.cann_features - {"kvcache"})
    converter = torchair_converters.converter_for(op, registered.ge)
    with pytest.raises(NotImplementedError, match=r"fwd_kvcache \(kvcache\) has no Ascend "
                                                  r"kernel yet"):
        converter(*_ge_inputs(registered, ["q", "kc", "vc"]), None, None, None, None, None,
                  0.25, meta_outputs=[None, None])


def test_kvcache_converter_emits_the_decode_op_for_vllms_call(registered):
    """vLLM's shape (the cache written beforehand, cache_seqlens = seqused_k, a block
    table): one FlashCannAttentionKVCache node with the spec's inputs and attributes."""
    ge = registered.ge
    q, kc, vc, lengths, table = _ge_inputs(registered, ["q", "kc", "vc", "lengths", "table"])
    converter = torch.ops.flash_cann.fwd_kvcache.default._ge_converter
    outputs = converter(q, kc, vc, None, None, lengths, None, table, None, 0.125, True,
                        window_left=64, softcap=30.0, meta_outputs=[None, None])
    node = ge.GRAPH.nodes[-1]
    assert node.type == "FlashCannAttentionKVCache"
    assert node.inputs == {"query": q, "k_cache": kc, "v_cache": vc, "key": None, "value": None,
                           "cache_seqlens": lengths, "cache_batch_idx": None, "block_table": table,
                           "cache_leftpad": None, "cu_seqlens_q": None, "alibi_slopes": None,
                           "sinks": None}
    assert node.attrs == {"scale": ("Float", 0.125), "causal": ("Bool", True),
                          "layout": ("Str", "BSND"), "max_seqlen_q": ("Int", 0),
                          "window_left": ("Int", 64),
                          "window_right": ("Int", -1), "softcap": ("Float", 30.0),
                          "num_splits": ("Int", 0)}
    assert [(o.node, o.index) for o in outputs] == [(node, 0), (node, 1)]


@pytest.mark.parametrize("appends, message", [(True, "does not convert the append"),
                                              (False, "needs cache_seqlens")])
def test_kvcache_converter_refuses_what_the_decode_op_does_not_do(registered, appends, message):
    ge = registered.ge
    q, kc, vc, k, v, lengths = _ge_inputs(registered, ["q", "kc", "vc", "k", "v", "lengths"])
    converter = torch.ops.flash_cann.fwd_kvcache.default._ge_converter
    args = (k, v, lengths) if appends else (None, None, None)
    with pytest.raises(NotImplementedError, match=message):
        converter(q, kc, vc, *args, None, None, None, 0.125, meta_outputs=[None, None])
    assert not any(n.type == "FlashCannAttentionKVCache" for n in ge.GRAPH.nodes)
