"""What flash-attn 2.8.4's own tests (tests/test_flash_attn.py) rely on beyond the
functions' results, through the alias (flash_cann.install_as_flash_attn): S_dmask in
flash-attn's layout, the paged varlen forward with q requiring grad, and the KV cache's
capacity error at the call.

The S_dmask tests re-normalise the alias's S_dmask by the rule flash-attn's tests
document (normalize_flash_attn_S, with _get_block_size_n's block size): the entries of
key block j, multiplied by exp(m_j - lse) with m_j the largest scaled score in blocks j
and after, are the attention probabilities; a negative entry is a dropped one. Both are
checked against this file's own scores, and the dropout mask against the output."""

from __future__ import annotations

import math

import pytest
import torch

import flash_cann
from flash_cann.contract import capture, checks
from test_flash_attn_alias import alias  # noqa: F401 (fixture)

DROPOUT = 0.3


def _scores(q, k, scale, causal, window, slopes):
    """(heads, seqlen_q, seqlen_k) float64 scaled scores of one sequence, -inf where the
    bottom-right aligned causal mask or window hides the key, with flash-attn's ALiBi
    bias -slope * |i + seqlen_k - seqlen_q - j|."""
    keys = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # GQA
    s = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    i = torch.arange(seqlen_q).view(-1, 1) + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k).view(1, -1)
    left, right = window[0], 0 if causal else window[1]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    if slopes is not None:
        s = s - slopes.double().view(-1, 1, 1) * (i - j).abs()
    return s.masked_fill(~visible, -math.inf)


def _renormalised(unnormalised, scores, block):
    """flash-attn's tests' rule (module docstring), written from its description."""
    lse = scores.logsumexp(-1)
    lse = torch.where(torch.isinf(lse), math.inf, lse)  # rows without keys: factor 0
    maxima = torch.stack([s.amax(-1) for s in scores.split(block, -1)], -1)
    from_the_right = maxima.flip(-1).cummax(-1).values.flip(-1)
    factors = torch.exp(from_the_right - lse.unsqueeze(-1))
    return torch.cat([u * f.unsqueeze(-1) for u, f in
                      zip(unnormalised.split(block, -1), factors.unbind(-1))], -1)


def _check_sequence(s_dmask, q, k, v, out, scale, causal, window, slopes, block):
    """One sequence's S_dmask (heads, seqlen_q, seqlen_k): it recovers the probabilities,
    and its signs are the dropout mask the output was computed with."""
    scores = _scores(q, k, scale, causal, window, slopes)
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    recovered = _renormalised(s_dmask.abs().double(), scores, block)
    torch.testing.assert_close(recovered, probs, atol=2e-6, rtol=1e-5)
    keep = s_dmask >= 0  # as flash-attn's tests read it
    heads_k = k.shape[1]
    values = v.double().repeat_interleave(q.shape[1] // heads_k, dim=1)
    expected = torch.einsum("hqk,khd->qhd", probs * keep / (1 - DROPOUT), values)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    return keep[probs > 0]


CASES = [dict(causal=False, window=(-1, -1), alibi=False),
         dict(causal=True, window=(-1, -1), alibi=False),
         dict(causal=False, window=(9, 4), alibi=True),
         dict(causal=True, window=(20, -1), alibi=True)]


@pytest.mark.parametrize("head_dim", [32, 64, 80, 128])  # key blocks of 128, 64, 64, 32
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_s_dmask_is_flash_attns_layout(alias, head_dim, case):
    from flash_attn import flash_attn_func
    from flash_attn.flash_attn_interface import _get_block_size_n

    gen = torch.Generator().manual_seed(head_dim)
    batch, seqlen_q, seqlen_k, heads, heads_k = 2, 37, 150, 4, 2
    q = torch.randn(batch, seqlen_q, heads, head_dim, generator=gen)
    k, v = (torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen) for _ in range(2))
    slopes = torch.rand(heads, generator=gen) if case["alibi"] else None
    out, _, s_dmask = flash_attn_func(q, k, v, DROPOUT, causal=case["causal"],
                                      window_size=case["window"], alibi_slopes=slopes,
                                      return_attn_probs=True)
    assert s_dmask.shape == (batch, heads, 128, 256)  # rounded up to 128, as flash-attn's
    assert not s_dmask[:, :, seqlen_q:].any() and not s_dmask[..., seqlen_k:].any()
    block = _get_block_size_n(q.device, head_dim, True, case["causal"])
    kept = torch.cat([_check_sequence(
        s_dmask[b, :, :seqlen_q, :seqlen_k], q[b], k[b], v[b], out[b], head_dim ** -0.5,
        case["causal"], case["window"], slopes, block) for b in range(batch)])
    assert abs(1 - kept.float().mean().item() - DROPOUT) < 0.02


def test_varlen_s_dmask_is_flash_attns_layout_per_sequence(alias):
    """varlen: (batch, heads, max_seqlen_q, max_seqlen_k) rounded up to 128, each
    sequence from its own first row and key, as flash-attn's kernel writes it."""
    from flash_attn import flash_attn_varlen_func
    from flash_attn.flash_attn_interface import _get_block_size_n

    gen = torch.Generator().manual_seed(7)
    lengths_q, lengths_k, heads, head_dim = [37, 5, 60], [150, 20, 70], 2, 128
    q = torch.randn(sum(lengths_q), heads, head_dim, generator=gen)
    k, v = (torch.randn(sum(lengths_k), heads, head_dim, generator=gen) for _ in range(2))
    cu_q, cu_k = ([0, *torch.tensor(n).cumsum(0).tolist()] for n in (lengths_q, lengths_k))
    out, _, s_dmask = flash_attn_varlen_func(
        q, k, v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
        max(lengths_q), max(lengths_k), DROPOUT, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (3, heads, 128, 256)
    block = _get_block_size_n(q.device, head_dim, True, True)
    for b, (n, m) in enumerate(zip(lengths_q, lengths_k)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        _check_sequence(s_dmask[b, :, :n, :m], q[rows], k[keys], v[keys], out[rows],
                        head_dim ** -0.5, True, (-1, -1), None, block)
        assert not s_dmask[b, :, n:].any() and not s_dmask[b, :, :, m:].any()


def test_flash_canns_own_functions_keep_the_probabilities(alias):
    """The alias's layout is a default of its own; flash_cann's functions still return
    the normalised probabilities, and the packed forms follow the function they wrap."""
    from flash_attn import flash_attn_func, flash_attn_qkvpacked_func

    qkv = torch.randn(1, 40, 3, 2, 64, generator=torch.Generator().manual_seed(3))
    runs = {}
    for name, function in (("own", flash_cann.flash_attn_qkvpacked_func),
                           ("alias", flash_attn_qkvpacked_func),
                           ("alias_dense", lambda t, *a, **kw: flash_attn_func(*t.unbind(2), *a,
                                                                                **kw))):
        torch.manual_seed(0)
        runs[name] = function(qkv, DROPOUT, causal=True, return_attn_probs=True)[2]
    probs = runs["own"].abs()
    assert runs["own"].shape == (1, 2, 40, 40)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 40))  # normalised rows
    assert torch.equal(runs["alias"], runs["alias_dense"])
    # the same draw: same dropped entries, and the layout only rescales each block
    alias_view = runs["alias"][:, :, :40, :40]
    assert torch.equal(torch.signbit(alias_view), torch.signbit(runs["own"]))
    assert not torch.allclose(alias_view, runs["own"])
    with pytest.raises(ValueError, match="s_dmask must be one of"):
        flash_cann.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], DROPOUT,
                                   return_attn_probs=True, s_dmask="normalised")


# --- the paged varlen forward with q requiring grad ------------------------------------

def test_paged_varlen_forward_takes_grad_inputs_backward_names_block_table(alias):
    """flash-attn 2.8.4's test_flash_attn_varlen_causal runs the paged forward with q
    requiring grad and skips the backward there."""
    from flash_attn import flash_attn_varlen_func

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(6, 2, 16, generator=gen, requires_grad=True)
    k_cache, v_cache = (torch.randn(4, 8, 2, 16, generator=gen) for _ in range(2))
    cu_q = torch.tensor([0, 2, 6], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 16], dtype=torch.int32)
    table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32)
    out = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 4, 11, 0.0, causal=True,
                                 block_table=table)
    keys = [k_cache[[1, 0]].flatten(0, 1)[:5], k_cache[[3, 2]].flatten(0, 1)[:11]]
    values = [v_cache[[1, 0]].flatten(0, 1)[:5], v_cache[[3, 2]].flatten(0, 1)[:11]]
    expected = torch.cat([flash_cann.flash_attn_func(
        q[cu_q[b]:cu_q[b + 1]].unsqueeze(0).detach(), keys[b].unsqueeze(0),
        values[b].unsqueeze(0), causal=True)[0] for b in range(2)])
    torch.testing.assert_close(out.detach(), expected)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="with block_table .* has no backward"):
        out.sum().backward()


# --- the KV cache's capacity: an error at the call ------------------------------------

def _overflowing_call(append: bool, page=256):
    """flash-attn's issue 2709 case: one sequence, a block table of one block, and
    cache_seqlens (+ one new key) one past the capacity."""
    q = torch.randn(1, 1, 1, 64)
    k_cache, v_cache = torch.randn(4, page, 1, 64), torch.randn(4, page, 1, 64)
    table = torch.zeros(1, 1, dtype=torch.int32)
    new = dict(k=torch.randn(1, 1, 1, 64), v=torch.randn(1, 1, 1, 64)) if append else {}
    seqlens = torch.full((1,), page if append else page + 1, dtype=torch.int32)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=seqlens,
                block_table=table, **new)


@pytest.mark.parametrize("append", [False, True])
def test_capacity_overflow_raises_at_the_call_naming_block_table(alias, append):
    from flash_attn import flash_attn_with_kvcache

    call = _overflowing_call(append)
    with pytest.raises(RuntimeError, match="block_table"):
        flash_attn_with_kvcache(**call)
    # exactly at the capacity, nothing appended: served
    call.update(cache_seqlens=torch.full((1,), 256, dtype=torch.int32), k=None, v=None)
    assert torch.isfinite(flash_attn_with_kvcache(**call)).all()


@pytest.mark.parametrize("capturing", [False, True])
def test_device_capacity_check_is_eager_only(monkeypatch, capturing):
    """A device's paged cache (simulated: checks.reads_values, the CPU read, answers no):
    in eager mode the capacity is checked at the call; under a graph capture the flag
    (check_kvcache_capacity) reports it instead."""
    monkeypatch.setattr(checks, "reads_values", lambda t: False)
    monkeypatch.setattr(capture, "capturing", lambda device: capturing)
    flash_cann.check_kvcache_capacity("cpu")  # no flag left by another test
    call = _overflowing_call(append=False)
    if not capturing:
        with pytest.raises(RuntimeError, match="block_table .* is too small: cache_seqlens"):
            flash_cann.flash_attn_with_kvcache(**call)
        flash_cann.check_kvcache_capacity("cpu")  # nothing recorded: refused at the call
        return
    flash_cann.flash_attn_with_kvcache(**call)
    with pytest.raises(RuntimeError, match=r"block_table .* is too small: 1 flash_attn_with_"
                                           r"kvcache call\(s\)"):
        flash_cann.check_kvcache_capacity("cpu")


@pytest.mark.parametrize("call", ["contiguous", "varlen"])
def test_other_device_calls_keep_the_flag(monkeypatch, call):
    """flash-attn checks flash_attn_with_kvcache's paged caches only: a contiguous device
    cache, and the varlen call over a paged cache (vLLM's), stay read-free."""
    monkeypatch.setattr(checks, "reads_values", lambda t: False)
    flash_cann.check_kvcache_capacity("cpu")
    q, cache = torch.randn(1, 1, 1, 8), torch.randn(2, 4, 1, 8)
    if call == "contiguous":
        flash_cann.flash_attn_with_kvcache(q, cache, cache.clone(),
                                           cache_seqlens=torch.tensor([5], dtype=torch.int32))
    else:
        one, nine = (torch.tensor(n, dtype=torch.int32) for n in ([0, 1], [9]))
        flash_cann.flash_attn_varlen_func(q[0], cache, cache, one, None, 1, 8, seqused_k=nine,
                                          block_table=torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="1 flash_attn_with_kvcache call"):
        flash_cann.check_kvcache_capacity("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_capacity_overflow_raises_at_the_call_on_cuda():
    call = {name: t.cuda() if isinstance(t, torch.Tensor) else t
            for name, t in _overflowing_call(append=True).items()}
    with pytest.raises(RuntimeError, match="block_table"):
        flash_cann.flash_attn_with_kvcache(**{n: (t.half() if t.is_floating_point() else t)
                                              for n, t in call.items()})
