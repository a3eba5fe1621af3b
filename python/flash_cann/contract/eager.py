"""The public functions' eager fast path: a plain call (no features) reaches the op's
kernel without torch's dispatcher.

``torch.ops.flash_cann.fwd`` boxes each of its 18 schema arguments into and out of the
dispatcher, and torch.library's autograd wrapper runs in Python: on a small call that
was most of the host time (benchmarks/NOTES.md, steps H1 and H3). Where nothing can
observe the difference, :func:`attention` calls the kernel functions the op's kernels call
(``ops.plain_forward`` / ``ops.plain_backward``: the same checks, plans and backends, the
same results bit for bit), through :class:`_Attention`, an autograd.Function, when a
gradient is wanted. Everywhere else the public functions call the op, which stays the
contract (torch.compile, opcheck, the CANN and torchair paths see only the op).

Nothing can observe the difference when:
  * torch.compile is not tracing (Dynamo must see the op),
  * no torch function mode (FakeTensorMode's, FlopCounterMode, ``with torch.device``),
    dispatch mode or functorch transform (vmap, grad) is active,
  * the tensors are plain tensors (not subclasses: FakeTensor, DTensor, ...) on a device
    type whose kernels are registered.
"""

from __future__ import annotations

import torch

from . import ops


def applies(query, key, value, key_padding_mask=None) -> bool:
    """Whether a plain call on these tensors may skip the op. Only the query's device is
    looked at: key and value elsewhere make a signature the checks refuse."""
    return not (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
                or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active()) \
        and type(query) is torch.Tensor and type(key) is torch.Tensor \
        and type(value) is torch.Tensor and query.device.type in ops.REGISTERED \
        and (key_padding_mask is None or type(key_padding_mask) is torch.Tensor)


def attention(query, key, value, key_padding_mask, scale: float, causal: bool, layout: str,
              deterministic: bool):
    """(out, softmax_lse) of a plain call, as ``torch.ops.flash_cann.fwd`` computes them;
    call only where :func:`applies`."""
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                    or value.requires_grad):
        return _Attention.apply(query, key, value, key_padding_mask, scale, causal, layout,
                                deterministic)
    return ops.plain_forward(query, key, value, key_padding_mask, scale, causal, layout)


class _Attention(torch.autograd.Function):
    """The op's autograd formula (ops._backward), for the fast path: the backward runs the
    bwd op's kernel. Differentiable once, as the op (ops.differentiable_once)."""

    @staticmethod
    def forward(ctx, query, key, value, key_padding_mask, scale, causal, layout,
                deterministic):
        out, lse = ops.plain_forward(query, key, value, key_padding_mask, scale, causal,
                                     layout)
        ctx.save_for_backward(query, key, value, key_padding_mask, out, lse)
        ctx.attrs = (scale, causal, layout, deterministic)
        # An unused output's gradient arrives as None (an unused lse costs nothing).
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @ops.differentiable_once
    def backward(ctx, grad_out, grad_lse):
        query, key, value, key_padding_mask, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        grad_query, grad_key, grad_value, _ = ops.plain_backward(
            grad_out, query, key, value, out, lse, key_padding_mask, grad_lse, *ctx.attrs)
        return grad_query, grad_key, grad_value, None, None, None, None, None
