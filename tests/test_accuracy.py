"""Forward and backward of torch.ops.flash_cann on the CPU backend against the float64
oracle, over the issue's grid. Tolerances: flash_cann.tools.accuracy (one place)."""

from __future__ import annotations

import pytest
import torch

import flash_cann
from flash_cann.backends.cpu import attention as cpu

from conftest import DTYPES, make_qkv, random_key_padding_mask
from oracle_checks import assert_all_ok, check

HEAD_DIMS = [16, 64, 80, 128, 256]
# (seqlen_q, seqlen_k): the sizes {1, 17, 128, 1000}, square and not.
SEQLENS = [(1, 1), (17, 17), (128, 128), (1000, 1000), (1, 17), (17, 128), (128, 1000),
           (1000, 128)]
# (heads_q, heads_kv): MHA, GQA, MQA.
HEADS = [(2, 2), (4, 2), (4, 1)]


@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}-{h[1]}")
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_oracle(dtype, causal, masked, heads, head_dim, seqlens, gen):
    layout = "BSND" if head_dim % 32 else "BNSD"  # both layouts across the grid
    assert_all_ok(check("cpu", dtype, causal=causal, masked=masked, heads=heads,
                        head_dim=head_dim, seqlens=seqlens, layout=layout, gen=gen))


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_block_sizes_agree(layout, causal, gen):
    """Tiling must not change the result beyond fp32 rounding."""
    q, k, v = make_qkv(2, 4, 2, 300, 450, 64, torch.float32, layout, generator=gen)
    mask = random_key_padding_mask(2, 450, gen)
    d_out = torch.randn(q.shape, generator=gen)
    args = dict(scale=0.125, causal=causal, layout=layout)
    results = []
    for block_q, block_k in [(16, 16), (64, 128), (128, 256), (512, 512), (7, 300)]:
        out, lse = cpu.forward(q, k, v, mask, block_q=block_q, block_k=block_k, **args)
        grads = cpu.backward(d_out, q, k, v, out, lse, mask, None, block_q=block_q,
                             block_k=block_k, **args)[:3]
        results.append((out, lse, *grads))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64(gen):
    """torch.autograd.gradcheck through torch.ops.flash_cann in float64 (CPU backend)."""
    q, k, v = make_qkv(1, 4, 2, 5, 7, 8, torch.float64, "BNSD", generator=gen)
    mask = torch.tensor([[True, True, False, True, True, True, False]])
    for causal in (False, True):
        def fn(q_, k_, v_):
            return flash_cann.attention(q_, k_, v_, causal=causal, key_padding_mask=mask)
        assert torch.autograd.gradcheck(fn, tuple(t.requires_grad_() for t in (q, k, v)))


def test_gradcheck_float64_lse_gradient(gen):
    """The gradient that flows into q and k through softmax_lse (dD = -dLSE) is exact."""
    q, k, v = make_qkv(1, 2, 2, 4, 6, 8, torch.float64, "BSND", generator=gen)

    def fn(q_, k_, v_):
        out, lse = flash_cann.attention(q_, k_, v_, layout="BSND", causal=True,
                                        return_lse=True)
        return out, lse  # float64 inputs: the accumulator (lse) dtype is float64 too
    assert torch.autograd.gradcheck(fn, tuple(t.requires_grad_() for t in (q, k, v)),
                                    atol=1e-5, rtol=1e-3)


def _with_torch_threads(threads: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = fn()
        assert torch.get_num_threads() == threads  # the call restored torch's count
        return result
    finally:
        torch.set_num_threads(before)


def test_worker_threads_agree_and_repeat_bitwise(gen):
    """The backend spreads blocks over torch.get_num_threads() workers, one torch thread
    per op (cpu.attention's docstring): any count agrees within fp32 rounding, and the
    same count repeats bit for bit (the backward adds its workers' dQ in order)."""
    q, k, v = make_qkv(1, 4, 2, 200, 230, 32, torch.float32, "BNSD", generator=gen)
    d_out = torch.randn(q.shape, generator=gen)
    args = dict(scale=0.2, causal=True, layout="BNSD", block_q=32, block_k=32)

    def run():
        out, lse = cpu.forward(q, k, v, None, **args)
        return (out, lse, *cpu.backward(d_out, q, k, v, out, lse, None, None, **args)[:3])

    one = _with_torch_threads(1, run)
    three, again = (_with_torch_threads(3, run) for _ in range(2))
    for a, b, c in zip(one, three, again):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        assert torch.equal(b, c)


def test_worker_threads_write_inference_tensors_under_inference_mode(gen):
    q, k, v = make_qkv(1, 2, 2, 100, 100, 16, torch.float32, "BNSD", generator=gen)
    with torch.inference_mode():
        out, _ = _with_torch_threads(2, lambda: cpu.forward(q, k, v, None, scale=0.25,
                                                            causal=True, layout="BNSD",
                                                            block_q=16, block_k=16))
    torch.testing.assert_close(out, cpu.forward(q, k, v, None, scale=0.25, causal=True,
                                                layout="BNSD")[0], rtol=1e-5, atol=1e-5)
