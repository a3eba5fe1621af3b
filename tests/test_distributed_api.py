"""flash_cann.distributed without processes: the argument rules (each refusal names the
argument), the rotation choice, sharding round trips, the per-rank varlen offsets, and
torch's context_parallel registration on a torch whose module lacks what it needs. A
one-rank gloo group (in this process) runs the world-of-one case against one call."""

from __future__ import annotations

import socket
import sys
import types

import pytest
import torch
import torch.distributed as dist

import flash_cann
import flash_cann.distributed as cp
from flash_cann.distributed import rotation
from flash_cann.integrations import torch_context_parallel


@pytest.fixture(scope="module")
def one_rank():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_not_initialised_is_explained():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        cp.context_parallel_attn_func(q, q, q)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(sharding="striped"), ValueError, "sharding must be one of"),
    (dict(rotate="alltoall"), ValueError, "rotate must be one of"),
    (dict(layout="TND"), ValueError, "layout must be one of"),
    (dict(causal="yes"), TypeError, "causal must be a bool"),
])
def test_bad_arguments_are_named(one_rank, kwargs, error, match):
    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(error, match=match):
        cp.context_parallel_attn_func(q, q, q, **kwargs)


def test_shard_lengths_are_checked(one_rank):
    q, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 6, 1, 8)
    with pytest.raises(ValueError, match="same shard"):
        cp.context_parallel_attn_func(q, k, k)
    with pytest.raises(ValueError, match="same shard"):
        cp.context_parallel_attn_func(q, q, k)   # v alone differs
    odd = torch.zeros(1, 3, 1, 8)
    with pytest.raises(ValueError, match="divisible by 2"):  # zigzag: 2 chunks per rank
        cp.context_parallel_attn_func(odd, odd, odd)


def test_one_rank_is_one_call(one_rank):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 16, generator=g, requires_grad=True) for _ in range(3))
    out = cp.context_parallel_attn_func(q, k, v, causal=True, window_size=(3, -1))
    want = flash_cann.flash_attn_func(q, k, v, causal=True, window_size=(3, -1))
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    out = cp.context_parallel_attn_func(q, k, v, causal=False, softcap=2.0)
    want = flash_cann.flash_attn_func(q, k, v, causal=False, softcap=2.0)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method, local, kv, world, windowed, chosen", [
    ("auto", 300, 200, 2, False, "allgather"),   # 2 ranks: 400 <= 600
    ("auto", 200, 200, 2, False, "allgather"),   # at the bound: 400 <= 400
    ("auto", 300, 200, 4, False, "p2p"),         # 800 > 600
    ("auto", 300, 50, 8, False, "allgather"),    # GQA's small K/V: 400 <= 600
    ("auto", 300, 200, 2, True, "p2p"),          # a window: the ring stops early
    ("allgather", 300, 200, 8, True, "allgather"),
])
def test_rotation_choice(method, local, kv, world, windowed, chosen):
    assert rotation.choose(method, local, kv, world, windowed) == chosen


@pytest.mark.parametrize("sharding", cp.SHARDINGS)
def test_shard_and_restore_round_trip(sharding):
    x = torch.arange(2 * 24 * 3).view(2, 24, 3)
    parts = [cp.shard(x, 1, sharding=sharding, rank=r, world=3) for r in range(3)]
    assert torch.equal(cp.restore(parts, 1, sharding), x)
    if sharding == "zigzag":  # rank 0 holds chunks 0 and 5 of 6
        assert torch.equal(parts[0][0, :, 0], torch.cat((x[0, 0:4, 0], x[0, 20:24, 0])))


def test_varlen_offsets_per_rank():
    documents = [0, 5, 23, 24, 40, 64]
    shard = cp.varlen_shard(documents, causal=True, rank=1, world=4)   # tokens 16 .. 31
    assert (shard.q_start, shard.q_end, shard.k_start, shard.k_end) == (16, 32, 5, 32)
    assert shard.cu_seqlens_q.tolist() == [0, 7, 8, 16]
    assert shard.cu_seqlens_k.tolist() == [0, 18, 19, 27]
    assert (shard.max_seqlen_q, shard.max_seqlen_k) == (8, 18)
    full = cp.varlen_shard(documents, causal=False, rank=1, world=4)  # whole documents
    assert (full.k_start, full.k_end, full.cu_seqlens_k.tolist()) == (5, 40, [0, 18, 19, 35])
    # a document ending exactly at the shard's start, and an empty one inside it, bring
    # no sequence: rank 1 of [0, 16) [16, 20) [20, 20) [20, 32) holds two documents
    edge = cp.varlen_shard([0, 16, 20, 20, 32], causal=True, rank=1, world=2)
    assert (edge.k_start, edge.cu_seqlens_q.tolist(), edge.cu_seqlens_k.tolist()) == \
        (16, [0, 4, 16], [0, 4, 16])


def test_varlen_refusals():
    with pytest.raises(ValueError, match="split evenly"):
        cp.varlen_shard([0, 5, 7], causal=True, rank=0, world=2)
    with pytest.raises(ValueError, match="never decrease"):
        cp.varlen_shard([0, 5, 3, 8], causal=True, rank=0, world=2)
    with pytest.raises(ValueError, match="start at 0"):
        cp.varlen_shard([2, 6], causal=True, rank=0, world=2)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="host data"):
            cp.varlen_shard(torch.tensor([0, 4]).cuda(), causal=True, rank=0, world=2)


def test_varlen_window_needs_causal(one_rank):
    shard = cp.varlen_shard([0, 4, 8], causal=False)
    t = torch.zeros(8, 1, 8)
    with pytest.raises(NotImplementedError, match="window_size"):
        cp.context_parallel_varlen_attn_func(t, t, t, shard, causal=False, window_size=(2, 2))
    with pytest.raises(ValueError, match="causal=False"):
        cp.context_parallel_varlen_attn_func(t, t, t, shard, causal=True)


def test_torch_without_what_registration_needs_is_left_alone():
    """Another torch's module (fewer names): nothing patched, UNSUPPORTED says why, and
    nothing raises (flash_cann's import must not break on torch 2.11)."""
    module = types.ModuleType("fake_attention")
    module.custom_ops = {}
    torch_context_parallel.register(module)
    assert module.custom_ops == {}
    assert "_cp_options" in torch_context_parallel.UNSUPPORTED
    torch_context_parallel.UNSUPPORTED = None


def test_a_reexporting_shim_registers_the_defining_module(monkeypatch):
    """torch 2.13 keeps the old module path as a shim re-exporting context_parallel (whose
    __module__ it rewrites for the docs): registration follows the function's globals to
    the module it calls into."""
    real = types.ModuleType("fake_cp_real")
    exec("def context_parallel():\n    return _enable_context_parallel_dispatcher_impl\n",
         real.__dict__)
    real.context_parallel.__module__ = "somewhere.public"
    real.custom_ops, real._cp_options, real._RotateMethod = {}, object(), object()
    real._enable_context_parallel_dispatcher_impl = lambda seq_dim, mesh: None
    real._disable_context_parallel_dispatcher_impl = lambda: None
    monkeypatch.setitem(sys.modules, "fake_cp_real", real)
    shim = types.ModuleType("fake_cp_shim")
    shim.context_parallel = real.context_parallel
    torch_context_parallel.register(shim)
    assert torch.ops.flash_cann.fwd.default in real.custom_ops
    assert real.context_parallel().__name__ == "enable_with_flash_cann"
    assert not hasattr(shim, "_flash_cann_registered")


@pytest.mark.parametrize("name, value", [("key_padding_mask", torch.ones(1, 4, dtype=torch.bool)),
                                         ("alibi_slopes", torch.ones(2)), ("dropout_p", 0.1),
                                         ("sinks", torch.zeros(2)), ("layout", "TND")])
def test_torch_context_parallel_refuses_features_by_name(name, value):
    """What torch's context_parallel cannot shard through flash_cann is refused, naming
    the argument (the handlers run these checks before any transfer)."""
    op = torch.ops.flash_cann.fwd.default
    named = torch_context_parallel._named(op, (), {"scale": 1.0, name: value})
    with pytest.raises(NotImplementedError, match=name if name != "layout" else "TND"):
        torch_context_parallel._refuse_features(named)
