"""The one oracle harness every backend's tests call (CPU, Triton on a GPU or in the
interpreter, the twin, and the twin's backward): build a case's fresh random inputs,
run a backend forward (and backward) and judge every result against the float64
oracle with flash_cann.accuracy's tolerances.

``attention`` is any callable with a backend module's forward signature,
``attention(q, k, v, key_padding_mask, *, scale, causal, layout) -> (out, lse)``:
:func:`through_op` (torch.ops.flash_cann, checks and autograd included),
or ``flash_cann.backends.twin.forward``."""

from __future__ import annotations

import contextlib
import math

import torch

import flash_cann
from flash_cann import accuracy

from conftest import make_qkv, random_key_padding_mask


def through_op(q, k, v, key_padding_mask, *, scale, causal, layout):
    """The public op contract (whichever backend serves the tensors' device now)."""
    return flash_cann.attention(q, k, v, layout=layout, causal=causal, scale=scale,
                                key_padding_mask=key_padding_mask, return_lse=True)


def triton_poisoning():
    """Context for :func:`check`'s ``within``: every buffer the Triton kernels (CUDA and
    NPU hosts) must write starts as NaN, so that an element no kernel wrote fails the
    comparison."""
    from flash_cann.backends import triton_buffers

    return triton_buffers.poisoned_outputs()


def check(device, dtype, *, causal, masked, heads, head_dim, seqlens, layout, gen,
          attention=through_op, backward="full", within=contextlib.nullcontext, batch=None,
          inputs=None, empty_sequence=False, scale=None):
    """One case (sizes ``heads`` = (heads_q, heads_kv), ``seqlens`` = (seqlen_q,
    seqlen_k)) of ``attention`` vs the float64 oracle; returns the comparisons.
    ``backward``: one of accuracy.BACKWARD_MODES; ``within``: a context (factory) the
    backend's forward and backward run in, e.g. :func:`triton_poisoning`; ``batch``
    defaults to 2 (1 for large cases); ``inputs`` maps the fresh (q, k, v) to other
    views of them (e.g. strided);
    ``empty_sequence`` pads every key of the first sequence (needs ``masked``);
    ``scale`` defaults to 1 / sqrt(head_dim)."""
    (heads_q, heads_kv), (seqlen_q, seqlen_k) = heads, seqlens
    if batch is None:
        batch = 1 if seqlen_q * seqlen_k > 10**5 else 2
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, layout,
                       device=device, generator=gen)
    if inputs is not None:
        q, k, v = inputs(q, k, v)
    mask = random_key_padding_mask(batch, seqlen_k, gen, device) if masked else None
    if empty_sequence:
        mask[0] = False
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    with within():
        return accuracy.check_against_oracle(
            lambda q_, k_, v_: attention(q_, k_, v_, mask, scale=scale, causal=causal,
                                         layout=layout),
            q, k, v, scale=scale, causal=causal, layout=layout, key_padding_mask=mask,
            generator=gen, backward=backward)


def assert_all_ok(results):
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))


def packed_views(q, k, v):
    """q, k, v as non-contiguous slices of one packed tensor, as a fused QKV projection
    produces them (for BSND: (batch, seqlen, 3, heads, head_dim)); needs
    seqlen_q == seqlen_k and heads_q == heads_kv."""
    packed = torch.stack((q, k, v), dim=2)
    return packed.unbind(2)
