"""One oracle check of the Triton backend, shared by the GPU tests (test_triton.py) and
the interpreter tests (test_triton_interpreter.py): fresh random inputs, outputs
poisoned with NaN so that an element no kernel wrote fails the comparison."""

from __future__ import annotations

import math

import torch

import flash_cann
from flash_cann import accuracy
from flash_cann.backends.triton_buffers import poisoned_outputs

from conftest import make_qkv, random_key_padding_mask


def check(device, dtype, *, causal, masked, heads, head_dim, seqlens, layout, gen, batch=None,
          inputs=None, empty_sequence=False, scale=None):
    """Forward and backward through flash_cann.attention vs the float64 oracle.
    ``inputs`` (optional) maps the fresh (q, k, v) to other views of them (e.g. strided);
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
    with poisoned_outputs():
        return accuracy.check_against_oracle(
            lambda q_, k_, v_: flash_cann.attention(q_, k_, v_, layout=layout, causal=causal,
                                                    key_padding_mask=mask, scale=scale,
                                                    return_lse=True),
            q, k, v, scale=scale, causal=causal, layout=layout,
            key_padding_mask=mask, generator=gen)


def assert_all_ok(results):
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))


def packed_views(q, k, v):
    """q, k, v as non-contiguous slices of one packed tensor, as a fused QKV projection
    produces them (for BSND: (batch, seqlen, 3, heads, head_dim)); needs
    seqlen_q == seqlen_k and heads_q == heads_kv."""
    packed = torch.stack((q, k, v), dim=2)
    return packed.unbind(2)


def expanded_grad_check(device, dtype, *, causal, layout, gen):
    """out.sum().backward(): dO arrives expanded (every stride 0) and no lse gradient,
    a path check_against_oracle does not take. Gradients vs the float64 oracle."""
    from flash_cann import reference

    q, k, v = make_qkv(2, 4, 2, 37, 53, 64, dtype, layout, device=device, generator=gen)
    mask = random_key_padding_mask(2, 53, gen, device)

    def grads(fn, q_, k_, v_):
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q_, k_, v_))
        fn(q_, k_, v_).sum().backward()
        return q_.grad, k_.grad, v_.grad

    def materialising(compute_dtype):
        return lambda q_, k_, v_: reference.attention(
            q_, k_, v_, mask, scale=0.125, causal=causal, layout=layout,
            compute_dtype=compute_dtype)[0].double()

    with poisoned_outputs():
        got = grads(lambda q_, k_, v_: flash_cann.attention(
            q_, k_, v_, layout=layout, causal=causal, scale=0.125, key_padding_mask=mask),
            q, k, v)
    oracle = grads(materialising(torch.float64), q.double(), k.double(), v.double())
    baseline = grads(materialising(dtype), q, k, v)
    return [accuracy.compare(name, "grad", g, o, b, dtype)
            for name, g, o, b in zip(("dq", "dk", "dv"), got, oracle, baseline)]
