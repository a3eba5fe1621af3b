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
from flash_cann import contract_header, spec
from flash_cann.checks import check_fwd

from contract import OPS as RAW_OPS
from contract import PATH, RAW
from conftest import make_qkv

SCHEMA_TYPES = {"float": "float", "bool": "bool", "int": "int", "str": "str"}


def _raw():
    return copy.deepcopy(RAW)


def test_packaged_spec_is_a_link_to_the_op_project_spec():
    """The package ships the spec through a link (a copy could drift from op_project/)."""
    assert spec.SPEC_PATH.is_symlink() and spec.SPEC_PATH.resolve() == PATH


def test_generated_contract_header_is_up_to_date():
    """op_host/flash_cann_contract.h (the OpDef indices, layouts, dtypes and head_dim
    limits the C++ uses) is what the generator makes of the spec now."""
    assert contract_header.HEADER.read_text() == contract_header.render(spec.load()), (
        "regenerate with: python -m flash_cann.contract_header")


def test_contract_header_follows_the_spec():
    """Every op, input, attribute and output of the spec appears, in spec order."""
    doc = _raw()
    doc["ops"][1]["attrs"].append({"name": "window_left", "type": "int", "default": -1})
    doc["limits"]["head_dim"]["max"] = 512
    header = contract_header.render(spec.parse(doc))
    assert "constexpr int64_t kHeadDimMax = 512;" in header
    bwd = header[header.index("namespace bwd {"):]
    attrs = bwd[bwd.index("namespace attr {"):bwd.index("}  // namespace attr")]
    assert "kLayout = 2," in attrs and "kDeterministic = 3," in attrs
    assert "kWindowLeft = 4," in attrs and "kCount = 5;" in attrs
    fwd = header[header.index("namespace fwd {"):header.index("namespace bwd {")]
    assert "kDeterministic" not in fwd  # autograd-only: the CANN op does not have it
    inputs = bwd[bwd.index("namespace input {"):bwd.index("}  // namespace input")]
    assert "kGradOut = 0," in inputs and "kGradSoftmaxLse = 7," in inputs


@pytest.mark.parametrize("op", [o["name"] for o in RAW["ops"]])
def test_registered_schema_matches_yaml(op):
    """Compares the live schema with the YAML itself, not with spec.py's derivation."""
    entry = next(o for o in RAW["ops"] if o["name"] == op)
    schema = getattr(torch.ops.flash_cann, op).default._schema
    args = list(schema.arguments)
    assert [a.name for a in args] == ([t["name"] for t in entry["inputs"]]
                                      + [a["name"] for a in entry["attrs"]])
    for arg, tensor in zip(args, entry["inputs"]):
        assert str(arg.type) == ("Optional[Tensor]" if tensor.get("optional") else "Tensor")
    for arg, attr in zip(args[len(entry["inputs"]):], entry["attrs"]):
        assert str(arg.type) == SCHEMA_TYPES[attr["type"]]
        assert arg.has_default_value() == ("default" in attr)
        if "default" in attr:
            assert arg.default_value == attr["default"]
    assert [r.name for r in schema.returns] == [t["name"] for t in entry["outputs"]]
    assert all(str(r.type) == "Tensor" for r in schema.returns)
    assert not any(a.alias_info for a in args), "ops must be functional"


def test_layout_choices_are_the_declared_layouts():
    for entry in RAW["ops"]:
        layout = next(a for a in entry["attrs"] if a["name"] == "layout")
        assert layout["choices"] == list(RAW["layouts"])


def test_autograd_only_attributes_are_the_torch_ops_not_the_cann_ops():
    s = spec.load()
    assert [a.name for a in s.ops["fwd"].attrs] == ["scale", "causal", "layout", "deterministic"]
    assert [a.name for a in s.ops["fwd"].cann_attrs] == ["scale", "causal", "layout"]
    assert [a.name for a in s.ops["bwd"].cann_attrs] == ["scale", "causal", "layout",
                                                         "deterministic"]


def test_backward_pairing_is_declared():
    s = spec.load()
    assert s.ops["fwd"].backward == "bwd"
    assert [t.name for t in s.ops["bwd"].outputs] == ["grad_query", "grad_key", "grad_value"]


def _declared_shape(tensor: dict, sizes, tensors: dict) -> tuple:
    shape = tensor["shape"]
    if isinstance(shape, str):
        return tuple(tensors[shape.removeprefix("like ")].shape)
    return tuple(getattr(sizes, size) for size in shape)


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
           **dict(zip(("grad_query", "grad_key", "grad_value"), grads))}
    sizes = check_fwd(q, k, v, mask, 0.3, True, layout)
    shaped = 0
    for op, tensors in (("fwd", fwd), ("bwd", bwd)):
        for tensor in RAW_OPS[op]["inputs"] + RAW_OPS[op]["outputs"]:
            if "shape" in tensor:
                assert tuple(tensors[tensor["name"]].shape) == _declared_shape(
                    tensor, sizes, tensors), (op, tensor["name"])
                shaped += 1
    assert shaped == 9


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["ops"][0].update(typo=1), r"ops\[0\]: unknown key\(s\) \['typo'\]"),
    (lambda d: d["ops"][0]["attrs"][1].update(default="yes"), "default 'yes' is not a bool"),
    (lambda d: d["ops"][0]["attrs"][2].update(default="SBH"), "not among choices"),
    (lambda d: d["ops"][0]["inputs"][0].update(dtype="int8"), "dtype must be one of"),
    (lambda d: d["ops"][0].update(backward="nope"), "backward 'nope' is not a declared op"),
    (lambda d: d["layouts"].update(SBH={"dims": []}), "layout choices"),
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
    (lambda d: d["ops"][0]["attrs"][3].pop("default"), "autograd_only attribute needs a default"),
    (lambda d: d["ops"][1]["attrs"].pop(3), "'deterministic' must be a bool attribute of its "
                                            r"backward op \(bwd\)"),
    (lambda d: d["ops"][1]["attrs"][3].update(type="int", default=0), "must be a bool attribute"),
    (lambda d: d["ops"][1]["attrs"][3].update(autograd_only=True), "must be a bool attribute"),
    (lambda d: d["ops"][0].pop("backward"), r"of its backward op \(none declared\)"),
])
def test_malformed_spec_is_rejected(mutate, message):
    doc = _raw()
    mutate(doc)
    with pytest.raises(spec.SpecError, match=message):
        spec.parse(doc)
