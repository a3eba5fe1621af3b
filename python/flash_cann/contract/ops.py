"""``torch.ops.flash_cann``: the ops declared from the spec, and the one place a backend
is chosen.

Layers, as PyTorch's custom-op guide lays them out:
  1. ``define``: the schemas derived from ``op_project/flash_cann_ops.yaml``.
  2. fake kernels: allocate outputs only, after the same checks as the real kernels,
     so ``torch.compile`` traces without graph breaks and reports bad input at trace
     time.
  3. ``register_autograd``: ``fwd``'s backward calls ``torch.ops.flash_cann.bwd``.
  4. device kernels: one per torch device type; each runs the shared checks, then the
     backend selected for that device type (the spec's first by default, see
     :func:`use_backend`).

A plain call (no features) is planned once per signature (:func:`plain_forward`): the
checks run on the first call of a signature and the backend's call for it is kept, so a
repeated shape costs a dict lookup before the backend (benchmarks/NOTES.md, step H2).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from typing import Callable, Iterator

import torch

from . import kvcache
from .checks import accumulator_dtype, check_bwd, check_fwd, check_kvcache, lse_shape
from .spec import BackendSpec, OpSpec, load

SPEC = load()
_LIB = torch.library.Library(SPEC.namespace, "DEF")
for _op in SPEC.ops.values():
    _LIB.define(_op.schema())
FWD = SPEC.qualname("fwd")
BWD = SPEC.qualname("bwd")
KVCACHE = SPEC.qualname("fwd_kvcache")
_FWD_OP = SPEC.ops["fwd"]
_BWD_OP = SPEC.ops[_FWD_OP.backward]
_KVCACHE_OP = SPEC.ops["fwd_kvcache"]
# Attributes of no feature that the checks fold into the variant: a permission every
# backend takes (fp16_scores: spec comment), so a call that gives it is not plain.
_PERMISSIONS = {"fp16_scores": False}
_FWD_PLAIN = {**_FWD_OP.feature_defaults(), **_PERMISSIONS}
_BWD_PLAIN = {**_BWD_OP.feature_defaults(), **_PERMISSIONS}
# The arguments the checks and backends take positionally, in their order.
_FWD_CORE = ("query", "key", "value", "key_padding_mask", "scale", "causal", "layout")
_BWD_CORE = ("grad_out", "query", "key", "value", "out", "softmax_lse", "key_padding_mask",
             "grad_softmax_lse", "scale", "causal", "layout")
_KVCACHE_CORE = ("query", "k_cache", "v_cache", "key", "value", "cache_seqlens",
                 "cache_batch_idx", "block_table", "scale", "causal")
# fwd_kvcache's arguments beyond the core that belong to no feature.
_KVCACHE_MORE = ("cache_leftpad", "layout", "num_splits")

# device type -> name of the backend that serves it now.
_selected: dict[str, str] = {}
# Backends of the open use_backend blocks, innermost last.
_blocks: list[str] = []


def backend_for(device) -> BackendSpec | None:
    """The backend serving ``device`` (a device type such as "cpu", or a torch.device)
    now: the one selected with use_backend, else the first of the device's candidates
    that can run (the first if none can), or None if the spec has none."""
    device_type = device.type if isinstance(device, torch.device) else device
    if not isinstance(device_type, str):
        raise TypeError(f"flash_cann: backend_for takes a device type (str) or a torch.device "
                        f"(got {type(device).__name__})")
    name = _selected.get(device_type)
    if name is not None:
        return SPEC.backends[name]
    candidates = SPEC.backends_for_device(device_type)
    if len(candidates) > 1:
        return next((b for b in candidates if is_available(b, device_type)), candidates[0])
    return candidates[0] if candidates else None


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the ops of ``name``'s device type on backend ``name`` inside the block.

    Example: ``with flash_cann.use_backend("twin"): ...`` runs CPU tensors through the
    Ascend C kernel on the CPU twin instead of the default CPU backend;
    ``use_backend("triton")`` runs CUDA and NPU tensors through the Triton kernels."""
    if name not in SPEC.backends:
        raise ValueError(f"flash_cann: unknown backend {name!r} "
                         f"(choose from {', '.join(SPEC.backends)})")
    previous = dict(_selected)
    _selected.update(dict.fromkeys(SPEC.backends[name].device_types, name))
    _blocks.append(name)
    forget_plans()
    try:
        yield
    finally:
        _blocks.pop()
        _selected.clear()
        _selected.update(previous)
        forget_plans()


def _module(backend: BackendSpec, device_type: str | None = None):
    module = backend.module(device_type or backend.device_type)
    return importlib.import_module(f"..backends.{module}", __package__)


def is_available(backend: BackendSpec, device_type: str | None = None) -> bool:
    """Whether ``backend`` can run here on ``device_type`` (default: its own): its
    module imports and finds the device."""
    try:
        module = _module(backend, device_type)
    except ImportError:
        return False
    return module.available()


def unavailable_reason(backend: BackendSpec, device_type: str | None = None) -> str | None:
    """None if ``backend`` can run here on ``device_type`` (default: its own), else what it
    lacks, in one line."""
    device_type = device_type or backend.device_type
    if is_available(backend, device_type):
        return None
    return _unavailable_reason(backend, device_type)


def best_device() -> torch.device:
    """The first accelerator (in spec order) whose backend is available, else the CPU."""
    for backend in SPEC.backends.values():
        if backend.device_type != "cpu" and is_available(backend):
            return torch.device(backend.device_type)
    return torch.device("cpu")


def _serving(device_type: str) -> BackendSpec:
    """The backend to run ``device_type``'s tensors on; unless one was selected, it must
    be able to run (else the error says what to install)."""
    # Inside use_backend(name), tensors that backend cannot take are an error, not a
    # silent run on the device's default.
    inner = _blocks[-1] if _blocks else None
    if inner is not None and device_type not in SPEC.backends[inner].device_types:
        raise ValueError(f"flash_cann: use_backend({inner!r}) is active, but the tensors are "
                         f"on device type '{device_type}' ({inner} takes "
                         f"{', '.join(SPEC.backends[inner].device_types)} tensors)")
    backend = backend_for(device_type)
    if device_type not in _selected and not is_available(backend, device_type):
        raise _no_backend(device_type)
    return backend


def _arguments(op: OpSpec, args: tuple, kwargs: dict) -> dict:
    """The op's arguments by spec name (a kernel receives them as the schema orders them)."""
    names = op.argument_names()
    bound = {t.name: None for t in op.inputs if t.optional}
    bound.update((a.name, a.default) for a in op.attrs if a.has_default)
    bound.update(zip(names, args))
    bound.update(kwargs)
    return bound


def _features(op: OpSpec, args: dict) -> dict:
    """The arguments of the op's features and its permissions, by name (what the checks
    take beyond the core)."""
    return {**{name: args[name] for name, _ in op.featured()},
            **{name: args[name] for name in _PERMISSIONS if name in args}}


def _backend_call(backend: BackendSpec, device_type: str, function: str, *args, variant,
                  **kwargs):
    """Call a backend's function; ``variant`` reaches only backends that have features on
    this device type (the checks refused any feature the backend lacks there, so the
    others get plain calls)."""
    if backend.features_on(device_type):
        kwargs["variant"] = variant
    return getattr(_module(backend, device_type), function)(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# Plain calls: checked once per signature
# ---------------------------------------------------------------------------------------

# signature -> the backend call that passed the checks for it (see plain_forward).
_fwd_plans: dict[tuple, Callable] = {}
_bwd_plans: dict[tuple, Callable] = {}
# Enough for every shape of a model's training and inference; a workload that keeps
# changing shapes starts over when full rather than growing without bound.
MAX_PLANS = 1024


def forget_plans() -> None:
    """Drop every plan: the backend selection or a backend's settings changed."""
    _fwd_plans.clear()
    _bwd_plans.clear()


def _tensor_signature(t):
    """What a plan may depend on: sizes, strides, dtype, device, and whether the data is
    16-byte aligned (Triton specialises pointers on it)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0


def _planned(module, function: str, *args, **kwargs):
    """Run the backend's ``function`` once and return (its result, a callable that repeats
    it for tensors of the same signature): the backend's own ``<function>_planned`` where
    it has one (it may return no plan), else the function with its attributes bound."""
    planner = getattr(module, f"{function}_planned", None)
    if planner is not None:
        result, plan = planner(*args, **kwargs)
        if plan is not None:
            return result, plan
    else:
        result = getattr(module, function)(*args, **kwargs)
    return result, functools.partial(getattr(module, function), **kwargs)


def _plan_and_run(plans: dict, signature: tuple, check, function: str, query, tensors: tuple,
                  scale: float, causal: bool, layout: str, **attrs):
    """The first call of a plain signature: the checks, the backend's ``function``, and its
    plan kept for the next calls."""
    device_type = query.device.type
    backend = _serving(device_type)
    check(*tensors, scale, causal, layout, backend)
    result, plan = _planned(_module(backend, device_type), function, *tensors, scale=scale,
                            causal=causal, layout=layout, **attrs)
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[signature] = plan
    return result


def plain_forward(query, key, value, key_padding_mask, scale: float, causal: bool,
                  layout: str):
    """fwd without features, as its kernel runs it: the first call of a signature runs the
    checks and the backend, later ones only the backend's plan (checks passed before
    cannot fail now: they read nothing the signature does not fix)."""
    signature = (_tensor_signature(query), _tensor_signature(key), _tensor_signature(value),
                 _tensor_signature(key_padding_mask), scale, causal, layout)
    plan = _fwd_plans.get(signature)
    if plan is not None:
        return plan(query, key, value, key_padding_mask)
    return _plan_and_run(_fwd_plans, signature, check_fwd, "forward", query,
                         (query, key, value, key_padding_mask), scale, causal, layout)


def plain_backward(grad_out, query, key, value, out, softmax_lse, key_padding_mask,
                   grad_softmax_lse, scale: float, causal: bool, layout: str,
                   deterministic: bool):
    """bwd without features, planned as :func:`plain_forward`: the backend's (grad_query,
    grad_key, grad_value, None) (no sinks, no sink gradient)."""
    tensors = (grad_out, query, key, value, out, softmax_lse, key_padding_mask,
               grad_softmax_lse)
    signature = (*map(_tensor_signature, tensors), scale, causal, layout, deterministic)
    plan = _bwd_plans.get(signature)
    if plan is not None:
        return plan(*tensors)
    return _plan_and_run(_bwd_plans, signature, check_bwd, "backward", query, tensors, scale,
                         causal, layout, deterministic=deterministic)


def _with_grad_sinks(grads: tuple, softmax_lse: torch.Tensor) -> tuple:
    """The bwd op's outputs from a backend's (grad_query, grad_key, grad_value,
    grad_sinks or None): without sinks, grad_sinks is zeros, as the CANN op returns it (the
    spec's comment on grad_sinks), so the op's outputs never depend on its arguments.
    softmax_lse is (..., heads_q, rows) in every layout."""
    grad_query, grad_key, grad_value, grad_sinks = grads
    if grad_sinks is None:
        grad_sinks = softmax_lse.new_zeros(softmax_lse.shape[-2])
    return grad_query, grad_key, grad_value, grad_sinks


def _is_plain(defaults: dict, args: dict) -> bool:
    """Whether every feature argument has its default (``defaults``: the op's
    feature_defaults()): a plain call."""
    return all(args[name] is None if default is None else args[name] == default
               for name, default in defaults.items())


# ---------------------------------------------------------------------------------------
# Device kernels
# ---------------------------------------------------------------------------------------

# deterministic (autograd_only in the spec) only reaches the backward, through autograd.
def _fwd_kernel(*args, **kwargs):
    a = _arguments(_FWD_OP, args, kwargs)
    if _is_plain(_FWD_PLAIN, a):
        return plain_forward(*(a[name] for name in _FWD_CORE))
    device_type = a["query"].device.type
    backend = _serving(device_type)
    p = check_fwd(a["query"], a["key"], a["value"], a["key_padding_mask"], a["scale"],
                  a["causal"], a["layout"], backend, **_features(_FWD_OP, a))
    return _backend_call(backend, device_type, "forward", a["query"], a["key"], a["value"],
                         a["key_padding_mask"], scale=a["scale"], causal=a["causal"],
                         layout=a["layout"], variant=p.variant)


def _bwd_kernel(*args, **kwargs):
    a = _arguments(_BWD_OP, args, kwargs)
    if _is_plain(_BWD_PLAIN, a):
        return _with_grad_sinks(plain_backward(*(a[name] for name in _BWD_CORE),
                                               a["deterministic"]), a["softmax_lse"])
    device_type = a["query"].device.type
    backend = _serving(device_type)
    p = check_bwd(*(a[name] for name in _BWD_CORE), backend, **_features(_BWD_OP, a))
    grads = _backend_call(backend, device_type, "backward",
                          *(a[name] for name in _BWD_CORE[:8]), scale=a["scale"],
                          causal=a["causal"], layout=a["layout"],
                          deterministic=a["deterministic"], variant=p.variant)
    return _with_grad_sinks(grads, a["softmax_lse"])


def _fwd_kvcache_kernel(*args, **kwargs):
    a = _arguments(_KVCACHE_OP, args, kwargs)
    device_type = a["query"].device.type
    backend = _serving(device_type)
    c = check_kvcache(*(a[name] for name in _KVCACHE_CORE), backend=backend,
                      **{n: a[n] for n in _KVCACHE_MORE}, **_features(_KVCACHE_OP, a))
    seqlens_k = kvcache.append(a["k_cache"], a["v_cache"], a["key"], a["value"],
                               a["cache_seqlens"], a["cache_batch_idx"], a["block_table"], c)
    # TND queries: variant.cu_seqlens_q / max_seqlen_q delimit each sequence's rows.
    return _backend_call(backend, device_type, "kvcache_forward", a["query"], a["k_cache"],
                         a["v_cache"], seqlens_k, a["cache_batch_idx"], a["block_table"],
                         scale=a["scale"], causal=a["causal"], layout=a["layout"],
                         cache_leftpad=a["cache_leftpad"], variant=c.problem.variant,
                         num_splits=a["num_splits"])


_KERNELS = {"fwd": _fwd_kernel, "bwd": _bwd_kernel, "fwd_kvcache": _fwd_kvcache_kernel}


# The device types whose kernels are registered.
REGISTERED: set[str] = set()


def _without_dynamo(kernel: Callable) -> Callable:
    """``kernel``, run outside Dynamo's frame evaluation once Dynamo is loaded.

    torch.library.register_kernel wraps a kernel in torch._disable_dynamo, which imports
    torch._dynamo (~900 modules, seconds) on the kernel's first call, eager or not: the
    first feature call stalled on it. Dynamo can only evaluate frames after torch._dynamo
    is imported (torch.compile imports it), so until then there is nothing to disable
    and the kernel runs as it is; from then on it runs under torch._dynamo.disable, as
    register_kernel's kernels do."""
    disabled = None

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None or not hasattr(dynamo, "disable"):
                return kernel(*args, **kwargs)
            disabled = dynamo.disable(kernel, recursive=True)
        return disabled(*args, **kwargs)
    return run


def register_device(device_type: str) -> None:
    """Register the device kernels for ``device_type`` (called at import for the device
    types torch knows; the NPU shim calls it once torch_npu has named PrivateUse1)."""
    for name, kernel in _KERNELS.items():
        torch.library.impl(SPEC.qualname(name), device_type, _without_dynamo(kernel),
                           lib=_LIB)
    REGISTERED.add(device_type)


def _unavailable_reason(backend: BackendSpec, device_type: str) -> str:
    """What the backend lacks on ``device_type``, in its own words if it can say, else the
    spec's hint."""
    try:
        module = _module(backend, device_type)
    except ImportError:
        return backend.install_hint
    says = getattr(module, "unavailable_reason", None)
    return (says() if says else None) or backend.install_hint


def _registered_lazily(device_type: str) -> bool:
    """Register ``device_type``'s kernels if its backend can run now (e.g. torch_npu was
    imported after flash_cann); True if it did."""
    backend = backend_for(device_type)
    if backend is None or not is_available(backend, device_type):
        return False
    try:
        register_device(device_type)
    except (RuntimeError, ValueError):
        return False
    return True


def _fallback(op_name: str):
    """The kernel for device types with no registered kernel: register late if the
    device's backend became available, else say what to install."""
    def kernel(*args, **kwargs):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if _registered_lazily(device.type):
            return getattr(torch.ops.flash_cann, op_name)(*args, **kwargs)
        raise _no_backend(device.type)
    return kernel


def _no_backend(device_type: str) -> NotImplementedError:
    """The error for a device type no backend can run here: what each candidate lacks."""
    candidates = SPEC.backends_for_device(device_type)
    hint = "; ".join(filter(None, (f"{b.name}: {_unavailable_reason(b, device_type)}"
                                   for b in candidates)))
    supported = ", ".join(sorted({d for b in SPEC.backends.values() for d in b.device_types}))
    return NotImplementedError(
        f"flash_cann has no backend loaded for device type '{device_type}'"
        + (f": {hint}" if hint else f" (supported: {supported})"))


for _device_type in sorted({d for b in SPEC.backends.values() for d in b.device_types}):
    try:
        register_device(_device_type)
    except (RuntimeError, ValueError):
        pass  # a device type torch does not know yet (npu before torch_npu is imported)
for _op in SPEC.ops:
    _LIB.impl(_op, _fallback(_op), "CompositeExplicitAutograd")


@torch.library.register_fake(FWD, lib=_LIB)
def _fwd_fake(*args, **kwargs):
    a = _arguments(_FWD_OP, args, kwargs)
    query = a["query"]
    p = check_fwd(query, a["key"], a["value"], a["key_padding_mask"], a["scale"], a["causal"],
                  a["layout"], backend_for(query.device.type), **_features(_FWD_OP, a))
    return query.new_empty(query.shape), query.new_empty(
        lse_shape(p), dtype=accumulator_dtype(query.dtype))


@torch.library.register_fake(BWD, lib=_LIB)
def _bwd_fake(*args, **kwargs):
    a = _arguments(_BWD_OP, args, kwargs)
    query, key, value = a["query"], a["key"], a["value"]
    p = check_bwd(*(a[name] for name in _BWD_CORE), backend_for(query.device.type),
                  **_features(_BWD_OP, a))
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            query.new_empty((p.heads_q,), dtype=accumulator_dtype(query.dtype)))


@torch.library.register_fake(KVCACHE, lib=_LIB)
def _fwd_kvcache_fake(*args, **kwargs):
    a = _arguments(_KVCACHE_OP, args, kwargs)
    query = a["query"]
    c = check_kvcache(*(a[name] for name in _KVCACHE_CORE),
                      backend=backend_for(query.device.type),
                      **{n: a[n] for n in _KVCACHE_MORE}, **_features(_KVCACHE_OP, a))
    return query.new_empty(query.shape), query.new_empty(
        lse_shape(c.problem), dtype=accumulator_dtype(query.dtype))


# Autograd, by argument name from the spec: the backward op takes the forward's tensors
# and attributes by name, grad_<output> for each forward output's gradient, and returns
# grad_<input> for each forward input (spec.parse enforces the naming).
_FWD_ARGS = _FWD_OP.argument_names()
_BWD_ARGS = _BWD_OP.argument_names()
_SAVED = [t.name for t in _FWD_OP.inputs] + [t.name for t in _FWD_OP.outputs]
_OPTIONAL = {t.name for t in _FWD_OP.inputs if t.optional}


def _setup_context(ctx, inputs, output):
    args = dict(zip(_FWD_ARGS, inputs))
    args.update(zip((t.name for t in _FWD_OP.outputs), output))
    ctx.save_for_backward(*(args[name] for name in _SAVED))
    ctx.attrs = {a.name: args[a.name] for a in _FWD_OP.attrs}
    # Unused outputs arrive as None, so an unused lse costs nothing in backward.
    ctx.set_materialize_grads(False)


def _backward(ctx, *grads):
    args = {**dict(zip(_SAVED, ctx.saved_tensors)), **ctx.attrs}
    args.update((f"grad_{t.name}", g) for t, g in zip(_FWD_OP.outputs, grads))
    if args["grad_out"] is None:
        args["grad_out"] = torch.zeros_like(args["out"])
    # A backward-only attribute takes its spec default.
    args.update((a.name, a.default) for a in _BWD_OP.attrs if a.name not in args)
    results = getattr(torch.ops.flash_cann, _BWD_OP.name)(*(args[name] for name in _BWD_ARGS))
    by_name = dict(zip((t.name for t in _BWD_OP.outputs), results))
    # An optional input that was not given (sinks=None) gets no gradient, though the bwd
    # op always returns one (zeros).
    return tuple(None if name in _OPTIONAL and args[name] is None
                 else by_name.get(f"grad_{name}") for name in _FWD_ARGS)


def differentiable_once(backward):
    """An autograd backward that runs without a graph and whose results raise if they are
    differentiated (a second derivative of attention is not implemented). As
    torch.autograd.function.once_differentiable, except that saved inputs requiring grad
    count too: a gradient penalty on dL/dq (create_graph=True with an upstream gradient
    that needs none) raises instead of silently contributing zero."""
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            results = backward(ctx, *grads)
        if not torch.is_grad_enabled() or not any(
                t is not None and t.requires_grad for t in (*grads, *ctx.saved_tensors)):
            return results
        refuse = torch._C._functions.DelayedError(
            b"flash_cann: attention is differentiable once; a second derivative (backward "
            b"through gradients computed with create_graph=True) is not implemented",
            len(results))
        return refuse(*(None if r is None else r.detach().requires_grad_() for r in results))
    return wrapper


torch.library.register_autograd(FWD, differentiable_once(_backward),
                                setup_context=_setup_context, lib=_LIB)
