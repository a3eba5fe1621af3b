"""torch.ops.flash_cann as a PyTorch citizen: opcheck (schema, autograd registration,
fake tensors, AOT dispatch) on both ops, and torch.compile(fullgraph=True) matching
eager, forward and backward."""

from __future__ import annotations

import pytest
import torch

import flash_cann

from conftest import make_qkv, random_key_padding_mask

CONFIGS = [  # (layout, heads_q, heads_kv, seqlen_q, seqlen_k, masked, causal)
    ("BNSD", 4, 4, 9, 9, False, False),
    ("BNSD", 4, 2, 7, 12, True, True),
    ("BSND", 6, 2, 12, 7, True, False),
    ("BSND", 3, 1, 1, 5, False, True),
]


def _sample(config, gen, requires_grad=False, dtype=torch.float32):
    layout, hq, hk, sq, sk, masked, causal = config
    q, k, v = make_qkv(2, hq, hk, sq, sk, 16, dtype, layout, generator=gen)
    mask = random_key_padding_mask(2, sk, gen) if masked else None
    q, k, v = (t.requires_grad_(requires_grad) for t in (q, k, v))
    return q, k, v, mask, layout, causal


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_opcheck_fwd(config, gen):
    q, k, v, mask, layout, causal = _sample(config, gen, requires_grad=True)
    torch.library.opcheck(torch.ops.flash_cann.fwd.default, (q, k, v, mask, 0.25),
                          {"causal": causal, "layout": layout})


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("with_grad_lse", [False, True])
def test_opcheck_bwd(config, with_grad_lse, gen):
    q, k, v, mask, layout, causal = _sample(config, gen)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, mask, 0.25, causal, layout)
    grad_lse = torch.randn(lse.shape, generator=gen) if with_grad_lse else None
    torch.library.opcheck(torch.ops.flash_cann.bwd.default,
                          (torch.randn(out.shape, generator=gen), q, k, v, out, lse, mask,
                           grad_lse, 0.25), {"causal": causal, "layout": layout})


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_matches_eager(dynamic, gen):
    q, k, v, mask, _, _ = _sample(("BSND", 4, 2, 33, 47, True, True), gen, requires_grad=True,
                                  dtype=torch.bfloat16)

    def model(q_, k_, v_):
        a = flash_cann.flash_attn_func(q_, k_, v_, causal=True)
        b = flash_cann.attention(q_.flatten(-2), k_.flatten(-2), v_.flatten(-2), layout="BSH",
                                 num_heads=4, key_padding_mask=mask)
        return a.float().sum(-1) + b.unflatten(-1, (4, 16)).float().sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    eager_out = model(q, k, v)
    eager_grads = torch.autograd.grad(eager_out.sum(), (q, k, v))
    out = compiled(q, k, v)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(out, eager_out)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)
