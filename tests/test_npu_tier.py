"""The NPU tier (``pytest -m npu``): every op and feature on a real Ascend NPU against the CPU
backend. Untested on an NPU: no machine here has one; CI collects this module (so it stays
importable and its selection is checked, test_npu_tier_selection.py) and every test skips,
saying what is missing (flash_cann.backends.npu.launcher.unavailable_reason()).

Tolerances, max absolute error against the CPU backend on the same fp16 / bf16 inputs (the CPU
backend accumulates in fp32 as the kernels do; outputs and gradients here are O(1)):
fp16 2e-2, bf16 6e-2 (bf16's 8-bit mantissa: 4x fp16's unit roundoff at 1.0, plus accumulation
order). Deterministic repeats, graph replays and compiled calls must be **bitwise** equal to the
eager NPU call.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

import flash_cann

pytestmark = pytest.mark.npu

TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 6e-2}


def _npu_reason() -> str | None:
    if os.environ.get("FAKE_TORCH_NPU_LIB"):
        return "the fake NPU of tests/npu_standins is not an NPU"
    from flash_cann.backends.npu import launcher
    return launcher.unavailable_reason()


@pytest.fixture(scope="module")
def npu():
    reason = _npu_reason()
    if reason:
        pytest.skip(f"needs an Ascend NPU with the flash-cann package and extension: {reason}")
    return torch.device("npu")


def _inputs(device, dtype, b=2, s=256, h=4, hk=4, d=128, sk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, s, h, d), (b, sk or s, hk, d), (b, sk or s, hk, d))
    return [torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_()
            for shape in shapes]


def _fwd_bwd(device, dtype, hk=4, sk=None, d=128, **kwargs):
    q, k, v = _inputs(device, dtype, hk=hk, sk=sk, d=d)
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device)
    if kwargs.pop("with_sinks", False):
        kwargs["sinks"] = torch.linspace(-1, 1, 4, device=device)
    out = flash_cann.flash_attn_func(q, k, v, **kwargs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out)
    out.backward(grad)
    return [out, q.grad, k.grad, v.grad]


def _close(got, want, dtype, what):
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = g.detach().float().cpu(), w.detach().float()
        assert g.shape == w.shape, f"{what} output {i}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        error = (g - w).abs().max().item()
        assert error <= TOLERANCE[dtype], f"{what} output {i}: max |npu - cpu| {error:.3g} > {TOLERANCE[dtype]}"


FEATURES = {
    "plain": {}, "causal": {"causal": True}, "window": {"window_size": (64, 0)},
    "window-both": {"window_size": (32, 32)}, "softcap": {"softcap": 30.0},
    "alibi": {"alibi": True, "causal": True}, "gqa": {"hk": 2}, "mqa": {"hk": 1},
    "cross-length": {"sk": 384}, "head-dim-64": {"d": 64}, "sinks": {"with_sinks": True},
    "fp16-scores": {"fp16_scores": True},
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_forward_and_backward_match_the_cpu_backend(npu, feature, dtype):
    if feature == "fp16-scores" and dtype == torch.bfloat16:
        pytest.skip("fp16_scores applies to fp16 inputs (the API refuses bf16)")
    kwargs = FEATURES[feature]
    _close(_fwd_bwd(npu, dtype, **dict(kwargs)), _fwd_bwd("cpu", dtype, **dict(kwargs)), dtype,
           feature)


def _dropout(device, dtype, causal):
    """The op with one (seed, offset) on both devices: the kernel's Philox mask is
    contract.variant.keep_mask's (bit for bit on the twin, tests/test_twin_philox.py), which
    the cpu backend follows, so both keep the same probabilities. flash_attn_func would draw
    the seed from each device's own generator."""
    q, k, v = _inputs(device, dtype)
    rng_state = torch.tensor([20240, 3], dtype=torch.int64, device=device)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 128 ** -0.5, causal=causal,
                                        layout="BSND", rng_state=rng_state, dropout_p=0.2)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out)
    out.backward(grad)
    return [out, lse, q.grad, k.grad, v.grad]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_forward_and_backward_match_the_cpu_backend(npu, causal, dtype):
    _close(_dropout(npu, dtype, causal), _dropout("cpu", dtype, causal), dtype, "dropout")


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_repeats_bitwise(npu, causal):
    runs = [_fwd_bwd(npu, torch.float16, causal=causal, deterministic=True) for _ in range(3)]
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a, b), "deterministic=True gave different bits on a repeat"


def _varlen(device, dtype):
    g = torch.Generator().manual_seed(3)
    lengths = [300, 17, 128, 1]
    total = sum(lengths)
    q, k, v = (torch.randn(total, 4, 128, generator=g).to(device=device, dtype=dtype)
               .requires_grad_() for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device=device)
    out = flash_cann.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                            causal=True)
    out.float().pow(2).sum().backward()
    return [out, q.grad, k.grad, v.grad]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_tnd_packed_batches_match_the_cpu_backend(npu, dtype):
    _close(_varlen(npu, dtype), _varlen("cpu", dtype), dtype, "TND")


def _decode(device, dtype, page=128, window=(-1, -1)):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(3, 1, 8, 128, generator=g).to(device=device, dtype=dtype)
    k_cache, v_cache = (torch.randn(12, page, 2, 128, generator=g).to(device=device, dtype=dtype)
                        for _ in range(2))
    block_table = torch.tensor([[3, 0, 7, 1], [5, 2, 11, 4], [9, 8, 6, 10]], dtype=torch.int32,
                               device=device)
    seqlens = torch.tensor([4 * page - 5, page + 1, 7], dtype=torch.int32, device=device)
    return [flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               block_table=block_table, causal=True,
                                               window_size=window)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("page, window", [(128, (-1, -1)), (256, (-1, -1)), (128, (100, 0))])
def test_decode_with_paged_caches_matches_the_cpu_backend(npu, dtype, page, window):
    _close(_decode(npu, dtype, page, window), _decode("cpu", dtype, page, window), dtype,
           f"decode page {page} window {window}")


def test_capture_into_an_npu_graph_replays_bitwise(npu):
    q, k, v = (t.detach() for t in _inputs(npu, torch.float16))
    step = lambda: flash_cann.flash_attn_func(q, k, v, causal=True)
    eager = step()
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        out = step()
    for seed in (1, 2):
        for t, new in zip((q, k, v), _inputs(npu, torch.float16, seed=seed)):
            t.copy_(new.detach())
        graph.replay()
        assert torch.equal(out, step()), "a replay differs from the eager call on its inputs"
    del eager


@pytest.mark.parametrize("mode", ["torchair-reduce-overhead", "npugraph_ex", "torchair-ge"])
def test_compiled_calls_match_eager(npu, mode):
    q, k, v = (t.detach() for t in _inputs(npu, torch.float16))
    fn = lambda q, k, v: flash_cann.flash_attn_func(q, k, v, causal=True)
    if mode == "npugraph_ex":
        compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=False)
    else:
        torchair = importlib.import_module("torchair")
        from flash_cann.integrations.torchair import enable_torchair
        enable_torchair()
        config = torchair.CompilerConfig()
        if mode == "torchair-reduce-overhead":
            config.mode = "reduce-overhead"
        compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config))
    got, want = compiled(q, k, v), fn(q, k, v)
    if mode == "torchair-ge":  # a GE graph may fuse around the node: the CPU tolerance
        _close([got], [fn(*(t.cpu() for t in (q, k, v)))], torch.float16, mode)
    else:  # the eager kernels captured: the same bits
        assert torch.equal(got, want)
