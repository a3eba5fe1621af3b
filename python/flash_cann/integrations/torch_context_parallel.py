"""torch's own context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
running flash_cann's attention.

    with context_parallel(mesh, buffers=[input_ids, position_ids], buffer_seq_dims=[1, 1]):
        loss = model(input_ids, position_ids=position_ids).loss  # attention: flash_cann's
        loss.backward()

torch serves SDPA there in two parts (torch 2.13, ``_context_parallel/_attention.py``):
it wraps ``F.scaled_dot_product_attention``'s tensors into DTensors sharded on the
sequence, and registers handlers for the SDPA ops with DTensor's dispatcher
(``custom_ops``, merged into ``DTensor._op_dispatcher._custom_op_handlers`` while the
context is active), which run the ring. flash_cann does the same for its ops:

- :func:`register` adds handlers for ``torch.ops.flash_cann.fwd`` and ``.bwd`` to
  torch's ``custom_ops``, so they are active exactly while a ``context_parallel``
  context is; the handlers run flash_cann.distributed's forward and backward on the
  local shards (torch's options decide the rest: its head-tail load balancing is
  flash_cann's ``"zigzag"`` sharding, its rotate method ``"allgather"`` / ``"alltoall"``
  is ``"allgather"`` / ``"p2p"``).
- While the context is active, a torch-function mode turns the plain-tensor query, key
  and value of each ``torch.ops.flash_cann.fwd`` call into DTensors sharded on their
  sequence dimension, and the outputs back into local tensors (torch's
  ``sdpa_input_fn`` / ``sdpa_output_fn``), so a model calls flash_cann unchanged; the
  op's autograd then calls ``bwd`` on DTensors, which reaches the backward handler.

``import flash_cann`` registers this when torch's module is imported
(integrations.post_import), never importing torch.distributed itself. Where torch's
module lacks what this relies on (other torch versions), nothing is registered and
:data:`UNSUPPORTED` says why; flash_cann's import is unaffected.

Refused inside the context, by name: key padding masks, packed (TND) sequences, ALiBi,
dropout, sinks (the positions or the sums they need span ranks); call
flash_cann.distributed directly for packed documents.
"""

from __future__ import annotations

import inspect
import sys

import torch

# Where torch defines context_parallel: torch 2.13's module, and the older single module
# (which 2.13 keeps as a re-exporting shim); register() follows either to the definition.
MODULES = ("torch.distributed.tensor.experimental._context_parallel._attention",
           "torch.distributed.tensor.experimental._attention")
# What register needs from torch's module.
_NEEDS = ("custom_ops", "_cp_options", "_RotateMethod", "_enable_context_parallel_dispatcher_impl",
          "_disable_context_parallel_dispatcher_impl")
UNSUPPORTED: str | None = None  # why registration was skipped, if it was
_SEQ_DIM = {"BNSD": 2, "BSND": 1}
_REFUSED = {"key_padding_mask": None, "cu_seqlens_q": None, "cu_seqlens_k": None,
            "alibi_slopes": None, "rng_state": None, "sinks": None, "dropout_p": 0.0}


def _named(op, args, kwargs) -> dict:
    """The op's arguments by schema name, defaults filled in."""
    schema = op._schema.arguments
    named = {a.name: (a.default_value if a.has_default_value() else None) for a in schema}
    named.update(zip((a.name for a in schema), args))
    named.update(kwargs)
    return named


def _refuse_features(named: dict) -> None:
    for name, default in _REFUSED.items():
        if named.get(name) is not default and named.get(name) != default:
            raise NotImplementedError(
                f"flash_cann under torch's context_parallel: {name} is not supported across "
                f"ranks yet (got a non-default {name}); call flash_cann.distributed directly "
                f"(packed documents: context_parallel_varlen_attn_func)")
    if named["layout"] not in _SEQ_DIM:
        raise NotImplementedError(f"flash_cann under torch's context_parallel: layout "
                                  f"{named['layout']!r}; only BNSD and BSND are sharded")


def _local(t, seq_dim: int):
    """The local shard of a DTensor sharded on seq_dim of a 1-D mesh."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Shard
    if not isinstance(t, DTensor):
        return t
    if t.device_mesh.ndim != 1 or tuple(t.placements) != (Shard(seq_dim),):
        raise NotImplementedError(f"flash_cann under torch's context_parallel: tensors must "
                                  f"be sharded on the sequence dimension {seq_dim} of a 1-D "
                                  f"mesh (got {t.placements} on a {t.device_mesh.ndim}-D mesh)")
    return t._local_tensor


def _wrap(local: torch.Tensor, mesh, placement):
    """A DTensor of ``local`` (no communication, no autograd: inside dispatch)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.placement_types import Shard
    shape = list(local.shape)
    if isinstance(placement, Shard):
        shape[placement.dim] *= mesh.size()
    stride = torch.empty(shape, device="meta").stride()
    spec = DTensorSpec(mesh, (placement,), tensor_meta=TensorMeta(torch.Size(shape), stride,
                                                                  local.dtype))
    return DTensor(local, spec, requires_grad=False)


def _setup(attention, named, q, k, v):
    from ..distributed import attention as cp
    options = attention._cp_options
    return cp.prepare(
        q, k, v, named["query"].device_mesh.get_group(), scale=named["scale"],
        causal=named["causal"], window=(named["window_left"], named["window_right"]),
        softcap=named["softcap"], sharding="zigzag" if options.enable_load_balance
        else "contiguous", rotate="allgather" if options.rotate_method
        == attention._RotateMethod.ALL_GATHER else "p2p",
        deterministic=named["deterministic"], layout=named["layout"],
        fp16_scores=named["fp16_scores"])


def _handlers(attention):
    """The DTensor handlers of flash_cann's fwd and bwd, for torch's module ``attention``."""
    from torch.distributed.tensor.placement_types import Replicate, Shard

    from ..distributed import attention as cp

    def forward(op_call, args, kwargs):
        named = _named(op_call, args, kwargs)
        _refuse_features(named)
        dim = _SEQ_DIM[named["layout"]]
        mesh = named["query"].device_mesh
        q, k, v = (_local(named[n], dim) for n in ("query", "key", "value"))
        out, lse = cp.forward(_setup(attention, named, q, k, v), q, k, v)
        return _wrap(out, mesh, Shard(dim)), _wrap(lse, mesh, Shard(2))

    def backward(op_call, args, kwargs):
        named = _named(op_call, args, kwargs)
        _refuse_features(named)
        dim = _SEQ_DIM[named["layout"]]
        mesh = named["query"].device_mesh
        q, k, v, out, dout = (_local(named[n], dim) for n in
                              ("query", "key", "value", "out", "grad_out"))
        lse = _local(named["softmax_lse"], 2)
        dlse = None if named["grad_softmax_lse"] is None else _local(named["grad_softmax_lse"], 2)
        grads = cp.backward(_setup(attention, named, q, k, v), q, k, v, out, lse, dout, dlse)
        heads = q.shape[1] if named["layout"] == "BNSD" else q.shape[2]
        sinks = torch.zeros(heads, dtype=lse.dtype, device=q.device)  # no sinks here
        return (*(_wrap(g, mesh, Shard(dim)) for g in grads), _wrap(sinks, mesh, Replicate()))

    return {torch.ops.flash_cann.fwd.default: forward, torch.ops.flash_cann.bwd.default: backward}


class _ShardFlashCannInputs(torch.overrides.TorchFunctionMode):
    """While torch's context_parallel is active: the plain query/key/value of each
    flash_cann fwd call become DTensors sharded on the sequence (torch's sdpa_input_fn),
    and its outputs local tensors again (sdpa_output_fn)."""

    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in (torch.ops.flash_cann.fwd, torch.ops.flash_cann.fwd.default):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.placement_types import Shard
        op = torch.ops.flash_cann.fwd.default
        named = _named(op, args, kwargs)
        if isinstance(named["query"], DTensor) or named["layout"] not in _SEQ_DIM:
            return func(*args, **kwargs)  # already distributed, or refused by the handler
        placement = [Shard(_SEQ_DIM[named["layout"]])]
        for name in ("query", "key", "value"):
            named[name] = DTensor.from_local(named[name], self.mesh, placement, run_check=False)
        out, lse = op(**named)
        return out.to_local(), lse.to_local()


def register(attention) -> None:
    """Add flash_cann's handlers to torch's context-parallel module ``attention`` (called
    by ``import flash_cann`` when one of :data:`MODULES` is imported)."""
    global UNSUPPORTED
    context_parallel = getattr(attention, "context_parallel", None)
    if context_parallel is not None:  # a re-exporting shim: go to the module whose names
        # context_parallel looks up (its __module__ is rewritten for the docs; its
        # globals are not)
        globals_ = inspect.unwrap(context_parallel).__globals__
        attention = sys.modules.get(globals_.get("__name__"), attention)
    missing = [name for name in _NEEDS if not hasattr(attention, name)]
    if missing:
        UNSUPPORTED = (f"torch {torch.__version__}'s {attention.__name__} lacks "
                       f"{', '.join(missing)}")
        return
    if getattr(attention, "_flash_cann_registered", False):
        return
    attention.custom_ops.update(_handlers(attention))
    enable, disable = (attention._enable_context_parallel_dispatcher_impl,
                       attention._disable_context_parallel_dispatcher_impl)
    modes = []

    def enable_with_flash_cann(seq_dim, mesh):
        enable(seq_dim, mesh)
        mode = _ShardFlashCannInputs(mesh)
        mode.__enter__()
        modes.append(mode)

    def disable_with_flash_cann():
        if modes:
            modes.pop().__exit__(None, None, None)
        disable()

    attention._enable_context_parallel_dispatcher_impl = enable_with_flash_cann
    attention._disable_context_parallel_dispatcher_impl = disable_with_flash_cann
    attention._flash_cann_registered = True
