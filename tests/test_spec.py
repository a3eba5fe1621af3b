"""The op specification is the contract: the registered torch.library schemas must say
exactly what op_project/flash_cann_ops.yaml says, and a malformed spec must fail loudly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import flash_cann  # noqa: F401  (registers torch.ops.flash_cann)
from flash_cann import spec

YAML_PATH = Path(__file__).resolve().parents[1] / "op_project" / "flash_cann_ops.yaml"
SCHEMA_TYPES = {"float": "float", "bool": "bool", "int": "int", "str": "str"}


def _raw():
    return yaml.safe_load(YAML_PATH.read_text())


def test_packaged_spec_is_the_op_project_spec():
    assert spec.SPEC_PATH.read_bytes() == YAML_PATH.read_bytes()


@pytest.mark.parametrize("op", [o["name"] for o in _raw()["ops"]])
def test_registered_schema_matches_yaml(op):
    """Compares the live schema with the YAML itself, not with spec.py's derivation."""
    entry = next(o for o in _raw()["ops"] if o["name"] == op)
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
    raw = _raw()
    for entry in raw["ops"]:
        layout = next(a for a in entry["attrs"] if a["name"] == "layout")
        assert layout["choices"] == list(raw["layouts"])


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


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["ops"][0].update(typo=1), r"ops\[0\]: unknown key\(s\) \['typo'\]"),
    (lambda d: d["ops"][0]["attrs"][1].update(default="yes"), "default 'yes' is not a bool"),
    (lambda d: d["ops"][0]["attrs"][2].update(default="SBH"), "not among choices"),
    (lambda d: d["ops"][0]["inputs"][0].update(dtype="int8"), "dtype must be one of"),
    (lambda d: d["ops"][0].update(backward="nope"), "backward 'nope' is not a declared op"),
    (lambda d: d["layouts"].update(SBH={"dims": []}), "layout choices"),
    (lambda d: d.pop("limits"), r"missing key\(s\) \['limits'\]"),
    (lambda d: d["backends"]["cpu"].pop("device_type"), "backends.cpu: missing key"),
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
