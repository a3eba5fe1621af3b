"""TEST-ONLY recording stand-in for torchair's converter interface (not torchair).

What flash-cann's converters use, with the checks the real torchair makes -- read from
its source (python/torchair/_ge_concrete_graph/fx2ge_converter.py: Converter,
set_ge_outputs; ge/ge_custom.py: custom_op; _ge_concrete_graph/compat_ir.py:
_custom_op) -- and the ones GE makes later against the op's proto, which here is built
from the YAML op spec by the test (``ge.register_ir``). Every node is recorded in
``ge.GRAPH`` for the test to inspect.

``get_npu_backend()`` stands in for torchair's torch.compile backend: it runs AOT
autograd, hands every node that has a registered converter to it the way torchair does
(FX args and kwargs, tensors as ``ge.Tensor``, ``meta_outputs`` from the fake kernels),
checks the result like ``set_ge_outputs``, then runs the graph eagerly.
"""

from __future__ import annotations

import functools
import inspect
import operator

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from . import ge

__all__ = ["register_fx_node_ge_converter", "get_npu_backend", "ge"]


class Converter:
    """As torchair's: decorating returns this object, not the function, and stores the
    wrapped function on the op as ``_ge_converter``."""

    def __init__(self, aten_op):
        self._aten_op = aten_op

    def __call__(self, converter):
        # torchair only stamps output dtypes/shapes when the converter takes
        # meta_outputs (its docs: the parameter name is fixed); without it GE would
        # default every output to DT_FLOAT.
        if "meta_outputs" not in inspect.signature(converter).parameters:
            raise AssertionError(f"converter for {self._aten_op} takes no 'meta_outputs'")

        @functools.wraps(converter)
        def wrapped(*args, **kwargs):
            return converter(*args, **kwargs)

        wrapped.require_meta = True
        self._aten_op._ge_converter = wrapped
        return self


def register_fx_node_ge_converter(aten_op):
    return Converter(aten_op)


def _check_outputs(ge_outputs, meta_outputs):
    """torchair's set_ge_outputs: one ge.Tensor per meta output."""
    if isinstance(ge_outputs, ge.Tensor):
        if isinstance(meta_outputs, (list, tuple)):
            raise AssertionError("one ge.Tensor returned for several meta outputs")
        return
    if not isinstance(ge_outputs, (list, tuple)) or not isinstance(meta_outputs, (list, tuple)):
        raise AssertionError("ge_outputs and meta_outputs must be lists or tuples")
    if len(ge_outputs) != len(meta_outputs):
        raise AssertionError("The length of ge_outputs must be equal to meta_outputs.")
    for ge_output, meta in zip(ge_outputs, meta_outputs):
        _check_outputs(ge_output, meta)


def convert_node(target, args, kwargs, meta_outputs):
    """What torchair does with one FX node whose op has a converter."""
    converter = target._ge_converter
    kwargs = dict(kwargs)
    if converter.require_meta:
        kwargs["meta_outputs"] = meta_outputs
    ge_outputs = converter(*args, **kwargs)
    _check_outputs(ge_outputs, meta_outputs)
    return ge_outputs


def _meta(value):
    if isinstance(value, (list, tuple)):
        return [_meta(v) for v in value]
    return ge.TensorSpec(value) if isinstance(value, torch.Tensor) else value


def _convert_graph(gm: torch.fx.GraphModule, example_inputs):  # aot_autograd's signature
    env = {}

    def arg(a):
        return torch.fx.node.map_arg(a, lambda n: env[n.name])

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = ge.Data(node.name)
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node.name] = arg(node.args[0])[node.args[1]]
        elif node.op == "call_function" and hasattr(node.target, "_ge_converter"):
            env[node.name] = convert_node(node.target, arg(node.args), arg(node.kwargs),
                                          _meta(node.meta["val"]))
        elif node.op == "call_function":
            # Ops without a converter here (views, zeros_like, ...): an opaque value.
            env[node.name] = ge.opaque(str(node.target), node.meta.get("val"))
    ge.GRAPH.graphs += 1
    return make_boxed_func(gm.forward)


def get_npu_backend():
    return aot_autograd(fw_compiler=_convert_graph, bw_compiler=_convert_graph)
