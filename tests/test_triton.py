"""The Triton backend on a CUDA GPU: forward and backward through torch.ops.flash_cann
against the float64 oracle over test_accuracy's grid (float16/bfloat16), long sequences,
every autotuning candidate, both load paths, strided and expanded inputs, determinism,
torch.compile, opcheck and O(N) memory. Outputs are poisoned with NaN before every run
(oracle_checks.triton_poisoning), inputs are fresh per case. Tolerances: flash_cann.tools.accuracy.
Skipped without a CUDA GPU and triton (test_triton_interpreter.py runs a few cases on
the CPU)."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

import flash_cann
from flash_cann.contract import ops
from flash_cann.tools import memory

from conftest import make_qkv, random_key_padding_mask
from test_accuracy import HEAD_DIMS, HEADS, SEQLENS
import oracle_checks
from oracle_checks import assert_all_ok, packed_views
from test_features import (CACHE_FEATURES, CACHE_IDS, CACHE_LAYOUTS, check_capacity_guard,
                           check_kvcache)
from test_serving import (check_leftpad, check_rotary, check_seqused_packed, check_vllm_paged,
                          paged_cache)

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and importlib.util.find_spec("triton") is not None),
    reason="needs a CUDA GPU and triton")

check = functools.partial(oracle_checks.check, within=oracle_checks.triton_poisoning)
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16"}  # -k bf16 / -k fp16 shard


@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}-{h[1]}")
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_matches_oracle(dtype, causal, masked, heads, head_dim, seqlens, gen):
    layout = "BSND" if head_dim % 32 else "BNSD"  # both layouts, as test_accuracy does
    assert_all_ok(check("cuda", dtype, causal=causal, masked=masked, heads=heads,
                        head_dim=head_dim, seqlens=seqlens, layout=layout, gen=gen))


LONG = [  # (dtype, causal, masked, (heads_q, heads_kv), head_dim, (seqlen_q, seqlen_k))
    (torch.bfloat16, True, True, (2, 1), 128, (8192, 8192)),
    (torch.float16, False, False, (2, 2), 64, (8000, 8192)),
    (torch.bfloat16, True, False, (1, 1), 128, (16384, 16384)),
    (torch.float16, False, True, (1, 1), 64, (16384, 16000)),
]


@pytest.mark.parametrize("case", LONG, ids=lambda c: f"{DTYPE_IDS[c[0]]}-{c[5][0]}x{c[5][1]}")
def test_long_sequences(case, gen):
    """8k and 16k, forward and backward (the oracle materialises the score matrix in
    float64: 2 GiB per head at 16k)."""
    dtype, causal, masked, heads, head_dim, seqlens = case
    assert_all_ok(check("cuda", dtype, causal=causal, masked=masked, heads=heads,
                        head_dim=head_dim, seqlens=seqlens, layout="BSND", gen=gen, batch=1))


@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
def test_every_candidate_config(kernel, head_dim, gen):
    """Each config the autotuner may pick gives the right answer (causal, padding, GQA,
    tails in several blocks)."""
    from flash_cann.backends.triton import cuda as triton_backend

    block_d = max(16, 1 << (head_dim - 1).bit_length())
    for config in triton_backend.KERNELS[kernel].candidates(block_d):
        with triton_backend.pinned_configs(**{kernel: config}):
            results = check("cuda", torch.bfloat16, causal=True, masked=True, heads=(4, 2),
                            head_dim=head_dim, seqlens=(300, 333), layout="BSND", gen=gen)
        assert all(r.ok for r in results), f"{config}\n" + "\n".join(map(str, results))


@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_both_load_paths(tma, causal, monkeypatch, gen):
    """Pointer loads (any GPU, any strides) and tensor descriptors (TMA on Hopper)."""
    monkeypatch.setenv("FLASH_CANN_TRITON_TMA", tma)
    assert_all_ok(check("cuda", torch.bfloat16, causal=causal, masked=True, heads=(4, 2),
                        head_dim=128, seqlens=(1000, 1100), layout="BSND", gen=gen))


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("scale", [-2.0, 0.0], ids=["negative", "zero"])
def test_non_positive_scale(scale, masked, gen):
    """The forward takes whole blocks' row max from the unscaled scores (max, or min for
    a negative scale) and masked blocks' from the scaled ones. Scale -2 spreads a row's
    scores so far that a wrong max overflows P in float16."""
    assert_all_ok(check("cuda", torch.float16, causal=True, masked=masked, heads=(4, 2),
                        head_dim=64, seqlens=(300, 333), layout="BSND", gen=gen, scale=scale))


@pytest.mark.parametrize("head_dim", [1, 8, 59, 111, 200], ids=lambda d: f"d{d}")
def test_odd_head_dims_strided(head_dim, gen):
    """head_dims whose rows are not 16-byte aligned (59, 111: pointer loads) and padded
    ones, read as strided slices of one packed qkv tensor; one sequence all padding."""
    assert_all_ok(check("cuda", torch.bfloat16, causal=True, masked=True, heads=(4, 4),
                        head_dim=head_dim, seqlens=(77, 77), layout="BSND", gen=gen,
                        inputs=packed_views, empty_sequence=True))


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_expanded_grad_out(layout, gen):
    """out.sum().backward(): dO arrives expanded (every stride 0), no lse gradient."""
    assert_all_ok(check("cuda", torch.bfloat16, causal=True, masked=True, heads=(4, 2),
                        head_dim=64, seqlens=(37, 53), layout=layout, gen=gen, scale=0.125,
                        backward="out_sum"))


@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_backward_is_deterministic(sinks, gen):
    """Every output element has one writer (no atomics): bitwise equal reruns (the sinks'
    gradient: per-tile partial sums added in a fixed order)."""
    q, k, v = make_qkv(2, 8, 2, 1000, 1000, 128, torch.bfloat16, "BSND", device="cuda",
                       generator=gen)
    mask = random_key_padding_mask(2, 1000, gen, "cuda")
    grad_out = torch.randn(q.shape, generator=gen).to("cuda", torch.bfloat16)
    logits = torch.randn(8, generator=gen).cuda() if sinks else None

    def grads():
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        s_ = None if logits is None else logits.detach().requires_grad_()
        flash_cann.attention(q_, k_, v_, layout="BSND", causal=True, key_padding_mask=mask,
                             sinks=s_).backward(grad_out)
        return (q_.grad, k_.grad, v_.grad) + (() if s_ is None else (s_.grad,))

    first = grads()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))


def _unaligned(q, k, v):
    """Copies whose data starts 2 bytes past a 16-byte boundary (no descriptors; Triton
    specialises pointers on 16-byte alignment)."""
    def shifted(t):
        storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        return storage[1:].view(t.shape).copy_(t)
    return shifted(q), shifted(k), shifted(v)


def test_repeated_calls_replay_their_plans(gen):
    """A plain call's later calls replay its recorded launches (forward and backward)
    with the new tensors: every call matches the oracle, outputs poisoned each time; an
    unaligned copy of the inputs is a signature of its own."""
    from flash_cann.backends.triton import cuda as triton_backend

    ops.forget_plans()
    for inputs in (None, None, None, _unaligned, _unaligned):
        assert_all_ok(check("cuda", torch.bfloat16, causal=True, masked=True, heads=(4, 2),
                            head_dim=64, seqlens=(200, 300), layout="BSND", gen=gen,
                            inputs=inputs))
    plans = [*ops._fwd_plans.values(), *ops._bwd_plans.values()]
    assert len(ops._fwd_plans) >= 2 and len(ops._bwd_plans) >= 2
    assert all(isinstance(p, (triton_backend._ForwardPlan, triton_backend._BackwardPlan))
               for p in plans)


SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
SM90_CASES = [  # (causal, (heads_q, heads_kv), head_dim, (seqlen_q, seqlen_k), layout)
    (False, (4, 1), 128, (1000, 1000), "BSND"),   # key tail, GQA
    (True, (2, 2), 64, (777, 333), "BNSD"),       # rows that see no key (lse -inf, out 0)
    (True, (4, 2), 128, (333, 777), "BSND"),      # bottom-right diagonal
    (False, (2, 2), 64, (1, 4096), "BSND"),       # one query row, many key blocks
    (True, (2, 1), 128, (9000, 9000), "BNSD"),    # one CTA per tile (sm90.persistent)
]


def counted_launches(monkeypatch, kernel_getter: str) -> list:
    """A list that grows by one for every launch of the sm90 kernel that
    ``sm90.<kernel_getter>()`` returns (plans forgotten, so every call launches)."""
    from flash_cann.backends.triton import sm90
    launched = []
    kernel = getattr(sm90, kernel_getter)
    monkeypatch.setattr(sm90, kernel_getter, lambda: launched.append(True) or kernel())
    ops.forget_plans()
    return launched


def check_sm90_cases(cases, dtype, gen, launched) -> None:
    """Each case matches the float64 oracle, forward and backward, and launched the kernel."""
    for causal, heads, head_dim, seqlens, layout in cases:
        launched.clear()
        assert_all_ok(check("cuda", dtype, causal=causal, masked=False, heads=heads,
                            head_dim=head_dim, seqlens=seqlens, layout=layout, gen=gen))
        assert launched, (causal, heads, head_dim, seqlens, layout)


@pytest.mark.skipif(not SM90, reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_sm90_forward_serves_plain_calls(dtype, gen, monkeypatch):
    """The Hopper forward (kernels/forward_sm90.py) serves plain calls -- counted, so the
    oracle grid above is known to run it -- and matches the float64 oracle, forward and
    the backward on its lse, on the shapes it is likeliest to get wrong."""
    check_sm90_cases(SM90_CASES, dtype, gen, counted_launches(monkeypatch, "kernel"))


SM90_BACKWARD_CASES = [  # as SM90_CASES; at least sm90.BACKWARD_MIN_KEYS keys
    (False, (4, 2), 128, (2048, 2048), "BSND"),   # whole blocks, GQA
    (True, (2, 2), 64, (3000, 2100), "BNSD"),     # rows that see no key, key and row tails
    (True, (4, 1), 128, (1000, 2300), "BSND"),    # bottom-right diagonal, a group of 4
    (False, (2, 2), 64, (1, 4096), "BSND"),       # one query row in a 64-row block
]


@pytest.mark.skipif(not SM90, reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_sm90_backward_serves_long_calls(dtype, gen, monkeypatch):
    """The Hopper backward (kernels/backward_sm90.py) serves long plain backwards --
    counted -- and matches the float64 oracle."""
    launched = counted_launches(monkeypatch, "backward_kernel")
    check_sm90_cases(SM90_BACKWARD_CASES, dtype, gen, launched)


SM90_DETERMINISTIC_CASES = [  # (causal, (heads_q, heads_kv), head_dim, (seqlen_q, seqlen_k), batch)
    (False, (8, 2), 128, (4096, 4096), 2),   # chains of 32 key blocks, 4 x the SMs' CTAs
    (True, (4, 4), 64, (3000, 6100), 2),     # bottom-right diagonal, key and row tails
    (False, (2, 1), 64, (300, 16384), 1),    # a chain of 128 key blocks over 5 query blocks
]


@pytest.mark.skipif(not SM90, reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_sm90_deterministic_backward_repeats_bitwise(dtype, gen, monkeypatch):
    """deterministic=True on the Hopper backward (counted): dQ's adds in key-block order,
    so reruns are bitwise equal, with more CTAs than the GPU holds at once (a chain
    that deadlocked would hang: the GPU run's timeout fails it), and the float64 oracle
    holds."""
    launched = counted_launches(monkeypatch, "backward_kernel")

    def deterministic(q, k, v, key_padding_mask, *, scale, causal, layout):
        return flash_cann.attention(q, k, v, layout=layout, causal=causal, scale=scale,
                                    deterministic=True, return_lse=True)

    for causal, (heads_q, heads_kv), head_dim, (seqlen_q, seqlen_k), batch in \
            SM90_DETERMINISTIC_CASES:
        launched.clear()
        q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype,
                           "BSND", device="cuda", generator=gen)
        grad_out = torch.randn(q.shape, generator=gen).to("cuda", dtype)

        def grads():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            flash_cann.attention(q_, k_, v_, layout="BSND", causal=causal,
                                 deterministic=True).backward(grad_out)
            return q_.grad, k_.grad, v_.grad

        first = grads()
        for _ in range(3):
            assert all(torch.equal(a, b) for a, b in zip(first, grads())), causal
        assert launched, causal  # then replayed from its plan (the turn counters too)
        assert_all_ok(check("cuda", dtype, causal=causal, masked=False,
                            heads=(heads_q, heads_kv), head_dim=head_dim,
                            seqlens=(seqlen_q, seqlen_k), layout="BSND", gen=gen,
                            attention=deterministic, batch=1))


def test_cuda_graph_capture_replays(gen):
    """flash_attn_func's forward and backward captured in a CUDA graph (after warm-up
    calls that compile and plan them) and replayed on new inputs copied into the static
    ones: the results of eager calls on those inputs."""
    shape = (2, 256, 4, 64)

    def fresh():
        return [torch.randn(shape, generator=gen).to("cuda", torch.bfloat16)
                for _ in range(4)]

    def step(q, k, v, grad_out):
        out = flash_cann.flash_attn_func(q, k, v, causal=True)
        out.backward(grad_out)
        return out

    *inputs, grad_out = fresh()
    static = [t.requires_grad_() for t in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*static, grad_out)
    torch.cuda.current_stream().wait_stream(side)
    for t in static:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*static, grad_out)
    grads = [t.grad for t in static]
    for _ in range(2):
        *new, new_grad_out = fresh()
        with torch.no_grad():
            for t, value in zip((*static, grad_out), (*new, new_grad_out)):
                t.copy_(value)
        graph.replay()
        eager = [t.detach().requires_grad_() for t in new]
        want = step(*eager, new_grad_out)
        for got, expected in zip((out, *grads), (want, *(t.grad for t in eager))):
            assert torch.equal(got, expected)


def test_compile_fullgraph_matches_eager(gen):
    q, k, v = make_qkv(2, 4, 2, 333, 257, 64, torch.bfloat16, "BSND", device="cuda",
                       generator=gen)
    mask = random_key_padding_mask(2, 257, gen, "cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def model(q_, k_, v_):
        out = flash_cann.attention(q_, k_, v_, layout="BSND", causal=True,
                                   key_padding_mask=mask)
        return out.float().square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    eager_loss = model(q, k, v)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    torch.testing.assert_close(loss, eager_loss)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck(causal, gen):
    q, k, v = make_qkv(2, 4, 2, 65, 90, 64, torch.bfloat16, "BSND", device="cuda",
                       generator=gen)
    mask = random_key_padding_mask(2, 90, gen, "cuda")
    attrs = {"causal": causal, "layout": "BSND"}
    torch.library.opcheck(torch.ops.flash_cann.fwd.default,
                          (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), mask,
                           0.125), attrs)
    out, lse = torch.ops.flash_cann.fwd(q, k, v, mask, 0.125, causal, "BSND")
    grad_lse = torch.randn(lse.shape, generator=gen).to("cuda")
    torch.library.opcheck(torch.ops.flash_cann.bwd.default,
                          (torch.randn(out.shape, generator=gen).to(out), q.detach(),
                           k.detach(), v.detach(), out.detach(), lse.detach(), mask, grad_lse,
                           0.125), attrs)


def _memory_inputs(seqlen):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 8, seqlen, 64, generator=gen).to("cuda", torch.bfloat16)
                 .requires_grad_() for _ in range(3))


def _fwd_bwd(q, k, v):
    flash_cann.attention(q, k, v, causal=True).sum().backward()


def test_memory_is_linear_in_seqlen():
    """4x the seqlen, at most ~4x the peak extra memory (the score matrix would be 16x)."""
    device = torch.device("cuda")
    small = memory.peak_extra_bytes(device, _memory_inputs, _fwd_bwd, (4096,),
                                    warmup_args=(4096,))
    large = memory.peak_extra_bytes(device, _memory_inputs, _fwd_bwd, (16384,),
                                    warmup_args=(16384,))
    score_matrix = 8 * 16384 * 16384 * 2  # heads x seqlen^2 x bf16
    assert large < score_matrix / 16, (small, large)
    assert large <= 4.5 * small, f"4x the seqlen grew the peak {large / small:.1f}x"


GPU_FEATURES = [  # (id, check_variant's arguments)
    ("window", dict(seqlens=(300, 700), window=(64, 17))),
    ("window-left-causal", dict(seqlens=(700, 700), window=(200, -1), causal=True)),
    ("softcap", dict(seqlens=(300, 700), softcap=1.5, causal=True)),
    ("alibi", dict(seqlens=(300, 700), alibi="batch", causal=True)),
    ("dropout", dict(seqlens=(300, 700), dropout_p=0.17)),
    ("sinks", dict(seqlens=(300, 700), sinks=True, causal=True)),
    ("varlen-all", dict(seqlens=[(170, 400), (0, 5), (400, 170), (1, 1), (700, 1000)],
                        layout="TND", window=(100, 0), causal=True, softcap=2.0, alibi="batch",
                        dropout_p=0.2, sinks=True)),
    ("varlen", dict(seqlens=[(1000, 1000), (1, 1), (333, 333), (2049, 2049)], layout="TND",
                    causal=True)),
    ("padding-window", dict(seqlens=(500, 300), window=(0, 0), masked=True, softcap=3.0,
                            alibi="heads")),
    ("padding-window-sinks", dict(seqlens=(500, 300), window=(0, 0), masked=True, sinks=True)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("name, features", GPU_FEATURES, ids=[c[0] for c in GPU_FEATURES])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_features_match_oracle(name, features, head_dim, dtype, gen):
    assert_all_ok(oracle_checks.check_variant("cuda", dtype, gen=gen, heads=(8, 2),
                                              head_dim=head_dim,
                                              within=oracle_checks.triton_poisoning, **features))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("seqlen_q", [1, 5])
@pytest.mark.parametrize("features", CACHE_FEATURES, ids=["causal", "all", "window"])
@pytest.mark.parametrize("paged, batch_idx", CACHE_LAYOUTS, ids=CACHE_IDS)
def test_kvcache_matches_oracle(paged, batch_idx, features, seqlen_q, dtype, gen):
    with oracle_checks.triton_poisoning():
        check_kvcache("cuda", dtype, gen, paged=paged, batch_idx=batch_idx, features=features,
                      batch=6, seqlen_q=seqlen_q, seqlen_new=seqlen_q, heads=(8, 2),
                      head_dim=128, page_size=64, capacity=1024)


def test_kvcache_capacity_guard_on_the_gpu():
    check_capacity_guard("cuda")


@pytest.mark.parametrize("group", [1, 4], ids=["forward-kernel", "decode-kernel"])
def test_kvcache_overflow_is_flagged_not_a_device_assert(group):
    """cache_seqlens past a paged cache's capacity: the call returns finite results
    without a device assert (the context stays usable), and check_kvcache_capacity
    raises naming block_table."""
    page, heads_kv = 16, 2
    k_cache, v_cache = torch.randn(2, 6, page, heads_kv, 64, device="cuda",
                                   dtype=torch.float16)
    block_table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, heads_kv * group, 64, device="cuda", dtype=torch.float16)
    k, v = torch.randn(2, 2, 1, heads_kv, 64, device="cuda", dtype=torch.float16)
    seqlens = torch.tensor([31, 40], dtype=torch.int32, device="cuda")
    out = flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                             block_table=block_table, causal=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match="block_table .* is too small"):
        flash_cann.check_kvcache_capacity("cuda")
    flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens - 20,
                                       block_table=block_table)
    torch.cuda.synchronize()
    flash_cann.check_kvcache_capacity("cuda")


# vLLM's mixed batches at GPU sizes: chunked prefill past several pages, decode rows
# (one query, 1 .. 4097 keys), an empty query, a row with no key.
GPU_MIXED = [(37, 300), (1, 1), (0, 17), (1, 0), (130, 1029), (1, 4097), (1, 63)]
SERVING_FEATURES = [dict(causal=True),
                    dict(causal=True, window_size=(256, 0), softcap=30.0, alibi=True,
                         sinks=True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("features", SERVING_FEATURES, ids=["causal", "all"])
@pytest.mark.parametrize("heads", [(8, 2), (8, 8)], ids=["gqa", "mha"])
@pytest.mark.parametrize("page", [16, 128, 512])
def test_vllm_paged_call_matches_oracle(page, heads, features, dtype, gen):
    with oracle_checks.triton_poisoning():
        check_vllm_paged("cuda", dtype, gen, page=page, heads=heads, head_dim=128,
                         features=features, lengths=GPU_MIXED)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("paged, heads", [(True, (8, 2)), (True, (4, 4)), (False, (8, 2)),
                                          (False, (4, 4))], ids=str)
def test_cache_leftpad_matches_oracle(paged, heads, dtype, gen):
    with oracle_checks.triton_poisoning():
        check_leftpad("cuda", dtype, gen, paged=paged, heads=heads, head_dim=128,
                      features=dict(causal=True, window_size=(5, 0), alibi=True, sinks=True))
        check_seqused_packed("cuda", dtype, gen, heads=heads, head_dim=128)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "halves"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "one-position"])
def test_rotary_matches_flash_attn_formula(interleaved, causal, gen):
    check_rotary("cuda", torch.float16, gen, interleaved=interleaved, causal=causal,
                 head_dim=128, rotary_dim=64)


def test_vllm_call_captures_in_a_cuda_graph(gen):
    """vLLM's decode step captured in a CUDA graph and replayed after new queries, lengths
    and block tables were copied into the static tensors (the kernels read them on the
    device; nothing was read on the host while capturing): bitwise the eager result."""
    lengths_k = [300, 1, 1029, 17]
    k_cache, v_cache, table, _, _ = paged_cache(gen, lengths_k, 128, 2, 128, torch.bfloat16,
                                                "cuda")
    k_cache, v_cache = torch.nan_to_num(k_cache), torch.nan_to_num(v_cache)
    q = torch.randn(4, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    cu_q = torch.arange(5, dtype=torch.int32, device="cuda")
    used = torch.tensor(lengths_k, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def step():
        return flash_cann.flash_attn_varlen_func(
            q=q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=cu_q, max_seqlen_q=1,
            seqused_k=used, max_seqlen_k=1152, block_table=table, causal=True, softcap=30.0)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", torch.bfloat16))
        used.copy_(torch.randint(0, 1153, (4,), generator=gen).to("cuda", torch.int32))
        table.copy_(table.flip(0))
        graph.replay()
        replayed = out.clone()
        assert torch.equal(replayed, step())


def test_host_read_of_max_seqlen_is_refused_by_name_in_a_cuda_graph(gen):
    """A 0-d tensor for max_seqlen_q is read on the host outside a capture; inside a CUDA
    graph capture the API refuses it, naming the argument, before any launch (the capture
    itself ends cleanly)."""
    q, k, v = (torch.randn(8, 2, 64, generator=gen).to("cuda", torch.float16) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device="cuda")
    bound = torch.tensor(5, device="cuda")
    flash_cann.flash_attn_varlen_func(q, k, v, cu, cu, bound, 5)  # outside: read, works
    with pytest.raises(RuntimeError, match=r"max_seqlen_q \(a 0-d tensor on cuda\) would be "
                                           r"read on the host.*pass max_seqlen_q as a Python"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            flash_cann.flash_attn_varlen_func(q, k, v, cu, cu, bound, 5)


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_sinks_gradient_matches_the_oracle(layout, gen):
    """dq, dk, dv and the sinks' gradient (GQA, causal, window, ALiBi; TND with an empty
    sequence) vs the float64 oracle."""
    from test_features import _sink_call, _sink_case

    from flash_cann.contract import reference
    from flash_cann.contract.variant import Variant

    q, k, v, sinks, call, packed = _sink_case(gen, layout, dtype=torch.bfloat16)
    move = {key: (value.cuda() if isinstance(value, torch.Tensor) else value)
            for key, value in call.items()}
    packed = {key: (value.cuda() if isinstance(value, torch.Tensor) else value)
              for key, value in packed.items()}
    inputs = [t.cuda().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = _sink_call(*inputs, move, layout)
    grad_out = torch.randn(out.shape, generator=gen).to("cuda", out.dtype)
    got = torch.autograd.grad(out, inputs, grad_out)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    variant = Variant(window_left=call["window_size"][0], sinks=ref_inputs[3],
                      alibi_slopes=move["alibi_slopes"], **packed)
    ref_out, ref_lse = reference.attention(*ref_inputs[:3], scale=8 ** -0.5, causal=True,
                                           layout=layout, variant=variant)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)
    want = torch.autograd.grad(ref_out, ref_inputs, grad_out.double())
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, want):
        error = (a.double() - b).norm() / b.norm()
        assert error < 2e-2, (name, error.item())


# --------------------------------------------------------------------------------------
# Split-KV decode and CUDA graphs (issue 24)
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("num_splits", [0, 7], ids=["heuristic", "splits7"])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense"])
def test_split_kv_matches_oracle(paged, num_splits, dtype, gen):
    """Split-KV decode with every feature (window, softcap, ALiBi, sinks) vs the oracle;
    num_splits 0: 6 sequences x 2 kv heads leave an H100 idle, so the heuristic splits."""
    from flash_cann.backends.triton import cuda as triton_backend

    if num_splits == 0:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert triton_backend.split_count(6 * 2, 1024, sms) > 1
    with oracle_checks.triton_poisoning():
        check_kvcache("cuda", dtype, gen, paged=paged, batch_idx=False,
                      features=dict(CACHE_FEATURES[1], num_splits=num_splits), batch=6,
                      seqlen_q=1, seqlen_new=1, heads=(8, 2), head_dim=128, page_size=64,
                      capacity=1024)


@pytest.mark.parametrize("num_splits", [1, 5], ids=["unsplit", "splits5"])
def test_every_decode_candidate_config(num_splits, gen):
    """Each config the decode kernel's autotuner may pick (it tunes calls reading >= 256 MB
    of cache) gives the right answer, unsplit and split (GQA 8/2, paged, every feature)."""
    from flash_cann.backends.triton import cuda as triton_backend

    for config in triton_backend.DECODE.candidates(128):
        with triton_backend.pinned_configs(decode=config), oracle_checks.triton_poisoning():
            check_kvcache("cuda", torch.bfloat16, gen, paged=True, batch_idx=False,
                          features=dict(CACHE_FEATURES[1], num_splits=num_splits), batch=3,
                          seqlen_q=2, seqlen_new=2, heads=(8, 2), head_dim=128, page_size=64,
                          capacity=640)


def _captured(step, before_capture=lambda: None):
    """Warm ``step()`` up on a side stream (compile, tune, plan), call ``before_capture``,
    then capture one call of ``step`` in a CUDA graph: (graph, the captured call's
    outputs). A capture fails on any host read of a device tensor, so a passing capture
    also shows the path has none."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def _cu_seqlens(lengths):
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    return offsets.to("cuda", torch.int32)


def test_cuda_graph_varlen_replays_new_lengths(gen):
    """flash_attn_varlen_func's forward and backward captured once, then replayed on new
    values and new sequence boundaries (cu_seqlens rewritten in place: same total, each
    length within max_seqlen; empty and one-token sequences): the kernels read cu_seqlens
    on the device only, so every replay equals an eager call on the new inputs, bitwise."""
    total, heads_q, heads_kv, head_dim, longest = 512, 4, 2, 64, 256
    splits = ([100, 0, 156, 1, 255], [256, 256, 0, 0, 0], [1, 1, 1, 253, 256])

    def rand(*shape):
        return torch.randn(shape, generator=gen).to("cuda", torch.bfloat16)

    cu = _cu_seqlens(splits[0])
    static = [rand(total, heads_q, head_dim).requires_grad_(),
              rand(total, heads_kv, head_dim).requires_grad_(),
              rand(total, heads_kv, head_dim).requires_grad_()]
    grad_out = rand(total, heads_q, head_dim)

    def step(q, k, v, cu_seqlens, grad):
        out = flash_cann.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest,
                                                longest, causal=True)
        out.backward(grad)
        return out

    def forget_grads():  # the captured backward allocates them (as a training step would)
        for t in static:
            t.grad = None

    graph, out = _captured(lambda: step(*static, cu, grad_out), forget_grads)
    grads = [t.grad for t in static]
    for lengths in (*splits[1:], splits[0]):
        new = [rand(*t.shape) for t in static]
        new_grad = rand(total, heads_q, head_dim)
        with torch.no_grad():
            for t, value in zip((*static, grad_out), (*new, new_grad)):
                t.copy_(value)
            cu.copy_(_cu_seqlens(lengths))
        graph.replay()
        eager = [t.clone().requires_grad_() for t in new]
        want = step(*eager, _cu_seqlens(lengths), new_grad)
        for got, expected in zip((out, *grads), (want, *(t.grad for t in eager))):
            assert torch.equal(got, expected), lengths


def _paged_cache(gen, batch, heads_kv, head_dim, page, blocks, dtype=torch.bfloat16):
    pool = batch * blocks + 2
    k_cache, v_cache = (torch.randn(pool, page, heads_kv, head_dim, generator=gen)
                        .to("cuda", dtype) for _ in range(2))
    table = torch.randperm(pool, generator=gen)[:batch * blocks].view(batch, blocks)
    return k_cache, v_cache, table.to("cuda", torch.int32)


@pytest.mark.parametrize("num_splits", [1, 4], ids=["unsplit", "splits4"])
def test_cuda_graph_paged_decode_appends(num_splits, gen):
    """A decode step (append one token per sequence to a paged cache, attend; GQA, causal,
    sinks) captured once and replayed three times with cache_seqlens advanced on the
    device between replays: out, lse and both caches equal eager steps bitwise."""
    batch, heads_q, heads_kv, head_dim, page, blocks = 4, 8, 2, 128, 16, 8

    def rand(*shape):
        return torch.randn(shape, generator=gen).to("cuda", torch.bfloat16)

    k_cache, v_cache, table = _paged_cache(gen, batch, heads_kv, head_dim, page, blocks)
    seqlens = torch.tensor([0, 5, 17, 100], dtype=torch.int32, device="cuda")
    q, k_new, v_new = rand(batch, 1, heads_q, head_dim), *(rand(batch, 1, heads_kv, head_dim)
                                                           for _ in range(2))
    sinks = torch.randn(heads_q, generator=gen).cuda()
    state = [t.clone() for t in (k_cache, v_cache, seqlens)]

    def step(kc, vc, lengths, q_, k_, v_):
        return flash_cann.flash_attn_with_kvcache(
            q_, kc, vc, k_, v_, cache_seqlens=lengths, block_table=table, causal=True,
            sinks=sinks, num_splits=num_splits, return_softmax_lse=True)

    graph, (out, lse) = _captured(lambda: step(k_cache, v_cache, seqlens, q, k_new, v_new))
    for t, saved in zip((k_cache, v_cache, seqlens), state):
        t.copy_(saved)  # undo the warm-up's appends
    for _ in range(3):
        for t in (q, k_new, v_new):
            t.copy_(rand(*t.shape))
        caches = [t.clone() for t in (k_cache, v_cache, seqlens)]
        want_out, want_lse = step(*caches, q.clone(), k_new.clone(), v_new.clone())
        graph.replay()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
        assert torch.equal(k_cache, caches[0]) and torch.equal(v_cache, caches[1])
        seqlens.add_(1)  # the next step, on the device


def test_cuda_graph_split_kv_long_context(gen):
    """Batch 1 over a 16k contiguous cache: the heuristic splits the keys (one sequence
    cannot fill the GPU); captured, replayed with new queries and a new filled length set
    on the device: bitwise equal to eager calls, and equal to the unsplit kernel up to
    rounding."""
    from flash_cann.backends.triton import cuda as triton_backend

    heads_q, heads_kv, head_dim, capacity = 32, 8, 128, 16384
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert triton_backend.split_count(heads_kv, capacity, sms) > 1
    k_cache, v_cache = (torch.randn(1, capacity, heads_kv, head_dim, generator=gen)
                        .to("cuda", torch.bfloat16) for _ in range(2))
    q = torch.randn(1, 1, heads_q, head_dim, generator=gen).to("cuda", torch.bfloat16)
    seqlens = torch.tensor([capacity], dtype=torch.int32, device="cuda")

    def step(q_, lengths, num_splits=0):
        return flash_cann.flash_attn_with_kvcache(q_, k_cache, v_cache, cache_seqlens=lengths,
                                                  num_splits=num_splits,
                                                  return_softmax_lse=True)

    graph, (out, lse) = _captured(lambda: step(q, seqlens))
    for length in (capacity, 12345, 1):
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", torch.bfloat16))
        seqlens.fill_(length)
        graph.replay()
        want_out, want_lse = step(q.clone(), seqlens.clone())
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), length
        unsplit_out, unsplit_lse = step(q.clone(), seqlens.clone(), num_splits=1)
        torch.testing.assert_close(out, unsplit_out, rtol=0, atol=2e-2)
        torch.testing.assert_close(lse, unsplit_lse, rtol=0, atol=1e-4)


def test_cuda_graph_vllm_paged_varlen(gen):
    """vLLM's FlashAttention-backend call with mixed prefill chunks and decode rows as
    packed queries (a paged cache, seqused_k, no cu_seqlens_k; the decode-only step:
    test_vllm_call_captures_in_a_cuda_graph) captured and replayed with new queries and
    new key lengths set on the device: bitwise equal to eager."""
    heads_q, heads_kv, head_dim, page, blocks = 8, 2, 128, 16, 16
    query_lengths = [37, 1, 1, 64, 1]            # two prefill chunks among decode rows
    batch, total = len(query_lengths), sum(query_lengths)
    k_cache, v_cache, table = _paged_cache(gen, batch, heads_kv, head_dim, page, blocks)
    cu_q = _cu_seqlens(query_lengths)
    seqused = torch.tensor([37, 90, 3, 200, 256], dtype=torch.int32, device="cuda")
    q = torch.randn(total, heads_q, head_dim, generator=gen).to("cuda", torch.bfloat16)

    def step(q_, used):
        return flash_cann.flash_attn_varlen_func(
            q_, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=None,
            max_seqlen_q=max(query_lengths), max_seqlen_k=blocks * page, seqused_k=used,
            block_table=table, causal=True, softmax_scale=head_dim ** -0.5)

    graph, out = _captured(lambda: step(q, seqused))
    for _ in range(2):
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", torch.bfloat16))
        seqused.add_(1).clamp_(max=blocks * page)
        graph.replay()
        assert torch.equal(out, step(q.clone(), seqused.clone()))
