"""The op specification (``op_project/flash_cann_ops.yaml``), loaded and validated.

Everything that states the op contract -- the torch.library schemas, the argument
checks, which backend computes which dtype -- reads it from here, so the contract is
written once. Loading follows op-plugin's generator: ``safe_load``, then validate
(unknown keys are errors, so a typo cannot silently drop a field), then derive.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

# Shipped inside the package (a link to op_project/ in the source tree).
SPEC_PATH = Path(__file__).with_name("flash_cann_ops.yaml")

ATTR_TYPES = ("float", "bool", "int", "str")
# What a tensor's `shape:` may say: a list of these sizes (checks.Problem's fields), or
# "like <input>" (the shape of that input).
# batch_plus_one: cu_seqlens' length; tokens_q: total query rows of a TND call; two: 2.
SIZE_NAMES = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim",
              "batch_plus_one", "tokens_q", "two")
# "input": the query's dtype; "accumulator": float32, or float64 for float64 inputs.
TENSOR_DTYPES = ("input", "accumulator", "bool", "int32", "int64", "float32")
# The optional features (flash_cann.contract.variant.FEATURES; spec.py must not import torch).
FEATURES = ("varlen", "window", "softcap", "alibi", "dropout", "kvcache", "sinks")


class SpecError(ValueError):
    """The YAML specification is malformed."""


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str
    optional: bool = False
    shape: Any = None
    feature: str | None = None
    mutable: bool = False

    def shape_for(self, layout: str):
        """The shape in ``layout`` (a spec shape may be a mapping {layout | default: ...})."""
        if isinstance(self.shape, dict):
            return self.shape.get(layout, self.shape["default"])
        return self.shape


@dataclass(frozen=True)
class Attr:
    name: str
    type: str
    default: Any = None
    has_default: bool = False
    choices: tuple = ()
    # Only carried through autograd to the backward op; the CANN op does not have it.
    autograd_only: bool = False
    feature: str | None = None


@dataclass(frozen=True)
class OpSpec:
    name: str
    cann_op_type: str
    summary: str
    inputs: tuple[TensorArg, ...]
    attrs: tuple[Attr, ...]
    outputs: tuple[TensorArg, ...]
    backward: str | None = None
    feature: str | None = None
    # The features the npu backend has: which arguments the CANN op takes.
    cann_features: frozenset = frozenset()

    def arguments(self) -> list:
        """Inputs and attributes in schema order: those of no feature first (inputs, then
        attributes: the CANN op's order, so positional calls of the core op keep
        working), then the features' (inputs, then attributes), all defaulted."""
        core = [x for x in (*self.inputs, *self.attrs) if x.feature is None]
        featured = [x for x in (*self.inputs, *self.attrs) if x.feature is not None]
        return core + featured

    def argument_names(self) -> list[str]:
        return [x.name for x in self.arguments()]

    def schema(self) -> str:
        """The torch.library schema string, e.g. ``fwd(Tensor query, ...) -> (...)``."""
        # (type, name, default or None); optional tensors default to None.
        # Inputs written in place get alias sets a!, b!, ... in order.
        mutable = [t.name for t in self.inputs if t.mutable]
        params = []
        for x in self.arguments():
            if isinstance(x, TensorArg):
                alias = f"({'abcdefgh'[mutable.index(x.name)]}!)" if x.mutable else ""
                params.append((f"Tensor{alias}{'?' if x.optional else ''}", x.name,
                               "None" if x.optional else None))
            else:
                params.append((x.type, x.name,
                               _schema_literal(x.type, x.default) if x.has_default else None))
        # A default is only legal when every later parameter has one too.
        required_after = False
        rendered = []
        for type_, name, default in reversed(params):
            if default is None:
                required_after = True
            elif required_after:
                default = None
            rendered.append(f"{type_} {name}" + (f"={default}" if default is not None else ""))
        params = rendered[::-1]
        returns = ", ".join(f"Tensor {t.name}" for t in self.outputs)
        return f"{self.name}({', '.join(params)}) -> ({returns})"

    def attr(self, name: str) -> Attr:
        return next(a for a in self.attrs if a.name == name)

    def _on_cann(self, feature: str | None) -> bool:
        return feature is None or feature in self.cann_features

    @property
    def on_cann(self) -> bool:
        """Whether the CANN package has this op (its feature is the npu backend's)."""
        return self._on_cann(self.feature)

    @property
    def cann_inputs(self) -> tuple[TensorArg, ...]:
        """The inputs of the CANN op, in order."""
        return tuple(t for t in self.inputs if self._on_cann(t.feature))

    @property
    def cann_outputs(self) -> tuple[TensorArg, ...]:
        """The outputs of the CANN op, in order (the torch op has all of ``outputs``)."""
        return tuple(t for t in self.outputs if self._on_cann(t.feature))

    @property
    def cann_attrs(self) -> tuple[Attr, ...]:
        """The attributes of the CANN op (OpDef, aclnn API, GE node), in order."""
        return tuple(a for a in self.attrs if not a.autograd_only and self._on_cann(a.feature))

    def featured(self) -> list[tuple[str, str]]:
        """(argument name, feature) of every input and attribute that belongs to one."""
        return [(x.name, x.feature) for x in (*self.inputs, *self.attrs) if x.feature]

    def feature_defaults(self) -> dict[str, Any]:
        """Each feature argument's value in a call that uses no feature (inputs: None)."""
        return {x.name: getattr(x, "default", None) for x in (*self.inputs, *self.attrs)
                if x.feature}


@dataclass(frozen=True)
class BackendSpec:
    name: str
    device_type: str
    dtypes: tuple[str, ...]
    summary: str
    install_hint: str = ""
    backward: bool = True
    # Further device types it serves, after their own backends -> its module there.
    also_on: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The optional features it computes on its own device type ...
    features: tuple[str, ...] = ()
    # ... and on the device types of also_on (those listed; default: all of them).
    also_on_features: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # Its module under flash_cann.backends on its own device type (a dotted path).
    entry: str = ""

    def features_on(self, device_type: str) -> tuple[str, ...]:
        """The features it computes on ``device_type``."""
        return tuple(self.also_on_features.get(device_type, self.features))

    @property
    def device_types(self) -> tuple[str, ...]:
        return (self.device_type, *self.also_on)

    def module(self, device_type: str) -> str:
        """The module of ``flash_cann.backends`` that runs it on ``device_type``."""
        return self.also_on.get(device_type, self.entry)


@dataclass(frozen=True)
class Spec:
    namespace: str
    backends: Mapping[str, BackendSpec]
    layouts: Mapping[str, tuple[str, ...]]
    # layout -> the feature it belongs to (None: every backend has it)
    layout_features: Mapping[str, str | None]
    head_dim_min: int
    head_dim_max: int
    ops: Mapping[str, OpSpec]

    def qualname(self, op: str) -> str:
        return f"{self.namespace}::{op}"

    @property
    def cann_layouts(self) -> tuple[str, ...]:
        """The layouts of the CANN op, in spec order."""
        npu = self.backends["npu"].features
        return tuple(name for name, f in self.layout_features.items() if f is None or f in npu)

    @property
    def cann_ops(self) -> tuple[OpSpec, ...]:
        """The ops of the CANN package, in spec order."""
        return tuple(op for op in self.ops.values() if op.on_cann)

    def backends_for_device(self, device_type: str) -> list[BackendSpec]:
        """Its own backends first (spec order), then those that also serve it."""
        own = [b for b in self.backends.values() if b.device_type == device_type]
        return own + [b for b in self.backends.values() if device_type in b.also_on]


def _schema_literal(type_: str, value: Any) -> str:
    if type_ == "bool":
        return "True" if value else "False"
    if type_ == "str":
        return f'"{value}"'
    return repr(value)


def _keys(node: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(node, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(node).__name__}")
    missing = required - node.keys()
    unknown = node.keys() - required - optional
    if missing:
        raise SpecError(f"{where}: missing key(s) {sorted(missing)}")
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {sorted(unknown)}")
    return node


def _feature(node: dict, where: str) -> str | None:
    feature = node.get("feature")
    if feature is not None and feature not in FEATURES:
        raise SpecError(f"{where}: feature must be one of {FEATURES}, got {feature!r}")
    return feature


def _tensor(node: Any, where: str, output: bool = False) -> TensorArg:
    node = _keys(node, where, {"name", "dtype"}, {"optional", "shape", "feature", "mutable"})
    if node["dtype"] not in TENSOR_DTYPES:
        raise SpecError(f"{where}: dtype must be one of {TENSOR_DTYPES}, got {node['dtype']!r}")
    feature = _feature(node, where)
    # An output of a feature is always the torch op's (its value without the feature is
    # the spec's to say); the CANN op has it when the npu backend lists the feature.
    if feature is not None and not output and not node.get("optional", False):
        raise SpecError(f"{where}: an input of a feature must be optional (backends "
                        f"without the feature never receive it)")
    return TensorArg(node["name"], node["dtype"], bool(node.get("optional", False)),
                     node.get("shape"), feature, bool(node.get("mutable", False)))


_PY_TYPES = {"float": (int, float), "bool": (bool,), "int": (int,), "str": (str,)}


def _attr(node: Any, where: str) -> Attr:
    node = _keys(node, where, {"name", "type"},
                 {"default", "choices", "autograd_only", "feature"})
    type_ = node["type"]
    if type_ not in ATTR_TYPES:
        raise SpecError(f"{where}: type must be one of {ATTR_TYPES}, got {type_!r}")
    has_default = "default" in node
    default = node.get("default")
    if has_default and not isinstance(default, _PY_TYPES[type_]):
        raise SpecError(f"{where}: default {default!r} is not a {type_}")
    choices = tuple(node.get("choices", ()))
    if has_default and choices and default not in choices:
        raise SpecError(f"{where}: default {default!r} is not among choices {choices}")
    autograd_only = bool(node.get("autograd_only", False))
    if autograd_only and not has_default:
        raise SpecError(f"{where}: an autograd_only attribute needs a default (the CANN op "
                        f"does not take it)")
    feature = _feature(node, where)
    if feature is not None and not has_default:
        raise SpecError(f"{where}: an attribute of a feature needs a default (its value "
                        f"when the feature is not used)")
    return Attr(node["name"], type_, default, has_default, choices, autograd_only, feature)


def _check_shapes(op: OpSpec, where: str) -> None:
    inputs = [t.name for t in op.inputs]
    for t in op.inputs + op.outputs:
        shapes = t.shape if isinstance(t.shape, dict) else {"default": t.shape}
        if t.shape is None:
            continue
        ok = "default" in shapes
        for shape in shapes.values():
            if isinstance(shape, str):
                ok &= shape.startswith("like ") and shape.removeprefix("like ") in inputs
            else:
                ok &= isinstance(shape, list) and all(size in SIZE_NAMES for size in shape)
        if not ok:
            raise SpecError(f"{where}: {t.name}'s shape {shape!r} must be a list of "
                            f"{SIZE_NAMES} or 'like <input>' ({', '.join(inputs)})")


def _op(node: Any, where: str) -> OpSpec:
    node = _keys(node, where, {"name", "cann_op_type", "summary", "inputs", "attrs", "outputs"},
                 {"backward", "feature"})
    op = OpSpec(
        name=node["name"],
        cann_op_type=node["cann_op_type"],
        summary=" ".join(str(node["summary"]).split()),
        inputs=tuple(_tensor(t, f"{where}.inputs[{i}]") for i, t in enumerate(node["inputs"])),
        attrs=tuple(_attr(a, f"{where}.attrs[{i}]") for i, a in enumerate(node["attrs"])),
        outputs=tuple(_tensor(t, f"{where}.outputs[{i}]", output=True)
                      for i, t in enumerate(node["outputs"])),
        backward=node.get("backward"),
        feature=_feature(node, where),
    )
    _check_shapes(op, where)
    return op


def _check_backward_names(fwd: OpSpec, bwd: OpSpec) -> None:
    """The naming autograd relies on (ops.py): the backward takes the forward's tensors
    and attributes by name and grad_<output>, and returns grad_<input>."""
    known = ({t.name for t in fwd.inputs + fwd.outputs} | {a.name for a in fwd.attrs}
             | {f"grad_{t.name}" for t in fwd.outputs})
    for t in bwd.inputs:
        if t.name not in known:
            raise SpecError(f"op {bwd.name!r}: input {t.name!r} is neither an argument or "
                            f"output of {fwd.name!r} nor grad_<output>")
    for t in bwd.outputs:
        if t.name.removeprefix("grad_") not in {i.name for i in fwd.inputs}:
            raise SpecError(f"op {bwd.name!r}: output {t.name!r} must be grad_<input of "
                            f"{fwd.name!r}>")


def _module_path(value: Any) -> bool:
    return isinstance(value, str) and all(part.isidentifier() for part in value.split("."))


def parse(doc: Any) -> Spec:
    """Validate a loaded YAML document and build the :class:`Spec`."""
    doc = _keys(doc, "spec", {"spec_version", "namespace", "backends", "layouts", "limits", "ops"})
    if doc["spec_version"] != 1:
        raise SpecError(f"spec: unsupported spec_version {doc['spec_version']!r}")
    backends = {}
    for name, node in doc["backends"].items():
        node = _keys(node, f"backends.{name}", {"device_type", "module", "dtypes", "summary"},
                     {"install_hint", "backward", "also_on", "features", "also_on_features"})
        unknown = set(node.get("features", ())) - set(FEATURES)
        if unknown:
            raise SpecError(f"backends.{name}.features: unknown {sorted(unknown)} (features: "
                            f"{FEATURES})")
        if not _module_path(node["module"]):
            raise SpecError(f"backends.{name}.module: expected a dotted module path under "
                            f"flash_cann.backends, got {node['module']!r}")
        also_on = node.get("also_on", {})
        if not isinstance(also_on, dict) or node["device_type"] in also_on or not all(
                _module_path(m) for m in also_on.values()):
            raise SpecError(f"backends.{name}.also_on: expected {{other device type: module "
                            f"name}}, got {also_on!r}")
        also_on_features = {device: tuple(names) for device, names in
                            node.get("also_on_features", {}).items()}
        if not set(also_on_features) <= set(also_on) or any(
                set(names) - set(node.get("features", ())) for names in also_on_features.values()):
            raise SpecError(f"backends.{name}.also_on_features: expected a subset of its "
                            f"features per device type of also_on, got {also_on_features!r}")
        backends[name] = BackendSpec(name, node["device_type"], tuple(node["dtypes"]),
                                     " ".join(node["summary"].split()),
                                     " ".join(node.get("install_hint", "").split()),
                                     bool(node.get("backward", True)),
                                     dict(also_on), tuple(node.get("features", ())),
                                     also_on_features, node["module"])
    layout_nodes = {name: _keys(node, f"layouts.{name}", {"dims"}, {"feature"})
                    for name, node in doc["layouts"].items()}
    layouts = {name: tuple(node["dims"]) for name, node in layout_nodes.items()}
    layout_features = {name: _feature(node, f"layouts.{name}")
                       for name, node in layout_nodes.items()}
    if "npu" not in backends:
        raise SpecError("backends: the npu backend (the CANN package) must be declared")
    cann_features = frozenset(backends["npu"].features)
    limits = _keys(doc["limits"], "limits", {"head_dim"})
    head_dim = _keys(limits["head_dim"], "limits.head_dim", {"min", "max"})
    ops = {}
    for i, node in enumerate(doc["ops"]):
        op = dataclasses.replace(_op(node, f"ops[{i}]"), cann_features=cann_features)
        if op.name in ops:
            raise SpecError(f"ops[{i}]: duplicate op name {op.name!r}")
        ops[op.name] = op
    for op in ops.values():
        if op.backward is not None and op.backward not in ops:
            raise SpecError(f"op {op.name!r}: backward {op.backward!r} is not a declared op")
        if op.backward is not None:
            _check_backward_names(op, ops[op.backward])
        _check_autograd_only(op, ops)
        layout = next((a for a in op.attrs if a.name == "layout"), None)
        if layout is not None and not set(layout.choices) <= set(layouts):
            raise SpecError(f"op {op.name!r}: layout choices {layout.choices} must be "
                            f"declared layouts {tuple(layouts)}")
    return Spec(doc["namespace"], backends, layouts, layout_features, head_dim["min"],
                head_dim["max"], ops)


def _check_autograd_only(op: OpSpec, ops: Mapping[str, OpSpec]) -> None:
    """An autograd_only attribute must reach a CANN attribute of the backward op."""
    for attr in op.attrs:
        if not attr.autograd_only:
            continue
        backward = ops.get(op.backward) if op.backward else None
        target = next((a for a in backward.cann_attrs if a.name == attr.name),
                      None) if backward else None
        if target is None or target.type != attr.type:
            raise SpecError(f"op {op.name!r}: autograd_only attribute {attr.name!r} must be a "
                            f"{attr.type} attribute of its backward op "
                            f"({op.backward or 'none declared'})")


@functools.lru_cache(maxsize=None)
def load(path: str | Path = SPEC_PATH) -> Spec:
    with open(path, encoding="utf-8") as f:
        return parse(yaml.safe_load(f))
