"""The one oracle harness every backend's tests call (CPU, Triton on a GPU or in the
interpreter, the twin, and the twin's backward): build a case's fresh random inputs,
run a backend forward (and backward) and judge every result against the float64
oracle with flash_cann.tools.accuracy's tolerances.

``attention`` is any callable with a backend module's forward signature,
``attention(q, k, v, key_padding_mask, *, scale, causal, layout) -> (out, lse)``:
:func:`through_op` (torch.ops.flash_cann, checks and autograd included),
or ``flash_cann.backends.twin.forward``."""

from __future__ import annotations

import contextlib
import math

import torch

import flash_cann
from flash_cann.tools import accuracy
from flash_cann.contract.variant import Variant

from conftest import make_qkv, random_key_padding_mask


def through_op(q, k, v, key_padding_mask, *, scale, causal, layout):
    """The public op contract (whichever backend serves the tensors' device now)."""
    return flash_cann.attention(q, k, v, layout=layout, causal=causal, scale=scale,
                                key_padding_mask=key_padding_mask, return_lse=True)


def triton_poisoning():
    """Context for :func:`check`'s ``within``: every buffer the Triton kernels (CUDA and
    NPU hosts) must write starts as NaN, so that an element no kernel wrote fails the
    comparison."""
    from flash_cann.backends.triton import buffers as triton_buffers

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


def packed_lengths(seqlens, device="cpu"):
    """cu_seqlens_q, cu_seqlens_k (int32 on ``device``) and max lengths of a list of
    per-sequence (seqlen_q, seqlen_k)."""
    def cumulative(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)

    lengths_q, lengths_k = zip(*seqlens)
    return (cumulative(lengths_q).to(device), cumulative(lengths_k).to(device),
            max(lengths_q), max(lengths_k))


def check_variant(device, dtype, *, gen, seqlens, heads=(2, 2), head_dim=32, layout="BSND",
                  causal=False, window=(-1, -1), softcap=0.0, alibi=None, dropout_p=0.0,
                  masked=False, backward="full", within=contextlib.nullcontext, batch=2,
                  scale=None, sinks=False):
    """One case of the features through the public flash-attn API vs the float64 oracle.

    ``layout`` "BSND" (flash_attn_func; ``seqlens`` = (seqlen_q, seqlen_k), ``batch``
    sequences, ``masked`` adds a key padding mask through flash_cann.attention) or "TND"
    (flash_attn_varlen_func; ``seqlens`` = one (seqlen_q, seqlen_k) per sequence).
    ``alibi``: None, "heads" (slopes (heads_q,)), "batch" ((batch, heads_q)) or
    "transposed" ((batch, heads_q) as a transposed view: a head stride of batch, not 1).
    ``sinks``: attention sinks, one float32 logit per query head (not differentiated
    here: test_features checks their gradient).
    With dropout the oracle is fed the mask the call returned in S_dmask (dropped =
    negative), and the call is repeated with the same seed for the gradients."""
    heads_q, heads_kv = heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    packed = layout == "TND"
    if packed:
        batch = len(seqlens)
        cu_q, cu_k, max_q, max_k = packed_lengths(seqlens, device)
        q, k, v = make_qkv(1, heads_q, heads_kv, int(cu_q[-1]), int(cu_k[-1]), head_dim, dtype,
                           "BSND", device=device, generator=gen)
        q, k, v = q[0], k[0], v[0]
    else:
        q, k, v = make_qkv(batch, heads_q, heads_kv, *seqlens, head_dim, dtype, "BSND",
                           device=device, generator=gen)
    mask = random_key_padding_mask(batch, seqlens[1], gen, device) if masked else None
    slopes = None
    if alibi is not None:
        shape = {"heads": (heads_q,), "batch": (batch, heads_q), "transposed": (heads_q, batch)}
        slopes = (torch.rand(shape[alibi], generator=gen) * 0.5).to(device)
        slopes = slopes.T if alibi == "transposed" else slopes
    # Around the rows' largest scores, so the sink takes a fair share of each row.
    sink_logits = (torch.randn(heads_q, generator=gen) + 1.0).to(device) if sinks else None
    seed = int(torch.randint(2**31, (1,), generator=gen))
    features = dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                    alibi_slopes=slopes, dropout_p=dropout_p, return_attn_probs=True,
                    sinks=sink_logits)

    def call(q_, k_, v_):
        rng = torch.Generator(device).manual_seed(seed)  # the same dropout mask every call
        if packed:
            out, lse, probs = flash_cann.flash_attn_varlen_func(
                q_, k_, v_, cu_q, cu_k, max_q, max_k, generator=rng, **features)
        elif masked:
            out, lse = flash_cann.attention(
                q_, k_, v_, layout="BSND", key_padding_mask=mask, return_lse=True,
                scale=scale, causal=causal, window_size=window, softcap=softcap,
                alibi_slopes=slopes, dropout_p=dropout_p, sinks=sink_logits, generator=rng)
            probs = None
        else:
            out, lse, probs = flash_cann.flash_attn_func(q_, k_, v_, generator=rng, **features)
        return out, lse, probs

    dropout_mask = None
    if dropout_p > 0:
        if masked:
            raise ValueError("check_variant: dropout cases go through flash_attn_func "
                             "(S_dmask), without a key padding mask")
        with torch.no_grad(), within():
            probs = call(q, k, v)[2]
        kept = ~torch.signbit(probs)
        dropout_mask = ([kept[b, :, :n_q, :n_k] for b, (n_q, n_k) in enumerate(seqlens)]
                        if packed else kept)
    variant = Variant(window_left=window[0], window_right=window[1], softcap=softcap,
                      alibi_slopes=slopes, dropout_p=dropout_p, sinks=sink_logits,
                      cu_seqlens_q=cu_q if packed else None, cu_seqlens_k=cu_k if packed else None,
                      max_seqlen_q=max_q if packed else 0, max_seqlen_k=max_k if packed else 0)
    with within():
        return accuracy.check_against_oracle(
            lambda q_, k_, v_: call(q_, k_, v_)[:2], q, k, v, scale=scale, causal=causal,
            layout=layout, key_padding_mask=mask, generator=gen, backward=backward,
            variant=variant, dropout_mask=dropout_mask)
