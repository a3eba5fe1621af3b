"""Multi-process harness of the context-parallel tests (tests/test_distributed.py): one
group of W processes (gloo on the CPU; NCCL with one GPU per rank) runs every case in
turn, so the start-up (a process and torch per rank) is paid once per group. Each case
is a function of this module, ``case_<name>(ctx, **params)``, run on every rank; it
raises AssertionError on a wrong answer. The results come back through one JSON file
per rank. CP_TIMES=1 in the environment prints each case's time (pytest -s)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import types
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

    @property
    def tolerance(self) -> float:
        """Relative to the tensor's scale: float32 1e-5 (the issue's target); 16-bit 2e-2."""
        return 1e-5 if self.dtype == torch.float32 else 2e-2

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
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        w = cp.shard(w, 2 if name == "lse" else dim, sharding=sharding)
        close(g, w, name, ctx.tolerance)


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
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"),
                          (out, lse, ql.grad, kl.grad, vl.grad), want):
        close(g, cp.shard(w.detach(), 1 if name == "lse" else 0, sharding="contiguous"),
              name, ctx.tolerance)


# ------------------------------------------------------------------ ring-flash-attn, yunchang
# Their own functions, unchanged, with flash_cann serving `import flash_attn`. Their
# backwards assume 16-bit inputs (ring-flash-attn returns dq as bfloat16), so bfloat16,
# checked as the style guide says: the error against a float32 single-process run is
# at most 2x (output) / 3x (gradients) that of the bfloat16 single-process run -- times
# world / 2 for gradients, since these libraries round each block's partial dQ/dK/dV
# to bfloat16 (their block buffers have the input dtype) before summing W of them.

def _third_party_modules(package: str, names):
    """``package``'s submodules, imported without running its __init__ (ring-flash-attn's
    imports its Hugging Face adapter, which does not import under transformers 5)."""
    flash_cann.install_as_flash_attn()
    if package not in sys.modules:
        spec = importlib.util.find_spec(package)
        stub = types.ModuleType(package)
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules[package] = stub
    return [importlib.import_module(f"{package}.{name}") for name in names]


def _single(q, k, v, dout, dtype, **options):
    """One process, the whole sequence, in ``dtype``: (out, dq, dk, dv)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = flash_cann.flash_attn_func(*leaves, **options)
    out.backward(dout.to(dtype))
    return [out.detach(), *(t.grad for t in leaves)]


def _against_baseline(ctx, got, q, k, v, dout, extract, **options):
    """got = (out, dq, dk, dv) of this rank; extract: whole sequence -> this rank's part."""
    exact = _single(q, k, v, dout, torch.float32, **options)
    single = _single(q, k, v, dout, torch.bfloat16, **options)
    grads = 3 * max(1, ctx.world // 2)
    for name, g, e, s, factor in zip(("out", "dq", "dk", "dv"), got, exact, single,
                                     (2, grads, grads, grads)):
        e, s = extract(e), extract(s)
        err = (g.float() - e).abs().max().item()
        base = (s.float() - e).abs().max().item()
        assert err <= factor * base + 1e-6 * e.abs().max().item(), (
            f"{name}: error {err:.3g} > {factor} x single-process bfloat16's {base:.3g}")


def _bf16_inputs(ctx, batch=1, seqlen=None, heads=(2, 2), head_dim=16):
    seqlen = seqlen or 16 * ctx.world
    return _qkv(ctx, batch, seqlen, heads[0], heads[1], head_dim, "BSND")


def case_ring_flash_attn(ctx, *, function, causal):
    """ring-flash-attn 0.1.8's ring_flash_attn_func (contiguous shards) or
    zigzag_ring_flash_attn_func (zigzag shards)."""
    (module,) = _third_party_modules("ring_flash_attn", [f"{function}_flash_attn"])
    fn = getattr(module, f"{function}_flash_attn_func")
    sharding = "zigzag" if function == "zigzag_ring" else "contiguous"
    q, k, v, dout = _bf16_inputs(ctx)
    leaves = [cp.shard(t, 1, sharding=sharding).to(torch.bfloat16).requires_grad_()
              for t in (q, k, v)]
    out = fn(*leaves, causal=causal)
    out.backward(cp.shard(dout, 1, sharding=sharding).to(torch.bfloat16))
    _against_baseline(ctx, [out.detach(), *(t.grad for t in leaves)], q, k, v, dout,
                      lambda t: cp.shard(t, 1, sharding=sharding).float(), causal=causal)


def case_ring_flash_attn_llama3(ctx, *, causal):
    """ring-flash-attn 0.1.8's llama3_flash_attn_varlen_func on packed documents."""
    (module,) = _third_party_modules("ring_flash_attn", ["llama3_flash_attn_varlen"])
    tokens = DOCUMENTS[-1]
    q, k, v, dout = (ctx.rand(tokens, 2, 16, seed=s) for s in range(4))
    cu = torch.tensor(DOCUMENTS, dtype=torch.int32, device=ctx.device)
    cu_q, cu_k, max_q, max_k, k_slice = module.llama3_flash_attn_prepare_cu_seqlens(
        cu, causal, ctx.rank, ctx.world)
    part = lambda t: cp.shard(t, 0, sharding="contiguous")  # noqa: E731
    leaves = [part(t).to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    out = module.llama3_flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k,
                                               heads_k_stride=1, local_k_slice=k_slice,
                                               causal=causal)
    out.backward(part(dout).to(torch.bfloat16))
    # the whole packed batch as one "batch" of flash_attn_func would mix documents:
    # compare with flash_attn_varlen_func instead
    longest = max(b - a for a, b in zip(DOCUMENTS, DOCUMENTS[1:]))

    def single(dtype):
        ls = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o = flash_cann.flash_attn_varlen_func(*ls, cu, cu, longest, longest, causal=causal)
        o.backward(dout.to(dtype))
        return [o.detach(), *(t.grad for t in ls)]
    exact, single16 = single(torch.float32), single(torch.bfloat16)
    for name, g, e, s, factor in zip(("out", "dq", "dk", "dv"),
                                     [out.detach(), *(t.grad for t in leaves)], exact,
                                     single16, (2, 3, 3, 3)):  # one block: no extra rounding
        e, s = part(e), part(s).float()
        err, base = (g.float() - e).abs().max().item(), (s - e).abs().max().item()
        assert err <= factor * base + 1e-6 * e.abs().max().item(), (name, err, base)


def case_yunchang(ctx, *, ring_impl, ulysses, causal):
    """yunchang's LongContextAttention (Ulysses all-to-all x ring), attn_type FA, its
    input sharded by its own extract_local."""
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.comm.extract_local import EXTRACT_FUNC_DICT
    from yunchang.kernels import AttnType
    _third_party_modules("yunchang", [])
    ring = ctx.world // ulysses
    set_seq_parallel_pg(ulysses, ring, ctx.rank, ctx.world)
    q, k, v, dout = _bf16_inputs(ctx, heads=(4, 4))
    extract = lambda t: EXTRACT_FUNC_DICT[ring_impl](  # noqa: E731
        t, ctx.rank, world_size=ctx.world, rd=ring, ud=ulysses).float()
    leaves = [extract(t).to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    attention = LongContextAttention(ring_impl_type=ring_impl, attn_type=AttnType.FA)
    out = attention(*leaves, causal=causal)
    out.backward(extract(dout).to(torch.bfloat16))
    _against_baseline(ctx, [out.detach(), *(t.grad for t in leaves)], q, k, v, dout, extract,
                      causal=causal)


# ------------------------------------------------------------------ torch's context_parallel

def _torch_cp(ctx, rotate):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    set_rotate_method(rotate)
    return init_device_mesh(ctx.device.type, (ctx.world,)), context_parallel


def case_torch_context_parallel(ctx, *, rotate, causal, layout="BNSD", heads=(2, 2)):
    """flash_cann.attention called unchanged inside torch's context_parallel on buffers
    it shards (head-tail), forward and backward, against one process."""
    mesh, context_parallel = _torch_cp(ctx, rotate)
    dim = 2 if layout == "BNSD" else 1
    q, k, v, dout = _qkv(ctx, 1, 16 * ctx.world, *heads, 16, layout)
    want = _whole(q, k, v, dout, layout, causal, (-1, -1))
    buffers = [t.clone() for t in (q, k, v, dout)]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[dim] * 4):
        ql, kl, vl = (t.detach().requires_grad_() for t in buffers[:3])
        out, lse = flash_cann.attention(ql, kl, vl, layout=layout, causal=causal,
                                        return_lse=True)
        out.backward(buffers[3])
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"),
                          (out, lse, ql.grad, kl.grad, vl.grad), want):
        close(g, cp.shard(w, 2 if name == "lse" else dim), name, ctx.tolerance)


def case_torch_context_parallel_hf(ctx, *, rotate, family="llama"):
    """A tiny Llama (GQA), or Mistral with a sliding window longer than a shard (16
    tokens) and shorter than the sequence, with
    attn_implementation="fa_cann" inside torch's context_parallel: logits and every
    parameter's gradient (summed over ranks) as one process running the whole sequence."""
    import transformers
    mesh, context_parallel = _torch_cp(ctx, rotate)
    torch.manual_seed(0)
    tiny = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    config = (transformers.LlamaConfig(**tiny) if family == "llama"
              else transformers.MistralConfig(**tiny, sliding_window=20))
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="fa_cann").to(ctx.device, ctx.dtype)
    seqlen = 16 * ctx.world
    ids = torch.randint(0, 97, (1, seqlen), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(seqlen).unsqueeze(0)
    weights = ctx.rand(1, seqlen, 97, seed=5)
    logits = model(ids.to(ctx.device), position_ids=positions.to(ctx.device)).logits
    (logits * weights).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    buffers = [ids.to(ctx.device), positions.to(ctx.device), weights.clone()]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[1, 1, 1]):
        local = model(buffers[0], position_ids=buffers[1]).logits
        (local * buffers[2]).sum().backward()
    close(local.detach(), cp.shard(logits.detach(), 1), "logits", ctx.tolerance)
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        # 16-bit: gradients summed over layers and ranks in another order
        close(p.grad, want[name], name, ctx.tolerance * (1 if ctx.dtype == torch.float32 else 2.5))


# ------------------------------------------------------------------ the harness

def run_group(rank: int, world: int, port: int, backend: str, cases, out_dir: str):
    """Entry point of each spawned rank: run every (name, function, params) case.
    backend "gloo-triton": gloo, with CPU tensors served by the triton backend in
    Triton's interpreter (TRITON_INTERPRET=1 set by the launcher; float16); "gloo-twin":
    served by the twin backend (the Ascend C kernels on the CPU twin; float16)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # the backend module the cases must have run on (a case that fell back to the cpu
    # backend would pass without testing it)
    expected = {"gloo-triton": "flash_cann.backends.triton.cuda",
                "gloo-twin": "flash_cann.backends.twin.launcher"}.get(backend)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device, dtype = torch.device("cuda", rank), torch.float16
    elif backend == "gloo-triton":
        import triton_interpreter_patch
        from flash_cann.contract import ops
        assert os.environ.get("TRITON_INTERPRET") == "1", "the forkserver runs Triton compiled"
        triton_interpreter_patch.patch_interpreter(setattr)
        ops._selected["cpu"] = "triton"
        device, dtype, backend = torch.device("cpu"), torch.float16, "gloo"
    elif backend == "gloo-twin":  # the Ascend C kernels on the CPU twin (built by then)
        from flash_cann.contract import ops
        ops._selected["cpu"] = "twin"
        device, dtype, backend = torch.device("cpu"), torch.float16, "gloo"
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
            assert expected is None or expected in sys.modules, f"{expected} never ran"
        except Exception:  # reported per case by the test that owns it
            results[name] = traceback.format_exc(limit=6)
        dist.barrier()
        if os.environ.get("CP_TIMES"):  # per-case times, to keep the groups inside budget
            print(f"rank {rank} {name}: {time.perf_counter() - started:.2f}s", flush=True)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
