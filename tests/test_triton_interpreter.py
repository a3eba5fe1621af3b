"""The Triton backend's kernels on the CPU, through Triton's interpreter: a handful of
tiny cases for machines without a GPU (the full grid runs on a GPU: test_triton.py),
through the CUDA host and through the NPU host (persistent grid, the NPU tile table;
test_triton_npu.py lowers those launches with Huawei's compiler).

TRITON_INTERPRET=1 must be set before triton is imported, so test_kernels_in_interpreter
runs this file again in a subprocess with it set; there the kernel cases run, here they
are skipped. The subprocess routes CPU tensors to the triton backend, so each case goes
through torch.ops.flash_cann (checks, autograd) exactly as CUDA tensors do.

float16 only: the interpreter does not compute in bfloat16 (it multiplies the bit
patterns; Triton's debugging guide lists bfloat16 as unsupported there).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import flash_cann
import oracle_checks
import triton_interpreter_patch
from oracle_checks import assert_all_ok, packed_views
from test_features import CACHE_FEATURES, CACHE_IDS, CACHE_LAYOUTS, check_kvcache
from test_serving import check_leftpad, check_seqused_packed, check_vllm_paged

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    import triton
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
in_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRETING),
    reason="runs in test_kernels_in_interpreter's subprocess (TRITON_INTERPRET=1)")

CASES = [  # (causal, masked, (heads_q, heads_kv), head_dim, (seqlen_q, seqlen_k), layout)
    # GQA; row and key tails; the causal diagonal right of the top-left corner.
    (True, True, (4, 2), 64, (17, 40), "BSND"),
    # MQA; head_dim padded 80 -> 128; the first rows lie above the diagonal (no key).
    (True, False, (4, 1), 80, (40, 17), "BSND"),
    # Padding over several key blocks; head_dim 32.
    (False, True, (2, 2), 32, (33, 150), "BNSD"),
    # The smallest head_dim (padded to 16) and a single query row.
    (False, False, (2, 1), 1, (1, 3), "BNSD"),
    # The largest head_dim.
    (True, True, (2, 2), 256, (20, 20), "BSND"),
]


@needs_triton
@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_kernels_in_interpreter():
    """Run this file's kernel cases in a subprocess under TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # No time limit: the interpreter's time grows with the machine's load, and a slow run
    # must be slow, not red (tests/test_suite_rules.py).
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          __file__, "-k", "not test_kernels_in_interpreter"],
                         env=env, capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    assert "passed" in summary and "skipped" not in summary, run.stdout[-4000:]


@needs_triton
def test_poisoned_outputs_fill_every_buffer():
    """The seam the poisoning tests rely on: buffers the kernels must write start as NaN."""
    from flash_cann.backends.triton import buffers as triton_buffers

    with triton_buffers.poisoned_outputs():
        poisoned = triton_buffers.empty((3, 5), torch.float16, torch.device("cpu"))
    assert torch.isnan(poisoned).all()


check = functools.partial(oracle_checks.check, within=oracle_checks.triton_poisoning)


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """CPU tensors go to the triton backend (the interpreter runs its kernels)."""
    from flash_cann.contract import ops

    triton_interpreter_patch.patch_interpreter(monkeypatch.setattr)
    monkeypatch.setitem(ops._selected, "cpu", "triton")


@in_interpreter
@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_oracle(case, tma, triton_on_cpu, monkeypatch, gen):
    monkeypatch.setenv("FLASH_CANN_TRITON_TMA", tma)
    causal, masked, heads, head_dim, seqlens, layout = case
    assert_all_ok(check("cpu", torch.float16, causal=causal, masked=masked, heads=heads,
                        head_dim=head_dim, seqlens=seqlens, layout=layout, gen=gen))


@in_interpreter
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_sequence_and_strided_inputs(causal, triton_on_cpu, gen):
    """A sequence whose every key is padding (out 0, lse -inf, zero gradients), with q, k,
    v read as strided slices of one packed tensor."""
    assert_all_ok(check("cpu", torch.float16, causal=causal, masked=True, heads=(2, 2),
                        head_dim=48, seqlens=(30, 30), layout="BSND", gen=gen,
                        inputs=packed_views, empty_sequence=True))


@in_interpreter
@pytest.mark.parametrize("scale", [-2.0, 0.0], ids=["negative", "zero"])
def test_non_positive_scale(scale, triton_on_cpu, gen):
    """Whole key blocks take the row max from unscaled scores (the min for a negative
    scale), masked ones from scaled scores. Scale -2 spreads a row's scores so far that a
    wrong max overflows P in float16."""
    assert_all_ok(check("cpu", torch.float16, causal=True, masked=False, heads=(2, 1),
                        head_dim=32, seqlens=(70, 150), layout="BSND", gen=gen, scale=scale))


@in_interpreter
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_expanded_grad_out(layout, triton_on_cpu, gen):
    """out.sum().backward(): dO arrives expanded (every stride 0), no lse gradient."""
    assert_all_ok(check("cpu", torch.float16, causal=True, masked=True, heads=(4, 2),
                        head_dim=64, seqlens=(37, 53), layout=layout, gen=gen, scale=0.125,
                        backward="out_sum"))


@in_interpreter
@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
def test_every_candidate_tile(kernel, triton_on_cpu, gen):
    """Each tile the autotuner may pick (head_dim 64) gives the right answer, with
    causal masking, padding, GQA and tails in several blocks. (The interpreter ignores
    warps and pipeline stages, so one config per tile; test_triton.py runs them all.)"""
    from flash_cann.backends.triton import cuda as triton_backend

    tiles = {}
    for config in triton_backend.KERNELS[kernel].candidates(block_d=64):
        tiles.setdefault((config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]), config)
    for config in tiles.values():
        with triton_backend.pinned_configs(**{kernel: config}):
            results = check("cpu", torch.float16, causal=True, masked=True, heads=(2, 1),
                            head_dim=64, seqlens=(130, 150), layout="BSND", gen=gen, batch=1)
        assert all(r.ok for r in results), f"{config}\n" + "\n".join(map(str, results))


@pytest.fixture
def triton_npu_on_cpu(triton_on_cpu, monkeypatch):
    """CPU tensors go to the NPU host of the triton backend (persistent grid over 3
    "cores", the NPU tile table, no descriptors); the interpreter runs its launches."""
    from flash_cann.contract import ops
    from flash_cann.backends.triton import npu as triton_npu

    monkeypatch.setattr(ops, "_module", lambda backend, device_type=None: triton_npu)
    monkeypatch.setattr(triton_npu, "ai_cores", lambda device: 3)


NPU_CASES = [  # (causal, masked, (heads_q, heads_kv), head_dim, (seqlen_q, seqlen_k))
    # GQA, tails in every kernel, the diagonal right of the corner; each of the 3
    # programs loops over several tiles.
    (True, True, (4, 2), 64, (130, 150)),
    # MQA, head_dim 80 padded to 128, rows above the diagonal.
    (True, False, (2, 1), 80, (70, 33)),
    # The largest head_dim, padding.
    (False, True, (2, 2), 256, (40, 70)),
]


@in_interpreter
@pytest.mark.parametrize("case", NPU_CASES, ids=str)
def test_npu_host_matches_oracle(case, triton_npu_on_cpu, gen):
    """The kernels as the NPU runs them (PERSISTENT, TILES) give the right answer."""
    causal, masked, heads, head_dim, seqlens = case
    assert_all_ok(check("cpu", torch.float16, causal=causal, masked=masked, heads=heads,
                        head_dim=head_dim, seqlens=seqlens, layout="BSND", gen=gen))


FEATURE_CASES = [  # (id, check_variant's arguments): each feature, then all combined
    ("window", dict(seqlens=(37, 70), window=(5, 3))),
    ("window-left-causal", dict(seqlens=(37, 70), window=(20, -1), causal=True)),
    ("softcap", dict(seqlens=(37, 70), softcap=1.5)),
    ("alibi", dict(seqlens=(37, 70), alibi="batch", causal=True)),
    # slopes whose head stride is not 1 (the kernels index them as b * stride_b + h)
    ("alibi-transposed", dict(seqlens=(37, 70), alibi="transposed", causal=True)),
    ("dropout", dict(seqlens=(37, 70), dropout_p=0.3)),
    ("sinks", dict(seqlens=(37, 70), sinks=True, causal=True)),
    # Packed sequences: an empty one, rows above the diagonal, several blocks.
    ("varlen-all", dict(seqlens=[(17, 40), (0, 5), (40, 17), (1, 1), (70, 100)], layout="TND",
                        window=(6, 0), causal=True, softcap=2.0, alibi="batch", dropout_p=0.2,
                        sinks=True)),
    # A window narrower than the padding holes: rows that see no key.
    ("padding-window", dict(seqlens=(50, 30), window=(0, 0), masked=True, softcap=3.0,
                            alibi="heads")),
    ("padding-window-sinks", dict(seqlens=(50, 30), window=(0, 0), masked=True, sinks=True)),
]


@in_interpreter
@pytest.mark.parametrize("name, features", FEATURE_CASES, ids=[c[0] for c in FEATURE_CASES])
def test_features_match_oracle(name, features, triton_on_cpu, gen):
    """flash-attn's features through the Triton kernels (dropout: bit-exact with the
    mask S_dmask returns, which variant.keep_mask draws)."""
    assert_all_ok(oracle_checks.check_variant("cpu", torch.float16, gen=gen, heads=(4, 2),
                                              within=oracle_checks.triton_poisoning, **features))


@in_interpreter
def test_packed_tiles_with_descriptors_match_oracle(triton_on_cpu, monkeypatch, gen):
    """The packed forward's grid over the real query blocks (kernels.tiles.packed_tile:
    empty and one-row sequences own no block or one, a long one several, tiles past the
    last do nothing) with tensor descriptors bounded per sequence; GQA, causal rows
    above the diagonal, a window. Forward only: the backward's grid is unchanged."""
    monkeypatch.setenv("FLASH_CANN_TRITON_TMA", "1")
    monkeypatch.setenv("FLASH_CANN_TRITON_VARLEN_GRID", "tiles")
    assert_all_ok(oracle_checks.check_variant(
        "cpu", torch.float16, gen=gen, heads=(4, 2), layout="TND", causal=True, window=(40, 0),
        seqlens=[(1, 33), (0, 4), (150, 150), (17, 40), (1, 1)], backward="none",
        within=oracle_checks.triton_poisoning))


@in_interpreter
@pytest.mark.parametrize("paged, batch_idx", CACHE_LAYOUTS, ids=CACHE_IDS)
def test_kvcache_matches_oracle(paged, batch_idx, triton_on_cpu, gen):
    """The forward kernel over a KV cache: pages through the block table, cache rows,
    filled lengths; window, softcap and ALiBi."""
    with oracle_checks.triton_poisoning():
        check_kvcache("cpu", torch.float16, gen, paged=paged, batch_idx=batch_idx,
                      features=CACHE_FEATURES[1])


# 16 x 16 tiles: the 72-key caches of the split tests span 5 key blocks.
SPLIT_TILE = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1) \
    if HAS_TRITON else None
SPLIT_CASES = [  # (id, check_kvcache's arguments): split-KV through the CUDA host
    # GQA, paged, every feature: the window empties the leading splits, the sink joins in
    # the combine; 5 splits over 72 keys leave the last splits empty at every key block size.
    ("paged-all", dict(paged=True, batch_idx=False, features=dict(
        CACHE_FEATURES[1], num_splits=5))),
    # MHA (the split path runs the decode kernel for any group), cache rows, causal.
    ("mha-batch-idx", dict(paged=False, batch_idx=True, heads=(2, 2), features=dict(
        causal=True, num_splits=3))),
    # num_splits=0: the heuristic (INTERPRETER_SMS) splits this small batch.
    ("heuristic", dict(paged=True, batch_idx=False, features=dict(causal=False))),
]


@in_interpreter
@pytest.mark.parametrize("name, case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_kv_matches_oracle(name, case, triton_on_cpu, monkeypatch, gen):
    """Split-KV decode (key ranges per split, the lse-weighted combine) vs the float64
    oracle; outputs poisoned, so every row of out and lse has a writer."""
    from flash_cann.backends.triton import cuda as triton_backend

    # Ranges of 16 keys, so that the heuristic splits the tests' 72-key caches, and key
    # blocks of 16, so that every split of the longest sequence has keys.
    monkeypatch.setattr(triton_backend, "SPLIT_MIN_KEYS", 16)
    with oracle_checks.triton_poisoning(), triton_backend.pinned_configs(decode=SPLIT_TILE):
        check_kvcache("cpu", torch.float16, gen, **case)


@in_interpreter
@pytest.mark.parametrize("call, num_splits", [("vllm-paged", 1), ("vllm-paged", 3),
                                              ("leftpad", 3)], ids=str)
def test_split_kv_over_packed_queries_and_leftpad(call, num_splits, triton_on_cpu, gen):
    """vLLM's packed query rows (mixed prefill and decode rows, lengths 0 and 1, a
    sequence with no key; the longest first, so the decode kernel's walk over the real
    row blocks -- a GQA group's rows per token -- must give it all its blocks), unsplit
    and split, and split-KV over keys from cache_leftpad: the splits divide each
    sequence's own keys, the combine writes the packed rows."""
    from test_serving import MIXED, check_leftpad, check_vllm_paged

    from flash_cann.backends.triton import cuda as triton_backend

    features = dict(causal=True, window_size=(20, 0), softcap=2.0, alibi=True, sinks=True,
                    num_splits=num_splits)
    with oracle_checks.triton_poisoning(), triton_backend.pinned_configs(decode=SPLIT_TILE):
        if call == "vllm-paged":
            check_vllm_paged("cpu", torch.float16, gen, page=16, heads=(4, 2),
                             features=features, lengths=sorted(MIXED, reverse=True))
        else:
            check_leftpad("cpu", torch.float16, gen, paged=True, heads=(4, 2),
                          features=features)


@needs_triton
def test_split_count_fills_the_gpu_from_shapes():
    """The split-KV heuristic (an H100's 132 SMs): no split where the programs fill the
    GPU, enough to fill it for one long sequence, never ranges shorter than
    SPLIT_MIN_KEYS."""
    from flash_cann.backends.triton.cuda import SPLIT_MIN_KEYS, split_count

    assert split_count(64 * 8, 4096, 132) == 1          # batch 64, 8 kv heads
    assert split_count(8, 131072, 132) == 28            # batch 1 at 128k: 224 of 264 slots
    assert split_count(8, 2 * SPLIT_MIN_KEYS, 132) == 2
    assert split_count(8, SPLIT_MIN_KEYS, 132) == 1


@in_interpreter
def test_split_kv_is_deterministic_and_agrees_with_one_split(triton_on_cpu, monkeypatch, gen):
    """The same call twice gives bitwise the same out and lse; num_splits 1 (the unsplit
    kernel) and 4 agree up to rounding; the heuristic split this shape."""
    from test_features import _cache_case

    from flash_cann.backends.triton import cuda as triton_backend

    monkeypatch.setattr(triton_backend, "SPLIT_MIN_KEYS", 16)
    q, k_cache, v_cache, _, _, seqlens, kwargs, _ = _cache_case(
        gen, paged=True, dtype=torch.float16, heads=(4, 1), seqlen_q=1)
    assert triton_backend.split_count(q.shape[0], 72, triton_backend.INTERPRETER_SMS) > 1
    sinks = torch.randn(4, generator=gen)

    def call(splits):
        return flash_cann.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, softcap=3.0, sinks=sinks,
            num_splits=splits, return_softmax_lse=True, **kwargs)

    with triton_backend.pinned_configs(decode=SPLIT_TILE):
        first, again = call(4), call(4)
        unsplit, heuristic = call(1), call(0)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    for split in (first, heuristic):
        torch.testing.assert_close(split[0], unsplit[0], rtol=0, atol=2e-3)
        torch.testing.assert_close(split[1], unsplit[1], rtol=0, atol=1e-5)


# vLLM's paged call (mixed prefill + decode rows, lengths 0 and 1, keys not a multiple of
# the page): GQA runs the decode kernel, MHA the forward kernel.
SERVING_CASES = [(16, (4, 2), dict(causal=True, window_size=(6, 0), softcap=2.0, alibi=True,
                                   sinks=True)),
                 (128, (2, 2), dict(causal=False, window_size=(3, 3), sinks=True))]


@in_interpreter
@pytest.mark.parametrize("page, heads, features", SERVING_CASES, ids=["decode", "forward"])
def test_vllm_paged_call_matches_oracle(page, heads, features, triton_on_cpu, gen):
    """TND queries over a paged cache (VARLEN + SEQUSED_K + PAGED), out= and the lse; every
    unused cache entry is NaN, so a read past a sequence's keys shows."""
    with oracle_checks.triton_poisoning():
        check_vllm_paged("cpu", torch.float16, gen, page=page, heads=heads, features=features)


@in_interpreter
@pytest.mark.parametrize("paged, heads", [(True, (4, 2)), (True, (2, 2)), (False, (2, 2))],
                         ids=["paged-decode", "paged-forward", "dense-forward"])
def test_cache_leftpad_matches_oracle(paged, heads, triton_on_cpu, gen):
    """cache_leftpad (LEFTPAD): the first key per sequence, through pages (looked up from
    the first key) and cache rows (the view starts there)."""
    with oracle_checks.triton_poisoning():
        check_leftpad("cpu", torch.float16, gen, paged=paged, heads=heads,
                      features=dict(causal=True, window_size=(5, 0), alibi=True, sinks=True))


@in_interpreter
def test_seqused_k_over_packed_keys(triton_on_cpu, gen):
    """seqused_k without block_table: one shared cache row, leftpad = cu_seqlens_k."""
    with oracle_checks.triton_poisoning():
        check_seqused_packed("cpu", torch.float16, gen)


NPU_FEATURE_CASES = [  # (id, check_variant's arguments), through the NPU host
    # Every score feature batched, and sinks: the "dropout" tile table.
    ("all", dict(seqlens=(37, 70), window=(20, -1), causal=True, softcap=2.0, alibi="batch",
                 dropout_p=0.2, sinks=True)),
    # Packed sequences with a two-sided window, softcap and ALiBi: the "scores" table; an
    # empty sequence (the sinks' gradient from the preprocess tiles' partial sums).
    ("varlen-scores", dict(seqlens=[(17, 40), (0, 5), (70, 100)], layout="TND",
                           window=(6, 3), softcap=2.0, alibi="heads", sinks=True)),
]


@in_interpreter
@pytest.mark.parametrize("name, features", NPU_FEATURE_CASES,
                         ids=[c[0] for c in NPU_FEATURE_CASES])
def test_npu_host_features_match_oracle(name, features, triton_npu_on_cpu, gen):
    """The feature variants as the NPU runs them (PERSISTENT, the feature tile tables)."""
    assert_all_ok(oracle_checks.check_variant("cpu", torch.float16, gen=gen, heads=(4, 2),
                                              within=oracle_checks.triton_poisoning, **features))


@in_interpreter
def test_npu_host_kvcache_matches_oracle(triton_npu_on_cpu, gen):
    """A paged KV cache with GQA through the NPU host: the decode kernel's persistent
    loop, window, softcap and ALiBi."""
    with oracle_checks.triton_poisoning():
        check_kvcache("cpu", torch.float16, gen, paged=True, batch_idx=False,
                      features=CACHE_FEATURES[1])


@in_interpreter
def test_npu_host_vllm_paged_call_matches_oracle(triton_npu_on_cpu, gen):
    """vLLM's call through the NPU host: the decode kernel's persistent loop over packed
    queries of different lengths."""
    with oracle_checks.triton_poisoning():
        check_vllm_paged("cpu", torch.float16, gen, page=16, features=dict(causal=True))


@in_interpreter
@pytest.mark.parametrize("layout, host", [("BSND", "cuda"), ("TND", "cuda"), ("TND", "npu")])
def test_sinks_gradient_matches_the_oracle_and_repeats_bitwise(layout, host, request, gen):
    """The preprocess kernel's per-tile partial sums of the sinks' gradient, added in a
    fixed order on the host (the CUDA host's, and the NPU host's over its persistent
    grid): vs the float64 oracle, and bitwise the same on a rerun."""
    from test_features import _sink_call, _sink_case

    request.getfixturevalue("triton_on_cpu" if host == "cuda" else "triton_npu_on_cpu")

    from flash_cann.contract import reference
    from flash_cann.contract.variant import Variant

    q, k, v, sinks, call, packed = _sink_case(gen, layout, dtype=torch.float16)
    inputs = [t.requires_grad_() for t in (q, k, v, sinks)]
    out, lse = _sink_call(*inputs, call, layout)
    grad_out = torch.randn(out.shape, generator=gen).to(out.dtype)
    runs = [torch.autograd.grad(_sink_call(*inputs, call, layout)[0], inputs, grad_out)
            for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    variant = Variant(window_left=call["window_size"][0], sinks=ref_inputs[3],
                      alibi_slopes=call["alibi_slopes"], **packed)
    ref_out, ref_lse = reference.attention(*ref_inputs[:3], scale=8 ** -0.5, causal=True,
                                           layout=layout, variant=variant)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)
    want = torch.autograd.grad(ref_out, ref_inputs, grad_out.double())
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), runs[0], want):
        error = (a.double() - b).norm() / b.norm()
        assert error < 5e-3, (name, error.item())
