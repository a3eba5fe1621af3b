"""The interfaces written against flash-attn's that the alias serves besides flash-attn 2
(flash_cann.install_as_flash_attn): FA3's ``flash_attn_interface`` (and
``hopper.flash_attn_interface``), flash-attention-npu's ``flash_attn_npu`` /
``flash_attn_npu_3`` / ``flash_attn_npu_v3`` / ``flash_attn_npu_4``, and vLLM's adapter as
``vllm_flash_attn``.

Signatures are compared with tables written here from the upstream sources (flash-attn's
hopper/flash_attn_interface.py at main, MinghuasLab/flash-attention-npu's README and
flash_attn_npu_3 / flash_attn_npu_4 interfaces, vllm/vllm_flash_attn/flash_attn_interface.py);
the call patterns are their documented ones, vllm-ascend's FA3 backend
(vllm_ascend/attention/fa3_v1.py) as it calls flash_attn_npu_v3, on the cpu backend and
on the twin."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest
import torch

import flash_cann
from flash_cann.api import flash_attn_3, flash_attn_npu, interface, rotary, vllm_flash_attn
from native_build import built
from test_flash_attn_alias import alias  # noqa: F401 (fixture)
from test_serving import oracle, paged_cache

E = inspect.Parameter.empty

# FA3, hopper/flash_attn_interface.py (flash-attn main): (name, default or E), in order
FA3 = {
    "flash_attn_qkvpacked_func": [
        ("qkv", E), ("softmax_scale", None), ("causal", False), ("q_descale", None),
        ("k_descale", None), ("v_descale", None), ("window_size", (-1, -1)),
        ("attention_chunk", 0), ("softcap", 0.0), ("deterministic", False),
        ("num_heads_q", None), ("sm_margin", 0), ("return_attn_probs", False)],
    "flash_attn_func": [
        ("q", E), ("k", E), ("v", E), ("softmax_scale", None), ("causal", False), ("qv", None),
        ("q_descale", None), ("k_descale", None), ("v_descale", None),
        ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
        ("num_splits", 1), ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
        ("return_attn_probs", False)],
    "flash_attn_varlen_func": [
        ("q", E), ("k", E), ("v", E), ("cu_seqlens_q", E), ("cu_seqlens_k", E),
        ("max_seqlen_q", E), ("max_seqlen_k", E), ("seqused_q", None), ("seqused_k", None),
        ("softmax_scale", None), ("causal", False), ("qv", None), ("q_descale", None),
        ("k_descale", None), ("v_descale", None), ("window_size", (-1, -1)),
        ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", None),
        ("deterministic", False), ("sm_margin", 0), ("return_attn_probs", False)],
    "flash_attn_with_kvcache": [
        ("q", E), ("k_cache", E), ("v_cache", E), ("k", None), ("v", None), ("qv", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("page_table", None),
        ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("max_seqlen_q", None),
        ("rotary_seqlens", None), ("q_descale", None), ("k_descale", None),
        ("v_descale", None), ("softmax_scale", None), ("causal", False),
        ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
        ("rotary_interleaved", True), ("scheduler_metadata", None), ("num_splits", 0),
        ("pack_gqa", None), ("sm_margin", 0), ("return_softmax_lse", False)],
    "flash_attn_combine": [("out_partial", E), ("lse_partial", E), ("out", None),
                           ("out_dtype", None)],
    "get_scheduler_metadata": [
        ("batch_size", E), ("max_seqlen_q", E), ("max_seqlen_k", E), ("num_heads_q", E),
        ("num_heads_kv", E), ("headdim", E), ("cache_seqlens", E),
        ("qkv_dtype", torch.bfloat16), ("headdim_v", None), ("cu_seqlens_q", None),
        ("cu_seqlens_k_new", None), ("cache_leftpad", None), ("page_size", None),
        ("max_seqlen_k_new", 0), ("causal", False), ("window_size", (-1, -1)),
        ("attention_chunk", 0), ("has_softcap", False), ("num_splits", 0),
        ("pack_gqa", None), ("sm_margin", 0)],
}
# flash_attn_npu_3 (flash-attention-npu): FA3's, flash_attn_func and
# flash_attn_varlen_func with a trailing scheduler_metadata
NPU_V3 = {**{name: FA3[name] for name in ("flash_attn_with_kvcache", "get_scheduler_metadata")},
          **{name: [*FA3[name], ("scheduler_metadata", None)]
             for name in ("flash_attn_func", "flash_attn_varlen_func")}}
NPU_V4 = {"flash_attn_varlen_func": [
    ("q", E), ("k", E), ("v", E), ("qv", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
    ("max_seqlen_q", None), ("max_seqlen_k", None), ("min_seqlen_k", None),
    ("seqused_q", None), ("seqused_k", None), ("gather_kv_indices", None),
    ("page_table", None), ("softmax_scale", None), ("causal", False),
    ("window_size", (-1, -1)), ("learnable_sink", None), ("softcap", 0.0), ("num_splits", 0),
    ("pack_gqa", None), ("deterministic", False), ("score_mod", None),
    ("score_mod_bwd", None), ("mask_mod", None), ("block_sparse_tensors", None),
    ("aux_tensors", None), ("aux_scalars", None), ("return_lse", False)]}
# vLLM, vllm/vllm_flash_attn/flash_attn_interface.py
VLLM = {
    "flash_attn_varlen_func": [
        ("q", E), ("k", E), ("v", E), ("max_seqlen_q", E), ("cu_seqlens_q", E),
        ("max_seqlen_k", E), ("cu_seqlens_k", None), ("seqused_k", None), ("q_v", None),
        ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", None),
        ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
        ("return_attn_probs", False), ("block_table", None), ("return_softmax_lse", False),
        ("out", None), ("scheduler_metadata", None), ("q_descale", None), ("k_descale", None),
        ("v_descale", None), ("num_splits", 0), ("output_scale", None), ("fa_version", 2),
        ("s_aux", None), ("cp_world_size", 1), ("cp_rank", 0), ("cp_tot_seqused_k", None),
        ("mask_mod", None), ("block_sparse_tensors", None), ("aux_tensors", None),
        ("aux_tensor_leading_dims", None), ("dynamic_causal", None)],
    "get_scheduler_metadata": [
        *[p for p in FA3["get_scheduler_metadata"] if p[0] != "attention_chunk"]],
    "is_fa_version_supported": [("fa_version", E)],
    "fa_version_unsupported_reason": [("fa_version", E)],
}
# flash-attn 2.8.4, flash_attn/flash_attn_interface.py: the parameters before flash_cann's
# keyword-only extensions (flash_cann makes some optional that flash-attn requires)
FA2 = {
    "flash_attn_func": [("q", E), ("k", E), ("v", E), ("dropout_p", 0.0),
                        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                        ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                        ("return_attn_probs", False)],
    "flash_attn_varlen_func": [
        ("q", E), ("k", E), ("v", E), ("cu_seqlens_q", E), ("cu_seqlens_k", E),
        ("max_seqlen_q", E), ("max_seqlen_k", E), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
        ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False),
        ("block_table", None)],
    "flash_attn_with_kvcache": [
        ("q", E), ("k_cache", E), ("v_cache", E), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
        ("num_splits", 0), ("return_softmax_lse", False)],
}

MODULES = {  # module -> the table of the names it serves
    "flash_attn_interface": FA3, "hopper.flash_attn_interface": FA3,
    "flash_attn_npu_3": NPU_V3, "flash_attn_npu_v3": NPU_V3, "flash_attn_npu_4": NPU_V4,
    "vllm_flash_attn": VLLM, "vllm_flash_attn.flash_attn_interface": VLLM,
    "flash_attn_npu": FA2,
}


def _parameters(function, positional_only_prefix=False):
    params = inspect.signature(function).parameters.values()
    if positional_only_prefix:
        params = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    return [(p.name, p.default) for p in params]


@pytest.mark.parametrize("module", MODULES)
def test_each_module_serves_its_names_with_upstreams_signatures(alias, module):
    assert importlib.util.find_spec(module) is not None  # how vllm-ascend probes
    served = importlib.import_module(module)
    table = MODULES[module]
    assert set(table) <= set(served.__all__)
    for name, expected in table.items():
        got = _parameters(getattr(served, name), positional_only_prefix=table is FA2)
        if table is FA2:  # flash_cann's defaults where flash-attn requires the argument
            got = [(n, d if e is not E else E) for (n, d), (_, e) in zip(got, expected)]
        assert got == expected, (module, name)


def test_without_the_alias_none_of_them_imports():
    if flash_cann.integrations.flash_attn_alias.installed():
        pytest.skip("the alias is installed in this process")
    for module in MODULES:
        assert importlib.util.find_spec(module.split(".")[0]) is None, module


# --- FA3 ---------------------------------------------------------------------------------

def _qkv(gen, batch=2, seqlen_q=9, seqlen_k=13, heads=4, heads_k=2, head_dim=16):
    return (torch.randn(batch, seqlen_q, heads, head_dim, generator=gen),
            torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen),
            torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen))


def test_fa3_dense_returns_out_or_out_and_lse(alias):
    from flash_attn_interface import flash_attn_func, flash_attn_qkvpacked_func

    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(gen)
    expected, lse, _ = flash_cann.flash_attn_func(q, k, v, causal=True, window_size=(5, 0),
                                                  return_attn_probs=True)
    out = flash_attn_func(q, k, v, causal=True, window_size=(5, 0), num_splits=3,
                          pack_gqa=True, sm_margin=4)
    assert torch.equal(out, expected)
    pair = flash_attn_func(q, k, v, causal=True, window_size=(5, 0), return_attn_probs=True)
    assert len(pair) == 2 and torch.equal(pair[0], expected) and torch.equal(pair[1], lse)
    # qkvpacked: (b, s, 3, h, d), and GQA packed along the heads with num_heads_q
    same = torch.randn(2, 9, 3, 2, 16, generator=gen)
    torch.testing.assert_close(flash_attn_qkvpacked_func(same, causal=True),
                               flash_cann.flash_attn_qkvpacked_func(same, causal=True))
    heads = torch.cat((q, k[:, :9], v[:, :9]), dim=2)  # 4 + 2 + 2 heads
    torch.testing.assert_close(
        flash_attn_qkvpacked_func(heads, num_heads_q=4),
        flash_cann.flash_attn_func(q, k[:, :9], v[:, :9]))
    # differentiable, as FA3's
    leaf = q.clone().requires_grad_()
    flash_attn_func(leaf, k, v, causal=True).sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_fa3_varlen_with_seqused_q_and_k_is_differentiable(alias):
    """FA3's seqused_q / seqused_k: sequence b uses the first seqused_q[b] rows of its
    segment and its first seqused_k[b] keys; the other rows get out 0 and no gradient,
    the other keys are seen by none (hopper/test_flash_attn.py's add_unused_qkv)."""
    from flash_attn_interface import flash_attn_varlen_func

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(9, 2, 16, generator=gen, requires_grad=True)
    k, v = (torch.randn(20, 2, 16, generator=gen, requires_grad=True) for _ in range(2))
    cu_q = torch.tensor([0, 3, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 20], dtype=torch.int32)
    used_q, used_k = (torch.tensor(n, dtype=torch.int32) for n in ([2, 4], [6, 10]))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 10, seqused_q=used_q,
                                      seqused_k=used_k, causal=True, return_attn_probs=True)
    rows = torch.tensor([0, 1, 3, 4, 5, 6])  # the used rows
    ref_out, ref_lse = oracle(q.detach()[rows], [k.detach()[:6], k.detach()[10:20]],
                              [v.detach()[:6], v.detach()[10:20]], [2, 4], causal=True,
                              scale=16 ** -0.5)
    torch.testing.assert_close(out.detach()[rows].double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.detach()[:, rows].double(), ref_lse, atol=1e-5, rtol=1e-5)
    unused = torch.tensor([2, 7, 8])
    assert not out.detach()[unused].any() and torch.isinf(lse.detach()[:, unused]).all()
    out.sum().backward()
    assert not q.grad[unused].any() and q.grad[rows].abs().sum() > 0
    assert not k.grad[6:10].any() and k.grad[:6].abs().sum() > 0  # unused keys: no gradient
    with pytest.raises(ValueError, match="seqused_q / seqused_k must be in"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 10,
                               seqused_q=torch.tensor([4, 4], dtype=torch.int32))


def test_fa3_kvcache_paged_ragged_queries_and_return_convention(alias):
    """vLLM / SGLang's FA3 decode call: q (total_q, h, d) with cu_seqlens_q, page_table,
    cache_seqlens; with return_softmax_lse FA3 returns (out, lse, *split partials)."""
    from flash_attn_interface import flash_attn_with_kvcache, get_scheduler_metadata

    gen = torch.Generator().manual_seed(2)
    lengths_q, lengths_k = [1, 4, 2], [9, 4, 17]
    k_cache, v_cache, table, keys, values = paged_cache(gen, lengths_k, 8, 2, 16,
                                                        torch.float32, "cpu")
    q = torch.randn(sum(lengths_q), 4, 16, generator=gen)
    cu_q = torch.tensor([0, 1, 5, 7], dtype=torch.int32)
    seqlens = torch.tensor(lengths_k, dtype=torch.int32)
    metadata = get_scheduler_metadata(3, 4, 17, 4, 2, 16, seqlens, torch.float32,
                                      cu_seqlens_q=cu_q, page_size=8, causal=True)
    assert metadata.dtype == torch.int32 and metadata.numel() == 0
    result = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                     page_table=table, cu_seqlens_q=cu_q, max_seqlen_q=4,
                                     causal=True, scheduler_metadata=metadata,
                                     return_softmax_lse=True)
    out, lse, out_accum, lse_accum = result
    assert out_accum.numel() == 0 and lse_accum.numel() == 0
    ref_out, ref_lse = oracle(q, keys, values, lengths_q, causal=True, scale=16 ** -0.5)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert torch.equal(flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               page_table=table, cu_seqlens_q=cu_q,
                                               max_seqlen_q=4, causal=True), out)


def test_fa3_rotary_seqlens_start_the_rotary_positions(alias):
    """FA3's rotary_seqlens: the rotation of the new keys (and q) starts there instead of
    at cache_seqlens; equal to flash-attn 2's call with cache_seqlens = rotary_seqlens
    on the rotation, which a cache read back shows."""
    from flash_attn_interface import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(10)
    q, k, v = _qkv(gen, seqlen_q=1, seqlen_k=1)
    cos, sin = torch.rand(16, 8, generator=gen), torch.rand(16, 8, generator=gen)
    cache = [torch.zeros(2, 12, 2, 16) for _ in range(2)]
    seqlens, starts = (torch.tensor(n, dtype=torch.int32) for n in ([3, 6], [1, 9]))
    flash_attn_with_kvcache(q, *cache, k, v, rotary_cos=cos, rotary_sin=sin,
                            cache_seqlens=seqlens, rotary_seqlens=starts, causal=True)
    rotated = rotary.apply_rotary_emb(k, cos, sin, interleaved=True, seqlen_offsets=starts)
    torch.testing.assert_close(cache[0][[0, 1], [3, 6]], rotated[:, 0])
    assert torch.equal(cache[1][[0, 1], [3, 6]], v[:, 0])  # values are not rotated


def test_fa3_kvcache_batched_append_is_flash_attn_2s(alias):
    from flash_attn_interface import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(gen, seqlen_q=2, seqlen_k=2)
    caches = [torch.randn(2, 8, 2, 16, generator=gen) for _ in range(2)]
    seqlens = torch.tensor([3, 5], dtype=torch.int32)
    ours = [c.clone() for c in caches]
    out = flash_attn_with_kvcache(q, *ours, k, v, cache_seqlens=seqlens, causal=True)
    expected = flash_cann.flash_attn_with_kvcache(q, *caches, k, v, cache_seqlens=seqlens,
                                                  causal=True)
    assert torch.equal(out, expected) and all(map(torch.equal, ours, caches))


def test_fa3_combine_merges_split_partials(alias):
    """Each split weighted by exp(lse_split - lse); rows whose splits are all -inf get
    out 0 and lse -inf (FA3's test_flash_attn_combine makes such rows)."""
    from flash_attn_interface import flash_attn_combine

    gen = torch.Generator().manual_seed(9)
    out_partial = torch.randn(3, 2, 4, 5, 8, generator=gen)
    lse_partial = torch.randn(3, 2, 5, 4, generator=gen).transpose(-1, -2)  # strided
    lse_partial[1:, 0] = -float("inf")
    lse_partial[:, 1, 2] = -float("inf")
    out, lse = flash_attn_combine(out_partial, lse_partial, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and out.shape == (2, 4, 5, 8) and lse.shape == (2, 4, 5)
    expected_lse = torch.log(torch.exp(lse_partial.double()).sum(0))
    torch.testing.assert_close(lse.double(), expected_lse)
    weights = torch.exp(lse_partial.double() - expected_lse).nan_to_num(0.0)
    expected = (weights.unsqueeze(-1) * out_partial.double()).sum(0)
    torch.testing.assert_close(out.double(), expected, atol=2e-3, rtol=2e-3)
    assert (out[1, 2] == 0).all() and torch.isinf(lse[1, 2]).all()
    into = torch.empty(2, 4, 5, 8)
    assert flash_attn_combine(out_partial, lse_partial, out=into)[0] is into


@pytest.mark.parametrize("argument, value, message", [
    ("qv", torch.zeros(1), "qv is not supported"),
    ("attention_chunk", 128, "attention_chunk=128 is not supported"),
    ("cu_seqlens_k_new", torch.zeros(3, dtype=torch.int32), "cu_seqlens_k_new is not supported"),
    ("pack_gqa", "yes", "pack_gqa must be a bool"),
    ("sm_margin", -1, "sm_margin must be an int >= 0"),
    ("num_splits", -2, "num_splits must be an int >= 0"),
])
def test_fa3_refusals_name_the_argument(alias, argument, value, message):
    from flash_attn_interface import flash_attn_with_kvcache

    q, cache = torch.randn(2, 1, 2, 16), torch.randn(2, 8, 2, 16)
    with pytest.raises((NotImplementedError, ValueError, TypeError), match=message):
        flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4, **{argument: value})


def test_fa3_descale_is_ignored_off_fp8_and_fp8_is_refused(alias):
    """FA3 applies q/k/v_descale to FP8 inputs only (vLLM passes them on every call)."""
    from flash_attn_interface import flash_attn_func, flash_attn_varlen_func

    gen = torch.Generator().manual_seed(4)
    q, k, v = _qkv(gen)
    scales = {name: torch.full((2, 2), 3.0) for name in ("q_descale", "k_descale", "v_descale")}
    assert torch.equal(flash_attn_func(q, k, v, **scales), flash_attn_func(q, k, v))
    with pytest.raises(NotImplementedError, match="with q_descale / k_descale / v_descale: "
                                                  "FP8 inputs are not supported"):
        flash_attn_func(q.to(torch.float8_e4m3fn), k, v, **scales)
    cu = torch.tensor([0, 9], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="q is torch.float8_e4m3fn"):
        flash_attn_varlen_func(q[0].to(torch.float8_e4m3fn), k[0], v[0], cu, cu, 9, 13,
                               **{name: t[:1] for name, t in scales.items()})


# --- flash-attention-npu and vllm-ascend's FA3 backend ---------------------------------

BLOCK_SIZE = 128  # AscendFABackend.get_supported_kernel_block_sizes()


def _vllm_ascend_batch(gen, dtype, decode_lengths, prefill, heads=4, heads_kv=2, head_dim=64):
    """A mixed batch as vllm-ascend's AscendAttentionMetadataBuilder lays it out:
    decode requests first (one query token each), then prefill chunks (query_lens,
    seq_lens); a (2, num_blocks, block_size, heads_kv, head_dim) KV cache."""
    seq_lens = [*decode_lengths, *(s for _, s in prefill)]
    query_lens = [*([1] * len(decode_lengths)), *(n for n, _ in prefill)]
    k_cache, v_cache, table, keys, values = paged_cache(gen, seq_lens, BLOCK_SIZE, heads_kv,
                                                        head_dim, torch.float32, "cpu")
    kv_cache = torch.stack((torch.nan_to_num(k_cache), torch.nan_to_num(v_cache))).to(dtype)
    query = torch.randn(sum(query_lens), heads, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    return dict(query=query, kv_cache=kv_cache, block_tables=table, query_start_loc=starts,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                num_decodes=len(decode_lengths), num_decode_tokens=len(decode_lengths),
                heads_kv=heads_kv, head_dim=head_dim), keys, values, query_lens


def _fa3_backend_forward(flash_attn_with_kvcache, batch):
    """AscendFAImpl.forward_impl's calls of flash_attn_npu_v3.flash_attn_with_kvcache
    (vllm_ascend/attention/fa3_v1.py): the decode rows, then the prefill rows, each with
    its slice of the block table, of query_start_loc (the prefill's starting at the
    number of decode tokens) and of seq_lens, the cache viewed as (num_blocks,
    block_size, heads_kv, head_dim), and the keyword arguments that backend passes."""
    key_cache, value_cache = (c.view(c.shape[0], BLOCK_SIZE, batch["heads_kv"],
                                     batch["head_dim"]) for c in batch["kv_cache"])
    query, starts, seq_lens = batch["query"], batch["query_start_loc"], batch["seq_lens"]
    decodes, decode_tokens = batch["num_decodes"], batch["num_decode_tokens"]

    def call(rows, table, cu_seqlens_q, lengths, causal):
        return flash_attn_with_kvcache(
            rows, key_cache, value_cache, cache_seqlens=lengths, page_table=table,
            cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max(lengths), causal=causal,
            window_size=[-1, -1], rotary_interleaved=False, num_splits=1, softcap=0.0,
            attention_chunk=0, sm_margin=0, return_softmax_lse=False)

    outputs = []
    if decodes > 0:
        outputs.append(call(query[:decode_tokens], batch["block_tables"][:decodes],
                            starts[:decodes + 1], seq_lens[:decodes], False))
    if len(seq_lens) > decodes:
        outputs.append(call(query[decode_tokens:], batch["block_tables"][decode_tokens:],
                            starts[decodes:], seq_lens[decodes:], True))
    return torch.cat(outputs) if len(outputs) > 1 else outputs[0]


def _alone(batch, b):
    """Request b of a batch as a batch of its own (the same cache and block table row)."""
    rows = slice(int(batch["query_start_loc"][b]), int(batch["query_start_loc"][b + 1]))
    decode = b < batch["num_decodes"]
    return {**batch, "query": batch["query"][rows], "block_tables": batch["block_tables"][b:b + 1],
            "seq_lens": batch["seq_lens"][b:b + 1],
            "query_start_loc": torch.tensor([0, rows.stop - rows.start], dtype=torch.int32),
            "num_decodes": int(decode), "num_decode_tokens": int(decode)}, rows


TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def check_vllm_ascend_pattern(dtype):
    """vllm-ascend's FA3 backend call pattern: the oracle's results, batch invariance (a
    request's rows alone equal its rows in the mixed batch, bitwise) and determinism (two
    runs bitwise)."""
    flash_attn_npu_v3 = importlib.import_module("flash_attn_npu_v3")
    gen = torch.Generator().manual_seed(11)
    batch, keys, values, query_lens = _vllm_ascend_batch(
        gen, dtype, decode_lengths=[5, 130, 1], prefill=[(7, 7), (3, 140), (1, 200)])
    out = _fa3_backend_forward(flash_attn_npu_v3.flash_attn_with_kvcache, batch)
    assert out.shape == batch["query"].shape and out.dtype == dtype
    decodes = batch["num_decodes"]
    reference = torch.cat([
        oracle(batch["query"][:decodes], keys[:decodes], values[:decodes],
               query_lens[:decodes], causal=False, scale=batch["head_dim"] ** -0.5)[0],
        oracle(batch["query"][decodes:], keys[decodes:], values[decodes:],
               query_lens[decodes:], causal=True, scale=batch["head_dim"] ** -0.5)[0]])
    assert (out.double() - reference).abs().max().item() <= TOLERANCE[dtype]
    again = _fa3_backend_forward(flash_attn_npu_v3.flash_attn_with_kvcache, batch)
    assert torch.equal(out, again)
    for b in range(len(query_lens)):
        alone, rows = _alone(batch, b)
        assert torch.equal(_fa3_backend_forward(flash_attn_npu_v3.flash_attn_with_kvcache,
                                                alone), out[rows]), b


def test_vllm_ascend_fa3_backend_pattern_on_cpu(alias):
    check_vllm_ascend_pattern(torch.float32)


@pytest.mark.usefixtures("alias")
def test_vllm_ascend_fa3_backend_pattern_on_the_twin():
    built("twin/libflash_cann_twin.so")
    with flash_cann.use_backend("twin"):
        check_vllm_ascend_pattern(torch.float16)


def test_npu_v3_rebases_cu_seqlens_q_fa3_does_not(alias):
    """The prefill call's query_start_loc[num_decodes:] starts at the decode tokens'
    count: flash_attn_npu_v3 reads it relative to its first entry; FA3's interface keeps
    FA3's rule and refuses it (on CPU, where cu_seqlens are checked)."""
    from flash_attn_interface import flash_attn_with_kvcache as fa3
    from flash_attn_npu_v3 import flash_attn_with_kvcache as npu_v3

    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache, table, _, _ = paged_cache(gen, [6, 9], 8, 2, 16, torch.float32, "cpu")
    q = torch.randn(5, 2, 16, generator=gen)
    call = dict(cache_seqlens=torch.tensor([6, 9], dtype=torch.int32), page_table=table,
                max_seqlen_q=3, causal=True)
    shifted = torch.tensor([4, 6, 9], dtype=torch.int32)
    assert torch.equal(npu_v3(q, k_cache, v_cache, cu_seqlens_q=shifted, **call),
                       fa3(q, k_cache, v_cache, cu_seqlens_q=shifted - 4, **call))
    with pytest.raises(ValueError, match="cu_seqlens_q must rise from 0"):
        fa3(q, k_cache, v_cache, cu_seqlens_q=shifted, **call)


def test_npu_v4_varlen_serves_page_table_and_learnable_sink(alias):
    from flash_attn_npu_4 import flash_attn_varlen_func

    gen = torch.Generator().manual_seed(6)
    k_cache, v_cache, table, keys, values = paged_cache(gen, [6, 9], 8, 2, 16,
                                                        torch.float32, "cpu")
    q = torch.randn(5, 4, 16, generator=gen)
    sink = torch.randn(4, generator=gen).to(torch.bfloat16)
    out, lse = flash_attn_varlen_func(
        q, k_cache, v_cache, cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32),
        max_seqlen_q=3, max_seqlen_k=9, seqused_k=torch.tensor([6, 9], dtype=torch.int32),
        page_table=table, causal=True, learnable_sink=sink, return_lse=True)
    ref_out, ref_lse = oracle(q, keys, values, [2, 3], causal=True, scale=16 ** -0.5,
                              sinks=sink.float())
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    with pytest.raises(NotImplementedError, match="score_mod is not supported"):
        flash_attn_varlen_func(q, k_cache, v_cache, score_mod=lambda *a: a)
    with pytest.raises(ValueError, match="page_table needs cu_seqlens_q"):
        flash_attn_varlen_func(q.unsqueeze(0), k_cache, v_cache, page_table=table)


# --- vLLM's adapter --------------------------------------------------------------------

def test_vllm_adapter_call_writes_out_and_takes_s_aux(alias):
    """vLLM's FlashAttentionImpl call: keywords only, out= its output buffer, seqused_k
    and block_table, scheduler_metadata, descales expanded to (batch, heads_kv),
    fa_version, num_splits, s_aux (gpt-oss's sinks)."""
    from vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    gen = torch.Generator().manual_seed(8)
    lengths_q, lengths_k = [1, 3], [12, 20]
    k_cache, v_cache, table, keys, values = paged_cache(gen, lengths_k, 16, 2, 32,
                                                        torch.float32, "cpu")
    q = torch.randn(4, 4, 32, generator=gen)
    cu_q = torch.tensor([0, 1, 4], dtype=torch.int32)
    seqused = torch.tensor(lengths_k, dtype=torch.int32)
    sinks = torch.randn(4, generator=gen)
    output = torch.full((6, 4, 32), 7.0)  # vLLM's buffer, longer than the tokens
    scale = torch.ones(2, 2)
    returned = flash_attn_varlen_func(
        q=q, k=k_cache, v=v_cache, out=output[:4], cu_seqlens_q=cu_q, max_seqlen_q=3,
        seqused_k=seqused, max_seqlen_k=20, softmax_scale=0.2, causal=True,
        alibi_slopes=None, window_size=[-1, -1], block_table=table, softcap=0.0,
        scheduler_metadata=get_scheduler_metadata(2, 3, 20, 4, 2, 32, seqused),
        fa_version=3, q_descale=scale.expand(2, 2), k_descale=scale, v_descale=scale,
        num_splits=0, s_aux=sinks)
    ref_out, _ = oracle(q, keys, values, lengths_q, causal=True, scale=0.2, sinks=sinks)
    torch.testing.assert_close(output[:4].double(), ref_out, atol=1e-5, rtol=1e-5)
    assert returned.data_ptr() == output.data_ptr() and (output[4:] == 7.0).all()
    out, lse = flash_attn_varlen_func(q, k_cache, v_cache, 3, cu_q, 20, seqused_k=seqused,
                                      block_table=table, causal=True, fa_version=2,
                                      return_softmax_lse=True, softmax_scale=0.2)
    assert lse.shape == (4, 4)


@pytest.mark.parametrize("argument, value, message", [
    ("fa_version", 5, "fa_version must be one of"),
    ("q_v", torch.zeros(1), "q_v is not supported"),
    ("output_scale", torch.ones(1), "output_scale is not supported"),
    ("cp_world_size", 2, "cp_world_size=2"),
    ("mask_mod", lambda *a: a, "mask_mod is not supported"),
    ("dynamic_causal", torch.ones(1), "dynamic_causal is not supported"),
    ("cu_seqlens_k", torch.tensor([0, 4], dtype=torch.int32), "exactly one of cu_seqlens_k"),
])
def test_vllm_adapter_refusals_name_the_argument(alias, argument, value, message):
    from vllm_flash_attn import flash_attn_varlen_func

    q, cache = torch.randn(4, 2, 16), torch.randn(2, 16, 2, 16)
    call = dict(q=q, k=cache, v=cache, max_seqlen_q=4, max_seqlen_k=16,
                cu_seqlens_q=torch.tensor([0, 4], dtype=torch.int32),
                seqused_k=torch.tensor([9], dtype=torch.int32),
                block_table=torch.tensor([[1]], dtype=torch.int32))
    with pytest.raises((NotImplementedError, ValueError), match=message):
        flash_attn_varlen_func(**call, **{argument: value})


def test_vllm_version_probes(alias):
    from vllm_flash_attn import fa_version_unsupported_reason, is_fa_version_supported

    assert all(is_fa_version_supported(v) for v in (2, 3, 4))
    assert fa_version_unsupported_reason(3) is None
    with pytest.raises(ValueError, match="fa_version must be one of"):
        is_fa_version_supported(1)


def test_the_modules_are_thin_maps_onto_the_api(alias):
    """The alias adds no semantics: each served name is the api module's function."""
    import flash_attn_interface
    import flash_attn_npu_4
    import flash_attn_npu_v3
    import vllm_flash_attn as served_vllm

    assert flash_attn_interface.flash_attn_with_kvcache is flash_attn_3.flash_attn_with_kvcache
    assert flash_attn_interface.flash_attn_combine is flash_attn_3.flash_attn_combine
    assert flash_attn_npu_v3.flash_attn_with_kvcache is flash_attn_npu.flash_attn_with_kvcache
    assert flash_attn_npu_v3.get_scheduler_metadata is flash_attn_3.get_scheduler_metadata
    assert flash_attn_npu_4.flash_attn_varlen_func is flash_attn_npu.flash_attn_varlen_func_v4
    assert served_vllm.flash_attn_varlen_func is vllm_flash_attn.flash_attn_varlen_func
    import flash_attn_npu as served_npu
    assert served_npu.flash_attn_with_kvcache is interface.flash_attn_with_kvcache
