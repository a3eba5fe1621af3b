"""Multi-process harness of the context-parallel tests (tests/test_distributed.py): one
group of W processes (gloo on the CPU; NCCL with one GPU per rank) runs every case in
turn, so the start-up (a process and torch per rank) is paid once per group. Each case
is a function of this module, ``case_<name>(ctx, **params)``, run on every rank; it
raises AssertionError on a wrong answer. The results come back through one JSON file
per rank."""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import flash_cann
import flash_cann.distributed as cp


@dataclass
class Context:
    rank: int
    world: int
    device: torch.device
    dtype: torch.dtype

    def rand(self, *shape, seed: int):
        """The same tensor on every rank (the whole sequence)."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=g).to(self.device, self.dtype)


def close(got, want, what: str, rel: float):
    """max |got - want| <= rel * max |want| (relative to the tensor's scale)."""
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel:g} x {scale:.3g}"


# ------------------------------------------------------------------ dense sequences

def _qkv(ctx, batch, seqlen, heads, heads_k, head_dim, layout, seed=0):
    def shape(h):
        return (batch, seqlen, h, head_dim) if layout == "BSND" else (batch, h, seqlen, head_dim)
    return (ctx.rand(*shape(heads), seed=seed), ctx.rand(*shape(heads_k), seed=seed + 1),
            ctx.rand(*shape(heads_k), seed=seed + 2), ctx.rand(*shape(heads), seed=seed + 3))


def _whole(q, k, v, dout, layout, causal, window, softcap=0.0):
    """One process, the whole sequence: (out, lse, dq, dk, dv)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = flash_cann.attention(q, k, v, layout=layout, causal=causal,
                                    window_size=window, softcap=softcap, return_lse=True)
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _sharded(ctx, tensors, dim, sharding):
    return [cp.shard(t, dim, sharding=sharding) for t in tensors]


def _context_parallel(q, k, v, dout, **options):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = cp.context_parallel_attn_func(q, k, v, return_lse=True, **options)
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def case_dense(ctx, *, causal, window=(-1, -1), sharding="zigzag", rotate="auto",
               heads=(2, 2), layout="BSND", batch=1, seqlen=None, softcap=0.0):
    """Forward and backward against one process running the whole sequence."""
    seqlen = seqlen or 16 * ctx.world
    dim = 1 if layout == "BSND" else 2
    q, k, v, dout = _qkv(ctx, batch, seqlen, heads[0], heads[1], 16, layout)
    want = _whole(q, k, v, dout, layout, causal, window, softcap)
    local = _sharded(ctx, (q, k, v, dout), dim, sharding)
    got = _context_parallel(*local, causal=causal, window_size=window, sharding=sharding,
                            rotate=rotate, layout=layout, softcap=softcap)
    rel = 1e-5 if ctx.dtype == torch.float32 else 2e-2
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        w = cp.shard(w, 2 if name == "lse" else dim, sharding=sharding)
        close(g, w, name, rel)


def case_bitwise(ctx, *, causal, window=(-1, -1), heads=(2, 1)):
    """deterministic=True twice: the same bits; and the ring and the all-gather agree
    bit for bit (the same sums in the same order)."""
    q, k, v, dout = (cp.shard(t, 1) for t in _qkv(ctx, 1, 16 * ctx.world, *heads, 16, "BSND"))
    runs = [_context_parallel(q, k, v, dout, causal=causal, window_size=window,
                              rotate=rotate, deterministic=True)
            for rotate in ("p2p", "p2p", "allgather")]
    for name, a, b, c in zip(("out", "lse", "dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name}: two deterministic runs differ"
        assert torch.equal(a, c), f"{name}: ring and all-gather differ"


# ------------------------------------------------------------------ packed documents

DOCUMENTS = [0, 5, 23, 24, 40, 64]  # 5 documents, 64 tokens: boundaries inside shards


def case_varlen(ctx, *, causal, window=(-1, -1), heads=(2, 2)):
    """llama3-style: contiguous token shards, per-rank cu_seqlens, against
    flash_attn_varlen_func on the whole packed batch."""
    tokens, dim = DOCUMENTS[-1], 16
    q, k, v, dout = (ctx.rand(tokens, h, dim, seed=s)
                     for s, h in enumerate((heads[0], heads[1], heads[1], heads[0])))
    cu = torch.tensor(DOCUMENTS, dtype=torch.int32, device=ctx.device)
    longest = max(b - a for a, b in zip(DOCUMENTS, DOCUMENTS[1:]))
    ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flash_cann.flash_attn_varlen_func(ql, kl, vl, cu, cu, longest, longest,
                                                    causal=causal, window_size=window,
                                                    return_attn_probs=True)
    out.backward(dout)
    want = (out, lse, ql.grad, kl.grad, vl.grad)
    shard = cp.varlen_shard(DOCUMENTS, causal=causal, device=ctx.device)
    local = [cp.shard(t, 0, sharding="contiguous") for t in (q, k, v, dout)]
    ql, kl, vl = (t.requires_grad_() for t in local[:3])
    out, lse = cp.context_parallel_varlen_attn_func(ql, kl, vl, shard, causal=causal,
                                                    window_size=window, return_lse=True)
    out.backward(local[3])
    rel = 1e-5 if ctx.dtype == torch.float32 else 2e-2
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"),
                          (out, lse, ql.grad, kl.grad, vl.grad), want):
        close(g, cp.shard(w.detach(), 1 if name == "lse" else 0, sharding="contiguous"),
              name, rel)


# ------------------------------------------------------------------ the harness

def run_group(rank: int, world: int, port: int, backend: str, cases, out_dir: str):
    """Entry point of each spawned rank: run every (name, function, params) case."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device, dtype = torch.device("cuda", rank), torch.float16
    else:
        device, dtype = torch.device("cpu"), torch.float32
    dist.init_process_group(backend, rank=rank, world_size=world)
    ctx = Context(rank, world, device, dtype)
    results = {}
    for name, function, params in cases:
        started = time.perf_counter()
        try:
            globals()[f"case_{function}"](ctx, **params)
            results[name] = None
        except Exception:  # reported per case by the test that owns it
            results[name] = traceback.format_exc(limit=6)
        dist.barrier()
        if os.environ.get("CP_TIMES"):
            print(f"rank {rank} {name}: {time.perf_counter() - started:.2f}s", flush=True)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
