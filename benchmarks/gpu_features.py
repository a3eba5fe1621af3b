"""GPU benchmark of the flash-attn features on the Triton backend against the peers that
support them, in one run: packed variable-length sequences, a sliding window, and
decoding with a KV cache.

    python benchmarks/gpu_features.py [--cases varlen,window,decode] [--modes fwd,fwd+bwd]
        [--dtypes bfloat16] [--caches 4096,8192,16384,32768] [--rounds N] [--out DIR]
        [--tag NAME]

varlen: 16k tokens of documents with random lengths in [256, 4096] (fixed seed), 16
    heads, head_dim 128, causal within each document. flash_cann: flash_attn_varlen_func
    (layout TND); FlexAttention: a document mask over the packed (1, 16, 16k, 128) batch
    (block mask skips cross-document blocks); SDPA FLASH: nested jagged tensors.
window: Mistral's sliding window, causal with 4096 keys to the left, seqlen 16k, batch
    1, 16 heads, head_dim 128. flash_cann: flash_attn_func(window_size=(4096, 0));
    FlexAttention: the same band as a block mask; SDPA (efficient, cuDNN): an explicit
    boolean mask (they compute every block).

decode: one new token per sequence, batch 64, 32 query heads over 8 kv heads (GQA) and
    32 over 32 (caches up to 8k: 32k would not fit twice), head_dim 128, bf16, cache
    lengths --caches (every sequence full). flash_cann: flash_attn_with_kvcache on a
    contiguous cache and on a paged one (256-entry pages, a shuffled block table); SDPA
    (FLASH, cuDNN, efficient; enable_gqa) and FlexAttention on the contiguous cache.
    Speed as GB/s of K and V read (each cache entry once), the bound of decoding.

TFLOP/s count the visible (query, key) pairs only: 4 * heads * head_dim * pairs for the
forward, 3.5x that for fwd+bwd, so that the numbers measure how well an
implementation skips what the mask hides. Median of triton.testing.do_bench as in
gpu_attention.py; ratios are the peer's time over flash_cann's (> 1: flash_cann is
faster). Writes features[-TAG].json under --out and prints the table.
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
import gpu_attention as common  # noqa: E402  (its timing, peers' set-up and run metadata)

import flash_cann  # noqa: E402  (gpu_attention put python/ on the path)

HEADS, HEAD_DIM, TOKENS = 16, 128, 16384
WINDOW = 4096
DOC_LENGTHS = (256, 4096)
OURS = "flash_cann"


def document_lengths(seed: int = 0) -> list[int]:
    """Random document lengths in DOC_LENGTHS summing to TOKENS."""
    gen = torch.Generator().manual_seed(seed)
    lengths, left = [], TOKENS
    while left > 0:
        n = min(left, int(torch.randint(*DOC_LENGTHS, (1,), generator=gen)))
        lengths.append(n)
        left -= n
    return lengths


def visible_pairs(case: str, lengths: list[int]) -> int:
    if case == "varlen":
        return sum(n * (n + 1) // 2 for n in lengths)
    return sum(min(i + 1, WINDOW + 1) for i in range(TOKENS))


# ---------------------------------------------------------------------------------------
# The implementations: (q, k, v) in a case's layout -> out
# ---------------------------------------------------------------------------------------

def _varlen_impls(lengths):
    offsets = torch.tensor([0, *lengths], device="cuda").cumsum(0)
    cu = offsets.to(torch.int32)
    longest = max(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                                  torch.tensor(lengths, device="cuda"))

    def ours(q, k, v):  # q: (tokens, heads, head_dim)
        return flash_cann.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)

    def flex():
        from torch.nn.attention.flex_attention import create_block_mask
        common._flex(False, TOKENS)  # compiles flex_attention once, as gpu_attention does
        mask = create_block_mask(lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx])
                                 & (q_idx >= kv_idx), None, None, TOKENS, TOKENS)

        def run(q, k, v):
            packed = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            return common._flex_compiled(*packed, block_mask=mask)[0].transpose(0, 1)
        return run

    def sdpa_jagged(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        nested = [torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)
                  for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(*nested, is_causal=True).transpose(1, 2).values()

    shape = (TOKENS, HEADS, HEAD_DIM)
    return shape, {OURS: lambda: ours, "flex": flex, "sdpa-flash-jagged": lambda: sdpa_jagged}


def _window_impls():
    def ours(q, k, v):  # (1, seqlen, heads, head_dim)
        return flash_cann.flash_attn_func(q, k, v, causal=True, window_size=(WINDOW, 0))

    def band(q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)

    def flex():
        from torch.nn.attention.flex_attention import create_block_mask
        common._flex(False, TOKENS)
        mask = create_block_mask(lambda b, h, q_idx, kv_idx: band(q_idx, kv_idx), None, None,
                                 TOKENS, TOKENS)
        return lambda q, k, v: common._flex_compiled(
            *(t.transpose(1, 2) for t in (q, k, v)), block_mask=mask).transpose(1, 2)

    def sdpa(backend_name):
        def make():
            from torch.nn.attention import SDPBackend, sdpa_kernel
            positions = torch.arange(TOKENS, device="cuda")
            mask = band(positions[:, None], positions[None, :])

            def run(q, k, v):
                with sdpa_kernel(getattr(SDPBackend, backend_name)):
                    return F.scaled_dot_product_attention(
                        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(1, 2)
            return run
        return make

    shape = (1, TOKENS, HEADS, HEAD_DIM)
    return shape, {OURS: lambda: ours, "flex": flex,
                   "sdpa-effic": sdpa("EFFICIENT_ATTENTION"), "sdpa-cudnn": sdpa("CUDNN_ATTENTION")}


DECODE_BATCH, DECODE_HEADS_Q, PAGE = 64, 32, 256


def decode_inputs(batch, heads_q, heads_kv, cache, page, dtype=torch.bfloat16):
    """One decode shape's inputs: q (batch, 1, heads_q, d); the caches dense (batch, cache,
    heads_kv, d) and the same entries paged (page entries a block, blocks shuffled by the
    block table); every sequence's cache full. Returns (q, k, v, paged_k, paged_v, table,
    lengths)."""
    q = torch.randn(batch, 1, heads_q, HEAD_DIM, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, cache, heads_kv, HEAD_DIM, device="cuda", dtype=dtype)
            for _ in range(2))
    blocks = cache // page
    order = torch.randperm(batch * blocks, device="cuda")
    table = order.view(batch, blocks).to(torch.int32)
    paged_k, paged_v = (torch.empty_like(t).view(-1, page, heads_kv, HEAD_DIM) for t in (k, v))
    paged_k[order] = k.view(-1, page, heads_kv, HEAD_DIM)
    paged_v[order] = v.view(-1, page, heads_kv, HEAD_DIM)
    lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    return q, k, v, paged_k, paged_v, table, lengths


def decode_peers(q, k, v, cache):
    """The peers of a decode step on the dense cache (enable_gqa): SDPA FLASH, cuDNN and
    EFFICIENT, FlexAttention; each a closure over the (batch, heads, seqlen, d) views."""
    q_h, k_h, v_h = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa(backend_name):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run():
            with sdpa_kernel(getattr(SDPBackend, backend_name)):
                return F.scaled_dot_product_attention(q_h, k_h, v_h, enable_gqa=True)
        return run

    def flex():
        common._flex(False, cache)
        return common._flex_compiled(q_h, k_h, v_h, enable_gqa=True)

    return {"sdpa-flash": sdpa("FLASH_ATTENTION"), "sdpa-cudnn": sdpa("CUDNN_ATTENTION"),
            "sdpa-effic": sdpa("EFFICIENT_ATTENTION"), "flex": flex}


def _decode_impls(heads_kv, cache):
    """flash_cann on the dense and the paged cache, and the peers, for one decode shape."""
    q, k, v, paged_k, paged_v, table, lengths = decode_inputs(
        DECODE_BATCH, DECODE_HEADS_Q, heads_kv, cache, PAGE)
    return {
        OURS: lambda: flash_cann.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths),
        OURS + "-paged": lambda: flash_cann.flash_attn_with_kvcache(
            q, paged_k, paged_v, cache_seqlens=lengths, block_table=table),
        **decode_peers(q, k, v, cache)}


def measure_decode(heads_kv, cache, rounds):
    from triton.testing import do_bench

    rows = []
    impls = _decode_impls(heads_kv, cache)
    gigabytes = 2 * DECODE_BATCH * cache * heads_kv * HEAD_DIM * 2 / 1e9
    times = {name: [] for name in impls}
    errors = {}
    for _ in range(rounds):
        for name, fn in impls.items():
            try:
                times[name].append(do_bench(fn, **common.DO_BENCH))
            except Exception as e:  # a peer that cannot run this shape: recorded
                errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    for name in impls:
        row = dict(case="decode", impl=name, dtype="bfloat16", mode="fwd", heads=DECODE_HEADS_Q,
                   heads_kv=heads_kv, head_dim=HEAD_DIM, batch=DECODE_BATCH, cache=cache,
                   ms=float("nan"), gbps=float("nan"))
        if times[name]:
            row["ms"] = statistics.median(times[name])
            row["gbps"] = gigabytes / row["ms"] * 1e3
        elif name in errors:
            row["error"] = errors[name]
        rows.append(row)
    torch.cuda.empty_cache()
    return rows


def decode_table(rows):
    lines = [f"{'heads':<7} {'cache':>6} {'impl':<18} {'ms':>8} {'GB/s':>7} {'best peer/ours':>14}"]
    for r in rows:
        peers = [p["ms"] for p in rows if p["cache"] == r["cache"] and p["heads_kv"] ==
                 r["heads_kv"] and not p["impl"].startswith(OURS) and "error" not in p]
        best = min(peers) if peers else float("nan")
        shown = r.get("error") or (f"{r['ms']:8.3f} {r['gbps']:7.0f} "
                                   f"{best / r['ms']:14.2f}")
        lines.append(f"{DECODE_HEADS_Q}/{r['heads_kv']:<4} {r['cache']:>6} {r['impl']:<18} {shown}")
    return lines


def measure(case, impl, make, shape, dtype, mode, pairs):
    row = dict(case=case, impl=impl, dtype=str(dtype).removeprefix("torch."), mode=mode,
               heads=HEADS, head_dim=HEAD_DIM, tokens=TOKENS, pairs=pairs, ms=float("nan"),
               tflops=float("nan"))
    try:
        fn = make()
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
                   for _ in range(3))
        row["ms"] = common._time_ms(fn, q, k, v, mode)
        row["tflops"] = 4 * HEADS * HEAD_DIM * pairs * common.FLOP_FACTOR[mode] / row["ms"] / 1e9
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
    except Exception as e:  # a peer that cannot run this case: recorded, not fatal
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    torch.cuda.empty_cache()
    return row


def table(rows):
    lines = [f"{'case':<8} {'dtype':<9} {'mode':<8} {'impl':<18} {'ms':>8} {'TFLOP/s':>8} "
             f"{'peer/ours':>9}"]
    ours = {(r["case"], r["dtype"], r["mode"]): r for r in rows if r["impl"] == OURS}
    for r in rows:
        base = ours.get((r["case"], r["dtype"], r["mode"]))
        ratio = (r["ms"] / base["ms"]) if base and "error" not in r and "error" not in base \
            else float("nan")
        shown = r.get("error", f"{r['ms']:8.3f} {r['tflops']:8.1f} {ratio:9.2f}")
        lines.append(f"{r['case']:<8} {r['dtype']:<9} {r['mode']:<8} {r['impl']:<18} {shown}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=common._list(str), default=["varlen", "window", "decode"])
    p.add_argument("--caches", type=common._list(int), default=[4096, 8192, 16384, 32768])
    p.add_argument("--modes", type=common._list(str), default=["fwd", "fwd+bwd"])
    p.add_argument("--dtypes", type=common._list(common._dtype), default=[torch.bfloat16])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return 1
    meta = common.run_metadata(args.rounds)
    meta["method"] += "; TFLOP/s over visible (query, key) pairs only"
    print(f"flash-cann feature benchmark: {meta['device']}; {meta['software']}", flush=True)
    lengths = document_lengths()
    meta["varlen_lengths"] = lengths
    rows = []
    decode_rows = []
    if "decode" in args.cases:
        for heads_kv in (8, 32):
            for cache in args.caches:
                if heads_kv == 32 and cache > 8192:
                    continue
                decode_rows += measure_decode(heads_kv, cache, args.rounds)
                print("\n".join("  " + line for line in decode_table(decode_rows)[-6:]), flush=True)
    for case in [c for c in args.cases if c != "decode"]:
        shape, impls = _varlen_impls(lengths) if case == "varlen" else _window_impls()
        pairs = visible_pairs(case, lengths)
        for dtype in args.dtypes:
            for mode in args.modes:
                rounds = [[measure(case, name, make, shape, dtype, mode, pairs)
                           for name, make in impls.items()] for _ in range(args.rounds)]
                for measured in zip(*rounds):
                    row = dict(measured[0])
                    times = [r["ms"] for r in measured if "error" not in r]
                    if times:
                        row.pop("error", None)
                        row["ms"] = statistics.median(times)
                        row["tflops"] = (4 * HEADS * HEAD_DIM * pairs
                                         * common.FLOP_FACTOR[mode] / row["ms"] / 1e9)
                    rows.append(row)
                    print("  " + table([row])[1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / (f"features-{args.tag}.json" if args.tag else "features.json")
    path.write_text(json.dumps({"meta": meta, "rows": rows, "decode": decode_rows}, indent=1))
    print(f"\nwrote {path}\n{meta['device']}; {meta['software']}; {meta['date']}\n")
    print("\n".join(table(rows)))
    if decode_rows:
        print("\n".join(decode_table(decode_rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
