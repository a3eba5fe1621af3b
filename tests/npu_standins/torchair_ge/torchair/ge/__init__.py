"""TEST-ONLY stand-in for torchair.ge: Tensor, TensorSpec, custom_op and attr, recording
every node in GRAPH. See the package docstring."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import attr
from .attr import _Attr

__all__ = ["Tensor", "TensorSpec", "custom_op", "attr", "GRAPH", "register_ir", "Data", "Const",
           "DataType"]


@dataclass
class Node:
    type: str
    inputs: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)  # name -> (ge.attr class name, value)
    outputs: list = field(default_factory=list)


class Tensor:
    """Output ``index`` of a recorded node."""

    def __init__(self, node: Node, index: int):
        self.node = node
        self.index = index

    def __repr__(self):
        return f"ge.Tensor({self.node.type}:{self.index})"


class TensorSpec:
    def __init__(self, meta: torch.Tensor):
        self.dtype = meta.dtype
        self.size = list(meta.shape)


@dataclass
class IrDef:
    """An op proto as GE knows it: inputs (name, optional), attrs (name, ge.attr class
    name), outputs."""

    inputs: list
    attrs: list
    outputs: list


class _Graph:
    def __init__(self):
        self.ir: dict[str, IrDef] = {}
        self.nodes: list[Node] = []
        self.graphs = 0

    def reset(self):
        self.nodes.clear()
        self.graphs = 0


GRAPH = _Graph()


def register_ir(op_type: str, ir: IrDef) -> None:
    """Make ``op_type`` known, as an installed op package's proto makes it known to GE."""
    GRAPH.ir[op_type] = ir


def _record(node: Node, outputs: int):
    GRAPH.nodes.append(node)
    return [Tensor(node, i) for i in range(outputs)]


def Data(name: str) -> Tensor:
    """A graph input."""
    return _record(Node("Data", attrs={"name": ("Str", name)}), 1)[0]


class DataType:
    """torchair.ge.DataType's members that the converters use."""

    DT_FLOAT = 0


def Const(v, dtype=None, node_name=None, readable=True) -> Tensor:
    """torchair.ge.Const: a constant tensor of value ``v`` (nested lists give the shape)."""
    if dtype is None:
        raise AssertionError("this stand-in wants Const's dtype given explicitly")
    return _record(Node("Const", attrs={"value": ("Tensor", v), "dtype": ("Int", dtype)}), 1)[0]


def opaque(op: str, meta) -> Tensor | tuple:
    """The value of an op this stand-in does not convert."""
    count = len(meta) if isinstance(meta, (list, tuple)) else 1
    outputs = _record(Node(f"Opaque[{op}]"), count)
    return outputs[0] if count == 1 and not isinstance(meta, (list, tuple)) else tuple(outputs)


# The Python type GE's proto field of each attribute class holds.
_ATTR_PY_TYPES = {"Float": float, "Int": int, "Bool": bool, "Str": str}


def _fail(op_type: str, what: str):
    raise AssertionError(f"custom op '{op_type}': {what}")


def _check_inputs(op_type: str, ir: IrDef, inputs) -> None:
    if not isinstance(inputs, dict):
        _fail(op_type, f"inputs must be a dict, got {type(inputs).__name__}")
    expected = [name for name, _ in ir.inputs]
    if list(inputs) != expected:
        _fail(op_type, f"inputs {list(inputs)} must be the proto's, in order: {expected}")
    for name, optional in ir.inputs:
        value = inputs[name]
        if value is None and not optional:
            _fail(op_type, f"required input {name!r} is None")
        if value is not None and not isinstance(value, Tensor):
            _fail(op_type, f"input {name!r} must be a ge.Tensor or None, got "
                           f"{type(value).__name__}")


def _check_attrs(op_type: str, ir: IrDef, attrs) -> None:
    if not isinstance(attrs, dict):
        _fail(op_type, f"attrs must be a dict, got {type(attrs).__name__}")
    expected = dict(ir.attrs)
    if set(attrs) != set(expected):
        _fail(op_type, f"attrs {sorted(attrs)} must be the proto's: {sorted(expected)}")
    for name, value in attrs.items():
        if not isinstance(value, _Attr) or value.value is None:
            _fail(op_type, f"attr {name!r} must be a ge.attr.X(value), got {value!r}")
        if value.cls != expected[name]:
            _fail(op_type, f"attr {name!r} is ge.attr.{expected[name]} in the proto, "
                           f"got ge.attr.{value.cls}")
        py_type = _ATTR_PY_TYPES[value.cls]
        if type(value.value) is not py_type:
            _fail(op_type, f"attr {name!r}: ge.attr.{value.cls} holds a {py_type.__name__}, "
                           f"got {type(value.value).__name__}")


def custom_op(op_type: str, *args, inputs=None, outputs=None, attrs=None, node_name=None):
    if op_type not in GRAPH.ir:
        raise RuntimeError(f"No AscendIR {op_type} was found to be registered.")
    if args:
        _fail(op_type, "this stand-in models the keyword style (inputs=, outputs=, attrs=)")
    ir = GRAPH.ir[op_type]
    _check_inputs(op_type, ir, inputs)
    _check_attrs(op_type, ir, attrs)
    if outputs != ir.outputs:
        _fail(op_type, f"outputs {outputs} must be the proto's, in order: {ir.outputs}")
    node = Node(op_type, dict(inputs), {k: (v.cls, v.value) for k, v in attrs.items()},
                list(outputs))
    result = _record(node, len(outputs))
    return result[0] if len(result) == 1 else tuple(result)
