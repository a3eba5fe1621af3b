"""The op specification is the contract, tested in one place: the registered
torch.library schemas, the generated C++ contract header and the declared output shapes
must say exactly what op_project/flash_cann_ops.yaml says, and a malformed spec must fail
loudly. (The OpDef, aclnn and torchair artefacts are compared with the same raw YAML,
tests/contract.py, by their own modules, which build them.)"""

from __future__ import annotations

import copy

import pytest
import torch

import flash_cann  # noqa: F401  (registers torch.ops.flash_cann)
from flash_cann.ascend import contract_header
from flash_cann.contract import spec
from flash_cann.contract.checks import check_fwd

from contract import OPS as RAW_OPS
from contract import PATH, RAW
from conftest import make_qkv

SCHEMA_TYPES = {"float": "float", "bool": "bool", "int": "int", "str": "str"}


def _raw():
    return copy.deepcopy(RAW)


def _attr(doc, op: int, name: str) -> dict:
    return next(a for a in doc["ops"][op]["attrs"] if a["name"] == name)


def _schema_order(entry: dict) -> list[dict]:
    """The schema's argument order: the core inputs and attributes (the CANN op's order),
    then the features' inputs and attributes."""
    args = entry["inputs"] + entry["attrs"]
    return [a for a in args if "feature" not in a] + [a for a in args if "feature" in a]


def test_packaged_spec_is_a_link_to_the_op_project_spec():
    """The package ships the spec through a link (a copy could drift from op_project/)."""
    assert spec.SPEC_PATH.is_symlink() and spec.SPEC_PATH.resolve() == PATH


def test_generated_contract_header_is_up_to_date():
    """op_host/flash_cann_contract.h (the OpDef indices, layouts, dtypes and head_dim
    limits the C++ uses) is what the generator makes of the spec now."""
    assert contract_header.HEADER.read_text() == contract_header.render(spec.load()), (
        "regenerate with: python -m flash_cann.ascend.contract_header")


def test_contract_header_follows_the_spec():
    """Every op, input, attribute and output of the spec appears, in spec order."""
    doc = _raw()
    doc["ops"][1]["attrs"].append({"name": "window_size", "type": "int", "default": -1})
    doc["limits"]["head_dim"]["max"] = 512
    header = contract_header.render(spec.parse(doc))
    assert "constexpr int64_t kHeadDimMax = 512;" in header
    bwd = header[header.index("namespace bwd {"):]
    attrs = bwd[bwd.index("namespace attr {"):bwd.index("}  // namespace attr")]
    assert "kLayout = 2," in attrs and "kDeterministic = 3," in attrs
    # the npu backend's features' attributes, in spec order (varlen's first)
    assert "kMaxSeqlenQ = 4,\n    kMaxSeqlenK = 5," in attrs
    assert ("kWindowLeft = 6,\n    kWindowRight = 7,\n    kSoftcap = 8,\n    kDropoutP = 9,"
            in attrs)
    assert "kFp16Scores = 10," in attrs  # no feature's: every op with it has it last
    assert "kWindowSize = 11," in attrs and "kCount = 12;" in attrs
    fwd = header[header.index("namespace fwd {"):header.index("namespace bwd {")]
    assert "kDeterministic" not in fwd  # autograd-only: the CANN op does not have it
    inputs = bwd[bwd.index("namespace input {"):bwd.index("}  // namespace input")]
    assert "kGradOut = 0," in inputs and "kGradSoftmaxLse = 7," in inputs
    assert "kCuSeqlensQ = 8," in inputs and "kCuSeqlensK = 9," in inputs
    assert "kAlibiSlopes = 10," in inputs and "kRngState = 11," in inputs
    assert "kSinks = 12," in inputs and "kCount = 13;" in inputs
    outputs = bwd[bwd.index("namespace output {"):bwd.index("}  // namespace output")]
    assert "kGradValue = 2,\n    kGradSinks = 3," in outputs and "kCount = 4;" in outputs
    # a feature the npu backend does not list leaves the CANN op: its attributes, inputs
    # and outputs
    doc["backends"]["npu"]["features"].remove("softcap")
    doc["backends"]["npu"]["features"].remove("sinks")
    doc["backends"]["npu"]["features"].remove("varlen")
    header = contract_header.render(spec.parse(doc))
    assert "kSoftcap" not in header and "kSinks" not in header and "kGradSinks" not in header
    assert "kMaxSeqlenQ" not in header and "kCuSeqlensQ" not in header
    assert "kLayoutTND" not in header and "kLayoutCount = 2;" in header


@pytest.mark.parametrize("op", [o["name"] for o in RAW["ops"]])
def test_registered_schema_matches_yaml(op):
    """Compares the live schema with the YAML itself, not with spec.py's derivation."""
    entry = next(o for o in RAW["ops"] if o["name"] == op)
    schema = getattr(torch.ops.flash_cann, op).default._schema
    args = list(schema.arguments)
    declared = _schema_order(entry)
    assert [a.name for a in args] == [a["name"] for a in declared]
    inputs = {t["name"] for t in entry["inputs"]}
    for arg, item in zip(args, declared):
        if item["name"] in inputs:
            assert str(arg.type) == ("Optional[Tensor]" if item.get("optional") else "Tensor")
            # Only the inputs the spec marks mutable are written in place.
            assert bool(arg.alias_info and arg.alias_info.is_write) == item.get("mutable", False)
        else:
            assert str(arg.type) == SCHEMA_TYPES[item["type"]]
            assert arg.has_default_value() == ("default" in item)
            if "default" in item:
                assert arg.default_value == item["default"]
    assert [r.name for r in schema.returns] == [t["name"] for t in entry["outputs"]]
    assert all(str(r.type) == "Tensor" for r in schema.returns)


def test_layout_choices_are_the_declared_layouts():
    # fwd and bwd take every layout; fwd_kvcache's query is BSND or TND (its caches are
    # BSND-shaped).
    for entry in RAW["ops"]:
        layout = next((a for a in entry["attrs"] if a["name"] == "layout"), None)
        if entry["name"] == "fwd_kvcache":
            assert layout["choices"] == ["BSND", "TND"]
        else:
            assert layout is None or layout["choices"] == list(RAW["layouts"])


def test_autograd_only_attributes_are_the_torch_ops_not_the_cann_ops():
    s = spec.load()
    assert [a.name for a in s.ops["fwd"].attrs if not a.feature] == ["scale", "causal", "layout",
                                                                    "deterministic",
                                                                    "fp16_scores"]
    features = ["max_seqlen_q", "max_seqlen_k", "window_left", "window_right", "softcap",
                "dropout_p"]
    assert [a.name for a in s.ops["fwd"].cann_attrs] == ["scale", "causal", "layout", *features,
                                                         "fp16_scores"]
    assert [a.name for a in s.ops["bwd"].cann_attrs] == ["scale", "causal", "layout",
                                                         "deterministic", *features,
                                                         "fp16_scores"]


def test_backward_pairing_is_declared():
    s = spec.load()
    assert s.ops["fwd"].backward == "bwd"
    assert [t.name for t in s.ops["bwd"].outputs] == ["grad_query", "grad_key", "grad_value",
                                                      "grad_sinks"]


def _declared_shape(tensor: dict, sizes: dict, tensors: dict, layout: str) -> tuple:
    shape = tensor["shape"]
    if isinstance(shape, dict):
        shape = shape.get(layout, shape["default"])
    if isinstance(shape, str):
        return tuple(tensors[shape.removeprefix("like ")].shape)
    return tuple(sizes[size] for size in shape)


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_tensors_have_their_declared_shapes(layout, gen):
    """The YAML's `shape:` of every tensor that has one: what the ops return, and what
    the backward op is given (the forward's outputs, the mask)."""
    q, k, v = make_qkv(2, 4, 2, 5, 7, 8, torch.float32, layout, generator=gen)
    mask = torch.ones(2, 7, dtype=torch.bool)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, mask, 0.3, True, layout)
    fwd = {"query": q, "key": k, "value": v, "key_padding_mask": mask, "out": out,
           "softmax_lse": lse}
    grads = torch.ops.flash_cann.bwd(out, q, k, v, out, lse, mask, lse, 0.3, True, layout)
    bwd = {**fwd, "grad_out": out, "grad_softmax_lse": lse,
           **dict(zip(("grad_query", "grad_key", "grad_value", "grad_sinks"), grads))}
    p = check_fwd(q, k, v, mask, 0.3, True, layout)
    sizes = {name: getattr(p, name) for name in ("batch", "heads_q", "heads_kv", "seqlen_q",
                                                 "seqlen_k", "head_dim")}
    # grad_sinks has its shape without sinks too (zeros).
    assert _shaped_tensors_match(fwd, bwd, sizes, layout) == 10


def _shaped_tensors_match(fwd: dict, bwd: dict, sizes: dict, layout: str) -> int:
    """Assert every given tensor with a declared shape has it; return how many."""
    shaped = 0
    for op, tensors in (("fwd", fwd), ("bwd", bwd)):
        for tensor in RAW_OPS[op]["inputs"] + RAW_OPS[op]["outputs"]:
            if "shape" in tensor and tensors.get(tensor["name"]) is not None:
                assert tuple(tensors[tensor["name"]].shape) == _declared_shape(
                    tensor, sizes, tensors, layout), (op, tensor["name"])
                shaped += 1
    return shaped


def test_packed_tensors_have_their_declared_shapes(gen):
    """The same for layout TND (packed sequences) with the features' inputs."""
    lengths_q, lengths_k = [3, 5, 1], [4, 2, 6]
    cu_q = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 12], dtype=torch.int32)
    q = torch.randn(9, 4, 8, generator=gen)
    k, v = (torch.randn(12, 2, 8, generator=gen) for _ in range(2))
    rng_state = torch.tensor([7, 0])
    features = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, rng_state=rng_state,
                    sinks=torch.randn(4, generator=gen),
                    max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k), dropout_p=0.25)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.3, True, "TND", **features)
    fwd = {"query": q, "key": k, "value": v, "out": out, "softmax_lse": lse, **features}
    grads = torch.ops.flash_cann.bwd(out, q, k, v, out, lse, None, lse, 0.3, True, "TND",
                                     **features)
    bwd = {**fwd, "grad_out": out, "grad_softmax_lse": lse,
           **dict(zip(("grad_query", "grad_key", "grad_value", "grad_sinks"), grads))}
    sizes = {"heads_q": 4, "tokens_q": 9, "batch_plus_one": 4, "two": 2}
    assert _shaped_tensors_match(fwd, bwd, sizes, "TND") == 16


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["ops"][0].update(typo=1), r"ops\[0\]: unknown key\(s\) \['typo'\]"),
    (lambda d: _attr(d, 0, "causal").update(default="yes"), "default 'yes' is not a bool"),
    (lambda d: _attr(d, 0, "layout").update(default="SBH"), "not among choices"),
    (lambda d: d["ops"][0]["inputs"][0].update(dtype="int8"), "dtype must be one of"),
    (lambda d: d["ops"][0].update(backward="nope"), "backward 'nope' is not a declared op"),
    (lambda d: _attr(d, 0, "layout")["choices"].append("SBH"), "layout choices"),
    (lambda d: d.pop("limits"), r"missing key\(s\) \['limits'\]"),
    (lambda d: d["backends"]["cpu"].pop("device_type"), "backends.cpu: missing key"),
    (lambda d: d["ops"][0]["outputs"][1].update(shape=["batch", "heads"]),
     "softmax_lse's shape .* must be a list of"),
    (lambda d: d["ops"][0]["outputs"][0].update(shape="like queries"), "or 'like <input>'"),
    (lambda d: d["ops"][1]["inputs"][0].update(name="d_out"), "input 'd_out' is neither"),
    (lambda d: d["ops"][1]["outputs"][0].update(name="dq"), "output 'dq' must be grad_<input"),
    (lambda d: d["backends"]["triton"].update(also_on={"cuda": "triton"}),
     r"backends.triton.also_on: expected \{other device type: module name\}"),
    (lambda d: d["backends"]["triton"].update(also_on={"npu": "triton-npu"}),
     "backends.triton.also_on: expected"),
    # fwd's deterministic is autograd_only: it must reach bwd's attribute of that name.
    (lambda d: _attr(d, 0, "deterministic").pop("default"),
     "autograd_only attribute needs a default"),
    (lambda d: d["ops"][1]["attrs"].remove(_attr(d, 1, "deterministic")),
     r"'deterministic' must be a bool attribute of its backward op \(bwd\)"),
    (lambda d: _attr(d, 1, "deterministic").update(type="int", default=0),
     "must be a bool attribute"),
    (lambda d: _attr(d, 1, "deterministic").update(autograd_only=True),
     "must be a bool attribute"),
    # Features: known names only; their arguments need defaults (or to be optional).
    (lambda d: _attr(d, 0, "softcap").update(feature="softcapping"), "feature must be one of"),
    (lambda d: _attr(d, 0, "softcap").pop("default"), "an attribute of a feature needs a default"),
    (lambda d: d["ops"][0]["inputs"][4].pop("optional"), "an input of a feature must be optional"),
    (lambda d: d["backends"]["cpu"].update(features=["paging"]), r"unknown \['paging'\]"),
    (lambda d: d["backends"]["triton"].update(also_on_features={"npu": ["paging"]}),
     "also_on_features: expected a subset of its features"),
    (lambda d: d["backends"]["cpu"].update(also_on_features={"npu": []}),
     "also_on_features: expected a subset"),
    (lambda d: d["ops"][0]["outputs"][1].update(shape={"TND": ["heads_q"]}),
     "softmax_lse's shape .* must be a list of"),
    (lambda d: d["ops"][0].pop("backward"), r"of its backward op \(none declared\)"),
])
def test_malformed_spec_is_rejected(mutate, message):
    doc = _raw()
    mutate(doc)
    with pytest.raises(spec.SpecError, match=message):
        spec.parse(doc)
