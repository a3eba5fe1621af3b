"""torchair graph mode: converters that emit the CANN ops for torch.ops.flash_cann.*.

``torch.compile(model, backend=torchair.get_npu_backend())`` (torchair's default
"max-autotune" mode) lowers each FX node to GE IR through the converter registered for
its op with ``torchair.register_fx_node_ge_converter``. These converters emit one
``torchair.ge.custom_op`` node of the spec's CANN op type (``FlashCannAttention``,
``FlashCannAttentionGrad``, ``FlashCannAttentionKVCache``) per call: the inputs by their spec names in spec order (an
absent optional input as ``None``), every attribute as the ``ge.attr`` class of its spec
type, the outputs by their spec names. An output of a feature the CANN op does not have
yet (grad_sinks while the npu backend does not list sinks) is a ``ge.Const`` of zeros,
its value when the feature is unused (the converter refuses graphs that use it). Both layouts and GQA/MQA are the op's business:
the converter passes ``layout`` through and never reshapes. Output dtypes and shapes are
the fake kernels' (``flash_cann.contract.ops``), which torchair stamps on the returned tensors.

GE must know the op types when the graph is converted, i.e. the flash-cann package must
be installed (its op proto) and its environment sourced.

Nothing here imports torchair (it needs torch_npu and CANN): :func:`enable_torchair`
does, on request, and :func:`register_if_loaded` registers only if torchair is already
imported. "Imported" is not "in ``sys.modules``": torch_npu puts a ``_LazyTorchair`` proxy
there (``torch_npu/dynamo/__init__.py``; at ``import torch_npu`` in 2.1-2.8, at the first
Dynamo set-up from 2.9) that raises ``AttributeError`` for anything but ``__spec__`` /
``__path__`` until a real ``import torchair`` loads ``torch_npu.dynamo.torchair``. So a
proxy's attributes are never read here: :func:`loaded_torchair` looks at module objects
only.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import Callable

import torch

from ..contract.spec import _PY_TYPES, Attr, OpSpec, load

# ge.attr class, and the Python type GE's proto field gets, by spec attribute type.
GE_ATTR_CLASSES = {"float": "Float", "int": "Int", "bool": "Bool", "str": "Str"}
_GE_VALUES = {"float": float, "int": int, "bool": bool, "str": str}

_registered_with = None  # the torchair module the converters are registered with


def _overload(op: OpSpec):
    spec = load()
    return getattr(getattr(torch.ops, spec.namespace), op.name).default


def _signature(op: OpSpec) -> inspect.Signature:
    """The op's schema as a Python signature, to bind FX node args/kwargs by name."""
    return inspect.Signature([
        inspect.Parameter(arg.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=arg.default_value if arg.has_default_value()
                          else inspect.Parameter.empty)
        for arg in _overload(op)._schema.arguments])


def _attr_value(ge, op: OpSpec, attr: Attr, value):
    # bool is an int: a float or int attribute must not silently take True/False.
    if not isinstance(value, _PY_TYPES[attr.type]) or (attr.type != "bool"
                                                       and isinstance(value, bool)):
        raise TypeError(
            f"flash_cann: torchair converter for {op.cann_op_type}: attribute {attr.name!r} "
            f"must be a Python {attr.type} when the graph is converted, got "
            f"{type(value).__name__} {value!r} (a traced value, e.g. a scale computed from a "
            f"dynamic head_dim, becomes a graph tensor: pass it as a constant)")
    return getattr(ge.attr, GE_ATTR_CLASSES[attr.type])(_GE_VALUES[attr.type](value))


def _has_npu_kernel(op: OpSpec) -> bool:
    spec = load()
    backward_ops = {o.backward for o in spec.ops.values() if o.backward}
    return spec.backends["npu"].backward or op.name not in backward_ops


def _backends_with(feature: str) -> str:
    return ", ".join(b.name for b in load().backends.values() if feature in b.features)


def _refuse_features(op: OpSpec, values: dict) -> None:
    """A feature the CANN op does not take must be unused in the graph (the op's checks
    refuse it in eager mode; here the graph would silently drop it)."""
    cann = {x.name for x in (*op.cann_inputs, *op.cann_attrs)}
    defaults = {a.name: a.default for a in op.attrs}
    for name, feature in op.featured():
        value = values.get(name)
        if name not in cann and value is not None and value != defaults.get(name):
            raise NotImplementedError(
                f"flash_cann: the Ascend {op.cann_op_type} does not support {feature} yet "
                f"({name} is set in the graph); backends with it: {_backends_with(feature)}")


# GE's DataType member of each dtype a feature's output may have.
_GE_DTYPES = {torch.float32: "DT_FLOAT"}


def _zeros(ge, op: OpSpec, name: str, meta_outputs, index: int):
    """Zeros of output ``index``'s meta shape and dtype, as a GE constant."""
    meta = None if meta_outputs is None else meta_outputs[index]
    size = None if meta is None else list(meta.size)
    if size is None or not all(isinstance(n, int) for n in size) or \
            meta.dtype not in _GE_DTYPES:
        raise NotImplementedError(
            f"flash_cann: {op.cann_op_type} has no output {name!r} yet, and its zeros need a "
            f"static shape and a float32 dtype (got {size} "
            f"{None if meta is None else meta.dtype})")
    # Nested lists of the output's shape, as ge.Const takes a value.
    return ge.Const(torch.zeros(size).tolist(), dtype=getattr(ge.DataType, _GE_DTYPES[meta.dtype]))


def _kvcache_graph_rule(op: OpSpec, values: dict) -> None:
    """FlashCannAttentionKVCache attends to cache_seqlens keys and does not append: in
    eager mode contract.kvcache.append writes k/v into the caches first (device ops with
    the capacity guard). A graph that appends is refused here rather than converted into
    a node that would drop the new keys; vLLM's call shape (the cache written by its own
    op, cache_seqlens = seqused_k) converts."""
    if values.get("key") is not None or values.get("value") is not None:
        raise NotImplementedError(
            f"flash_cann: the torchair converter of {op.cann_op_type} does not convert the "
            f"append (k and v are set in the graph): write the new keys into the cache before "
            f"the call (as vLLM does) and pass k=v=None with cache_seqlens = the lengths after "
            f"it")
    if values.get("cache_seqlens") is None:
        raise NotImplementedError(
            f"flash_cann: {op.cann_op_type} needs cache_seqlens (int32 (batch,), the keys of "
            f"each sequence) in a graph: the Ascend kernel reads the lengths on the device")


# Op-specific refusals at conversion, after the generic feature check.
_GRAPH_RULES = {"fwd_kvcache": _kvcache_graph_rule}


def converter_for(op: OpSpec, ge) -> Callable:
    """The converter of ``op``: FX args in, ``ge.custom_op`` outputs (a tuple) out."""
    signature = _signature(op)

    def convert(*args, meta_outputs=None, **kwargs):
        if not op.on_cann:
            raise NotImplementedError(
                f"flash_cann: torch.ops.flash_cann.{op.name} ({op.feature}) has no Ascend "
                f"kernel yet, so torchair cannot convert it; backends with it: "
                f"{_backends_with(op.feature)}")
        if not _has_npu_kernel(op):
            # Refuse at graph conversion rather than fail inside GE at run time.
            raise NotImplementedError(
                f"flash_cann: {op.cann_op_type} has no Ascend kernel yet; torchair graphs can "
                f"run flash-cann's forward op only (compile for inference, or compute the "
                f"backward pass off the NPU)")
        # torchair stamps dtype/shape from meta_outputs on what we return: one per output.
        if meta_outputs is not None and len(meta_outputs) != len(op.outputs):
            raise ValueError(f"flash_cann: {op.cann_op_type} has {len(op.outputs)} outputs, "
                             f"torchair passed {len(meta_outputs)} meta outputs")
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        _refuse_features(op, values)
        if op.name in _GRAPH_RULES:
            _GRAPH_RULES[op.name](op, values)
        produced = ge.custom_op(
            op.cann_op_type,
            inputs={t.name: values[t.name] for t in op.cann_inputs},
            outputs=[t.name for t in op.cann_outputs],
            attrs={a.name: _attr_value(ge, op, a, values[a.name]) for a in op.cann_attrs},
        )
        if len(op.cann_outputs) == len(op.outputs):
            return produced
        produced = iter(produced if isinstance(produced, (list, tuple)) else (produced,))
        return tuple(next(produced) if t in op.cann_outputs
                     else _zeros(ge, op, t.name, meta_outputs, op.outputs.index(t))
                     for t in op.outputs)

    convert.__name__ = f"convert_{op.cann_op_type}"
    convert.__qualname__ = convert.__name__
    return convert


def register(torchair) -> None:
    """Register a converter for every op of the spec with ``torchair`` (idempotent)."""
    global _registered_with
    if _registered_with is torchair:
        return
    for op in load().ops.values():
        torchair.register_fx_node_ge_converter(_overload(op))(converter_for(op, torchair.ge))
    _registered_with = torchair


# Where torch_npu ships torchair; its proxy sys.modules["torchair"] forwards to it.
TORCH_NPU_TORCHAIR = "torch_npu.dynamo.torchair"


def loaded_torchair():
    """The torchair package if a real ``import torchair`` has run, else None.

    ``sys.modules["torchair"]`` is either torchair itself (a standalone install) or
    torch_npu's proxy, which is not a module and must not be touched before torchair is
    imported; once it is, the package it forwards to is ``torch_npu.dynamo.torchair``."""
    for name in ("torchair", TORCH_NPU_TORCHAIR):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            return module
    return None


def enable_torchair() -> None:
    """Register the converters with torchair, importing it (it ships with torch_npu)."""
    try:
        # Through torch_npu's proxy too: `import` reads its __spec__, which imports torchair.
        importlib.import_module("torchair")
    except Exception as err:  # torchair raises more than ImportError without CANN
        raise ImportError(
            f"flash_cann.enable_torchair() needs torchair, which ships with torch_npu and "
            f"needs CANN ({type(err).__name__}: {err}): {load().backends['npu'].install_hint}"
        ) from err
    torchair = loaded_torchair()
    if torchair is None:  # imported, yet neither name holds a module: not torch_npu's layout
        raise ImportError(f"flash_cann.enable_torchair(): `import torchair` gave "
                          f"{type(sys.modules.get('torchair')).__name__}, and "
                          f"{TORCH_NPU_TORCHAIR} is not loaded; cannot find torchair's module")
    register(torchair)


def register_if_loaded() -> bool:
    """Register if torchair is already imported (never imports it, never touches torch_npu's
    proxy); True if registered."""
    torchair = loaded_torchair()
    if torchair is None:
        return False
    register(torchair)
    return True
