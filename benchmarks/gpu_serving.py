"""GPU benchmark of the serving path (issue 24): packed prefill and KV-cache decoding, the
Triton backend against the peers on the same GPU, in one run.

    python benchmarks/gpu_serving.py [--quick] [--cases varlen,decode,long]
        [--caches 4096,8192,16384,32768] [--long 32768,131072] [--variants maxgrid,pointers]
        [--rounds N] [--out DIR] [--tag NAME]

varlen: 16k tokens in 7 documents (gpu_features.document_lengths: random lengths in
    [256, 4096], seed 0), causal within each, 16 heads, head_dim 128, bf16, forward.
    flash_cann: flash_attn_varlen_func (the grid over the real query blocks with tensor
    descriptors, the default), and two A/B rows of the same kernel: "-maxgrid" (the
    earlier grid, max_seqlen_q's blocks for every document:
    FLASH_CANN_TRITON_VARLEN_GRID=max) and "-pointers" (no descriptors:
    FLASH_CANN_TRITON_TMA=0). Peers: FlexAttention with a document mask over the packed
    (1, 16, 16k, 128) batch, SDPA FLASH and cuDNN on nested jagged tensors, flash-attn 2's
    flash_attn_varlen_func if the package is installed.
decode: one new token per sequence, batch 64, 32 query heads over 8 kv heads (GQA),
    head_dim 128, bf16, every sequence's cache full at --caches. flash_cann:
    flash_attn_with_kvcache on a contiguous cache and on a paged one (128-entry pages, a
    shuffled block table); peers on the contiguous cache: SDPA FLASH, cuDNN and
    EFFICIENT (enable_gqa), FlexAttention, flash-attn 2's flash_attn_with_kvcache
    (contiguous and paged) if installed.
long: the decode shape at batch 1 (--long caches): one sequence cannot fill the GPU, so
    flash_cann splits the keys (split-KV, num_splits=0); "-nosplit" is num_splits=1.
vllm: vLLM's mixed step, flash_attn_varlen_func over a paged cache (128-entry pages) with
    block_table and seqused_k: one 2048-token prefill chunk and 63 one-token decode rows,
    every sequence at 4096 keys, GQA 32/8, D128. flash_cann and its "-maxgrid" row (the
    grid over max_seqlen_q's blocks for every sequence); flash-attn 2's
    flash_attn_varlen_func with block_table if installed (no other peer takes this call).

--graphs: the decode, long and vllm cases again ("decode-graph", ...), each
implementation captured once into a CUDA graph and its replay timed: how serving engines
(vLLM, SGLang) run a decoding step, without the host's per-call work (the eager rows
include it wherever the host is slower than the GPU; a failed capture is recorded).

Times: median of triton.testing.do_bench (warm-up 25 ms, repetitions 100 ms, L2
flushed), rounds interleaved (median of the rounds). Decode reports the HBM bandwidth
achieved reading K and V once (2 x batch x cache x kv heads x head_dim x 2 bytes / time;
the H100's peak is 3.35 TB/s), varlen the TFLOP/s over the visible (query, key) pairs.
"x best" is the best peer's time over flash_cann's (> 1: flash_cann is faster); the
targets (issue 24): varlen >= 1.0x FlexAttention, GQA decode at 4k >= 1.0x the best
peer, batch-1 decode at 128k >= 1.0x the best peer. Writes serving[-TAG].json under
--out and prints the tables last. --quick: the targets' shapes (varlen with the -maxgrid
row only, decode at 4k, long at 128k) and the vllm step. Most of a run is compiling and
tuning (each flash_cann kernel variant and each FlexAttention shape once); not yet timed
on a GPU (estimated 3-5 minutes for --quick, 5-8 for the full run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_attention as common  # noqa: E402  (timing, Flex set-up, environments, metadata)
import gpu_features  # noqa: E402  (the documents of the varlen case)

import flash_cann  # noqa: E402  (gpu_attention put python/ on the path)

HEADS, HEAD_DIM = 16, 128                         # varlen
DECODE_BATCH, HEADS_Q, HEADS_KV, PAGE = 64, 32, 8, 128
DTYPE = torch.bfloat16
OURS = "flash_cann"
# Rows that are flash_cann with another setting: not peers, not the reference row.
VARIANTS = {OURS + "-maxgrid": {"FLASH_CANN_TRITON_VARLEN_GRID": "max"},
            OURS + "-pointers": {"FLASH_CANN_TRITON_TMA": "0"}}
# (case, minimum best peer / ours, peer: "best" or one name, which caches)
TARGETS = [("varlen", 1.0, "flex", None), ("decode", 1.0, "best", (4096,)),
           ("long", 1.0, "best", (131072,)), ("decode-graph", 1.0, "best", (4096,)),
           ("long-graph", 1.0, "best", (131072,))]


def _flash_attn():
    """flash-attn 2's module if installed (an optional peer), else None."""
    try:
        import flash_attn
        return flash_attn
    except ImportError:
        return None


# ---------------------------------------------------------------------------------------
# The cases: name -> a function of no arguments that runs one call
# ---------------------------------------------------------------------------------------

def _lazy(make, *args):
    """A call of the function ``make()`` returns, made on the first call (inside the
    measurement, so a peer that fails to compile is recorded, not fatal)."""
    made = []

    def run():
        if not made:
            made.append(make())
        return made[0](*args)
    return run


def varlen_impls(lengths, variants):
    """flash_cann, its A/B rows (``variants``) and the peers on the same packed q, k, v."""
    tokens = sum(lengths)
    q, k, v = (torch.randn(tokens, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
               for _ in range(3))
    offsets = torch.tensor([0, *lengths], device="cuda").cumsum(0)
    cu = offsets.to(torch.int32)
    longest = max(lengths)
    _, makers = gpu_features._varlen_impls(lengths)  # ours, Flex (document mask), SDPA FLASH
    impls = {name: _lazy(make, q, k, v) for name, make in makers.items()}
    for name in variants:
        impls[OURS + "-" + name] = impls[OURS]  # the same call, timed under VARIANTS

    def sdpa_cudnn_jagged():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        nested = [torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)
                  for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(*nested, is_causal=True)
    impls["sdpa-cudnn-jagged"] = sdpa_cudnn_jagged
    fa2 = _flash_attn()
    if fa2 is not None:
        impls["fa2"] = lambda: fa2.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                          causal=True)
    return impls


def decode_impls(batch, cache, long=False):
    """flash_cann contiguous and paged (and unsplit for the batch-1 case), the peers."""
    q, k, v, paged_k, paged_v, table, lengths = gpu_features.decode_inputs(
        batch, HEADS_Q, HEADS_KV, cache, PAGE, DTYPE)

    def ours(splits=0, paged=False):
        caches = (paged_k, paged_v) if paged else (k, v)
        extra = dict(block_table=table) if paged else {}
        return lambda: flash_cann.flash_attn_with_kvcache(
            q, *caches, cache_seqlens=lengths, num_splits=splits, **extra)

    impls = {OURS: ours(), OURS + "-paged": ours(paged=True)}
    if long:
        impls[OURS + "-nosplit"] = ours(splits=1)
    impls.update(gpu_features.decode_peers(q, k, v, cache))
    fa2 = _flash_attn()
    if fa2 is not None:
        impls["fa2"] = lambda: fa2.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths)
        impls["fa2-paged"] = lambda: fa2.flash_attn_with_kvcache(
            q, paged_k, paged_v, cache_seqlens=lengths, block_table=table)
    return impls


VLLM_PREFILL, VLLM_DECODES, VLLM_KEYS = 2048, 63, 4096


def vllm_impls():
    """vLLM's mixed prefill + decode step over a paged cache."""
    lengths_q = [VLLM_PREFILL] + [1] * VLLM_DECODES
    batch, blocks = len(lengths_q), VLLM_KEYS // PAGE
    q = torch.randn(sum(lengths_q), HEADS_Q, HEAD_DIM, device="cuda", dtype=DTYPE)
    k_cache, v_cache = (torch.randn(batch * blocks, PAGE, HEADS_KV, HEAD_DIM, device="cuda",
                                    dtype=DTYPE) for _ in range(2))
    table = torch.randperm(batch * blocks, device="cuda").view(batch, blocks).to(torch.int32)
    cu_q = torch.tensor([0, *lengths_q], device="cuda").cumsum(0).to(torch.int32)
    used = torch.full((batch,), VLLM_KEYS, dtype=torch.int32, device="cuda")
    call = dict(cu_seqlens_q=cu_q, max_seqlen_q=VLLM_PREFILL, seqused_k=used,
                max_seqlen_k=VLLM_KEYS, block_table=table, causal=True)
    impls = {OURS: lambda: flash_cann.flash_attn_varlen_func(q, k_cache, v_cache, **call)}
    impls[OURS + "-maxgrid"] = impls[OURS]
    fa2 = _flash_attn()
    if fa2 is not None:  # flash-attn 2 takes no seqused_k: the key counts as cu_seqlens_k
        cu_k = torch.tensor([0, *[VLLM_KEYS] * batch], device="cuda").cumsum(0).to(torch.int32)
        fa2_call = dict(call, cu_seqlens_k=cu_k)
        del fa2_call["seqused_k"]
        impls["fa2"] = lambda: fa2.flash_attn_varlen_func(q, k_cache, v_cache, **fa2_call)
    return impls


def is_ours(name: str) -> bool:
    return name.startswith(OURS)


# ---------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------

def measure(case, impls, rounds, **shape):
    """One row per implementation: the median over ``rounds`` interleaved do_bench
    medians, or the error that stopped it (recorded, not fatal)."""
    from triton.testing import do_bench

    times = {name: [] for name in impls}
    errors = {}
    for _ in range(rounds):
        for name, fn in impls.items():
            if name in errors:
                continue
            try:
                with common._environment(VARIANTS.get(name, {})):
                    times[name].append(do_bench(fn, **common.DO_BENCH))
            except Exception as e:  # a peer that cannot run this shape
                errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    rows = []
    for name in impls:
        row = dict(case=case, impl=name, dtype="bfloat16", **shape, ms=float("nan"))
        if times[name] and name not in errors:
            row["ms"] = statistics.median(times[name])
            row["ms_rounds"] = times[name]
        else:
            row["error"] = errors.get(name, "not measured")
        rows.append(row)
    torch.cuda.empty_cache()
    return rows


def graphed(fn):
    """fn captured into a CUDA graph (after warm-up calls on a side stream, which also
    compile and tune): the graph's replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graph_impls(impls):
    """Each implementation's CUDA-graph replay, or a callable raising why it could not be
    captured (measure records it)."""
    replays = {}
    for name, fn in impls.items():
        try:
            with common._environment(VARIANTS.get(name, {})):
                replays[name] = graphed(fn)
        except Exception as e:  # a peer that cannot be captured
            message = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"

            def fail(message=message):
                raise RuntimeError(message)
            replays[name] = fail
    return replays


def add_rates(rows, lengths):
    """GB/s of K and V for decode rows, TFLOP/s over the visible pairs for varlen rows."""
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    for row in rows:
        if "error" in row:
            continue
        if row["case"].startswith("varlen"):
            row["tflops"] = 4 * HEADS * HEAD_DIM * pairs / row["ms"] / 1e9
        else:
            kv_bytes = 2 * row["batch"] * row["cache"] * HEADS_KV * HEAD_DIM * DTYPE.itemsize
            # (vllm: every sequence reads its whole cache once, the prefill's included)
            row["gbps"] = kv_bytes / row["ms"] / 1e6


def _groups(rows):
    groups = {}
    for row in rows:
        groups.setdefault((row["case"], row.get("batch"), row.get("cache")), []).append(row)
    return groups


def best_peer(group):
    peers = [r for r in group if not is_ours(r["impl"]) and "error" not in r]
    return min(peers, key=lambda r: r["ms"]) if peers else None


def table(rows):
    lines = [f"{'case':<7}{'batch':>6}{'cache':>8}  {'impl':<22}{'ms':>9}{'rate':>14}"
             f"{'x best':>8}  best peer"]
    for (case, batch, cache), group in _groups(rows).items():
        best = best_peer(group)
        for r in group:
            if "error" in r:
                shown = f"{'':>9}{'':>14}{'':>8}  {r['error'][:60]}"
            else:
                rate = (f"{r['tflops']:7.1f} TFLOP/s" if "tflops" in r
                        else f"{r['gbps']:8.0f} GB/s")
                x = f"{best['ms'] / r['ms']:8.2f}" if best and is_ours(r["impl"]) else f"{'':>8}"
                shown = f"{r['ms']:9.3f}{rate:>14}{x}  {best['impl'] if best else '-'}"
            lines.append(f"{case:<7}{batch or '':>6}{cache or '':>8}  {r['impl']:<22}{shown}")
    return lines


def target_lines(rows):
    lines = ["targets (issue 24): peer time / flash_cann time (contiguous cache for decode)"]
    groups = _groups(rows)
    for case, minimum, peer, caches in TARGETS:
        found = []
        for (c, batch, cache), group in groups.items():
            if c != case or (caches and cache not in caches):
                continue
            ours = next((r for r in group if r["impl"] == OURS and "error" not in r), None)
            other = best_peer(group) if peer == "best" else next(
                (r for r in group if r["impl"] == peer and "error" not in r), None)
            if ours and other:
                found.append((other["ms"] / ours["ms"], other["impl"], cache))
        name = f"{case} >= {minimum:.1f}x {peer}" + (f" at {caches}" if caches else "")
        if not found:
            lines.append(f"  {name}: not measured")
            continue
        verdicts = ", ".join(f"{r:.2f} vs {p}" + (f" ({c // 1024}k)" if c else "")
                             for r, p, c in found)
        met = all(r >= minimum for r, _, _ in found)
        lines.append(f"  {name}: {'MET' if met else 'MISSED'} ({verdicts})")
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="the targets' shapes: varlen (A/B row: maxgrid), decode at 4k, batch 1 "
                        "at 128k, and the vllm step")
    p.add_argument("--cases", type=common._list(str),
                   default=["varlen", "decode", "long", "vllm"])
    p.add_argument("--caches", type=common._list(int), default=[4096, 8192, 16384, 32768])
    p.add_argument("--long", type=common._list(int), default=[32768, 131072])
    p.add_argument("--variants", type=common._list(str), default=["maxgrid", "pointers"],
                   help="flash_cann's A/B rows in the varlen case (each compiles and tunes "
                        "its own kernel variant)")
    p.add_argument("--graphs", action="store_true",
                   help="also time the decode, long and vllm cases as CUDA-graph replays")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    if args.quick:
        args.caches, args.long, args.variants = [4096], [131072], ["maxgrid"]
    unknown = set(args.cases) - {"varlen", "decode", "long", "vllm"}
    unknown |= {OURS + "-" + v for v in args.variants} - VARIANTS.keys()
    if unknown:
        p.error(f"unknown case(s) or variant(s): {sorted(unknown)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return 1
    meta = common.run_metadata(args.rounds)
    meta["method"] = ("triton.testing.do_bench median (warmup 25 ms, rep 100 ms), rounds "
                      "interleaved; decode GB/s = K and V bytes read once / time; varlen "
                      "TFLOP/s over visible pairs")
    meta["flash_attn"] = getattr(_flash_attn(), "__version__", "not installed")
    print(f"flash-cann serving benchmark: {meta['device']}; {meta['software']}; flash-attn "
          f"{meta['flash_attn']}", flush=True)
    lengths = gpu_features.document_lengths()
    meta["varlen_lengths"] = lengths
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / (f"serving-{args.tag}.json" if args.tag else "serving.json")

    def run(case, impls, **shape):
        measured = measure(case, impls, args.rounds, **shape)
        add_rates(measured, lengths)
        rows.extend(measured)
        print("\n".join("  " + line for line in table(measured)[1:]), flush=True)
        # After every case, so that a run stopped by a time limit keeps what it measured.
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    if "varlen" in args.cases:
        run("varlen", varlen_impls(lengths, args.variants), tokens=sum(lengths),
            documents=len(lengths))
    for suffix in ("", "-graph") if args.graphs else ("",):
        wrap = graph_impls if suffix else (lambda impls: impls)
        if "decode" in args.cases:
            for cache in args.caches:
                run("decode" + suffix, wrap(decode_impls(DECODE_BATCH, cache)),
                    batch=DECODE_BATCH, cache=cache)
        if "long" in args.cases:
            for cache in args.long:
                run("long" + suffix, wrap(decode_impls(1, cache, long=True)), batch=1,
                    cache=cache)
        if "vllm" in args.cases:
            run("vllm" + suffix, wrap(vllm_impls()), batch=VLLM_DECODES + 1, cache=VLLM_KEYS)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nwrote {path}\n{meta['device']}; {meta['software']}; {meta['date']}; flash-attn "
          f"{meta['flash_attn']}\n")
    print("\n".join(table(rows)))
    print()
    print("\n".join(target_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
