"""GPU benchmark: flash-cann's Triton backend against PyTorch's attention on the same GPU,
in one run.

    python benchmarks/gpu_attention.py [--quick] [--dtypes bfloat16,float16]
        [--head-dims 64,128] [--seqlens 1024,4096,16384] [--causal both|true|false]
        [--modes fwd,bwd,fwd+bwd] [--impls flash_cann,sdpa-flash,...]
        [--rounds N] [--memory-seqlens 32768,65536,131072] [--out DIR] [--tag NAME]
    python benchmarks/gpu_attention.py --merge A.json B.json [--out DIR] [--tag NAME]

Speed: the FlashAttention-2 paper's shapes, 16k tokens in total and hidden 2048
(batch = 16384 // seqlen, heads = 2048 // head_dim), layout (batch, heads, seqlen,
head_dim), inputs random normal. Median of triton.testing.do_bench (warm-up 25 ms,
repetitions 100 ms, L2 flushed between calls), the same for every implementation in
the run, so the numbers compare. Modes: fwd; bwd = the backward
alone (out.backward(g, retain_graph=True)); fwd+bwd = both in one
call. TFLOP/s: fwd = 4 * batch * heads * seqlen^2 * head_dim, halved for causal;
bwd = 2.5 x fwd; fwd+bwd = 3.5 x fwd. Ratios are the peer's time over flash_cann's
(> 1: flash_cann is faster).
Memory: peak extra CUDA memory of forward + backward (batch 1, 16 heads, head_dim 128,
bf16, causal) for flash_cann and the materialising path (flash_cann.contract.reference), which
is expected to run out of memory.

Host: each implementation's host time per call (fwd, fwd+bwd) on a tiny problem whose
GPU work never makes the host wait (--no-host skips it).

Writes gpu[-TAG].json (and gpu[-TAG].png with matplotlib) under --out; prints the
table last, then the table of benchmarks/RESULTS.md (bf16, head_dim 128) in Markdown. --merge combines JSON files of several runs (no GPU needed).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flash_cann  # noqa: E402
from flash_cann.tools import memory  # noqa: E402
from flash_cann.contract import reference  # noqa: E402

TOTAL_TOKENS = 16384
HIDDEN = 2048
MEMORY_HEADS, MEMORY_HEAD_DIM = 16, 128
# Memory runs first run flash_cann once at this seqlen, so that its tuning (keyed on
# seqlen buckets capped at 16k) is done before the measured run.
MEMORY_WARMUP_SEQLEN = 16384
DO_BENCH = dict(warmup=25, rep=100, return_mode="median")
METHOD = ("triton.testing.do_bench median (warmup 25 ms, rep 100 ms); fwd FLOPs = "
          "4*B*H*N*N*D (halved for causal), bwd = 2.5x, fwd+bwd = 3.5x; inputs random normal, "
          "layout (B,H,N,D); batch = max(1, 16384//N), heads = 2048//D; bwd = out.backward(g, "
          "retain_graph=True) alone, fwd+bwd = one call of both")
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
_MODE_ORDER = {mode: i for i, mode in enumerate(FLOP_FACTOR)}
PEERS = ["sdpa-flash", "sdpa-cudnn", "sdpa-effic", "flex"]
OURS = "flash_cann"
# flash_cann with pointer loads only (no tensor descriptors): the TMA step in NOTES.md.
OURS_POINTERS = "flash_cann-pointers"
# flash_cann without the Hopper forward (FLASH_CANN_SM90=0: kernels/forward.py on sm90):
# issue 28's A/B.
OURS_FA2 = "flash_cann-fa2"
# flash_cann with deterministic=True (on sm90, the Hopper backward's ordered dQ adds).
OURS_DETERMINISTIC = "flash_cann-det"
IMPLS = [OURS, OURS_DETERMINISTIC, OURS_POINTERS, OURS_FA2, *PEERS]
DEFAULT_IMPLS = [OURS, *PEERS]
# Issue 13's targets: (mode, ours, peer, minimum peer time / ours, seqlens), each over
# bf16 and fp16, head_dim 64 and 128, causal and not (flash_cann's default backward:
# deterministic on the FA2 kernels, not on sm90's Hopper kernel, as SDPA's and Flex's).
TARGETS = [("fwd", OURS, "sdpa-cudnn", 0.95, (4096, 16384)),
           ("fwd", OURS, "flex", 1.0, (4096, 16384)),
           ("bwd", OURS, "sdpa-cudnn", 0.9, (4096, 16384)),
           ("bwd", OURS, "flex", 1.0, (4096, 16384)),
           ("fwd", OURS, "sdpa-flash", 1.0, (1024,)), ("fwd", OURS, "sdpa-cudnn", 0.8, (1024,)),
           ("bwd", OURS, "sdpa-flash", 1.0, (1024,)), ("bwd", OURS, "sdpa-cudnn", 0.8, (1024,))]
TARGET_GRID = (("bfloat16", "float16"), (64, 128), (False, True))


def attention_flops(batch, heads, seqlen, head_dim, causal, mode):
    flops = 4 * batch * heads * seqlen * seqlen * head_dim * FLOP_FACTOR[mode]
    return flops / 2 if causal else flops


# ---------------------------------------------------------------------------------------
# The implementations: fn(q, k, v) -> out, (batch, heads, seqlen, head_dim)
# ---------------------------------------------------------------------------------------

def _flash_cann(causal, seqlen):
    return lambda q, k, v: flash_cann.attention(q, k, v, causal=causal)


def _flash_cann_deterministic(causal, seqlen):
    return lambda q, k, v: flash_cann.attention(q, k, v, causal=causal, deterministic=True)


def _sdpa(backend_name):
    def make(causal, seqlen):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, backend_name)

        def fn(q, k, v):
            with sdpa_kernel(backend):  # backward follows the forward's kernel
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn
    return make


_flex_compiled = None


def _flex(causal, seqlen):
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex_compiled is None:
        import torch._dynamo
        import torch._functorch.config
        torch._dynamo.config.cache_size_limit = 256  # one graph per shape, as the anchors
        # The bwd mode calls backward with retain_graph=True, which a compiled backward
        # that donates its saved buffers refuses (it did on the H100, not on the H200).
        torch._functorch.config.donated_buffer = False
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = (create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None,
                                    seqlen, seqlen) if causal else None)
    return lambda q, k, v: _flex_compiled(q, k, v, block_mask=block_mask)


MAKERS = {OURS: _flash_cann, OURS_DETERMINISTIC: _flash_cann_deterministic,
          OURS_POINTERS: _flash_cann, OURS_FA2: _flash_cann,
          "sdpa-flash": _sdpa("FLASH_ATTENTION"), "sdpa-cudnn": _sdpa("CUDNN_ATTENTION"),
          "sdpa-effic": _sdpa("EFFICIENT_ATTENTION"), "flex": _flex}
# Environment each implementation is measured under (its backward included).
ENVIRONMENTS = {OURS_POINTERS: {"FLASH_CANN_TRITON_TMA": "0"}, OURS_FA2: {"FLASH_CANN_SM90": "0"}}


@contextlib.contextmanager
def _environment(values):
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------

def _time_ms(fn, q, k, v, mode):
    from triton.testing import do_bench

    if mode == "fwd":
        return do_bench(lambda: fn(q, k, v), **DO_BENCH)
    if mode == "bwd":
        out = fn(q, k, v)
        grad = torch.randn_like(out)
        return do_bench(lambda: out.backward(grad, retain_graph=True), grad_to_none=[q, k, v],
                        **DO_BENCH)
    grad = torch.randn_like(q)
    return do_bench(lambda: fn(q, k, v).backward(grad), grad_to_none=[q, k, v], **DO_BENCH)


def measure_speed(impl, dtype, head_dim, seqlen, causal, mode):
    batch, heads = max(1, TOTAL_TOKENS // seqlen), HIDDEN // head_dim  # 32k: one sequence
    row = dict(impl=impl, dtype=str(dtype).removeprefix("torch."), head_dim=head_dim,
               seqlen=seqlen, batch=batch, heads=heads, causal=causal, mode=mode,
               ms=float("nan"), tflops=float("nan"))
    try:
        with _environment(ENVIRONMENTS.get(impl, {})):
            fn = MAKERS[impl](causal, seqlen)
            q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=dtype,
                                   requires_grad=True) for _ in range(3))
            row["ms"] = _time_ms(fn, q, k, v, mode)
        row["tflops"] = attention_flops(batch, heads, seqlen, head_dim, causal, mode) \
            / row["ms"] / 1e9
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
    except Exception as e:  # a peer that cannot run this shape: recorded, not fatal
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    torch.cuda.empty_cache()
    return row


HOST_SHAPE = (1, 2, 128, 64)  # (B, H, N, D), bf16: kernels far shorter than a host call
HOST_CALLS = 300
HOST_REPEATS = 7
HOST_MODES = ("fwd", "fwd+bwd")


def host_us_per_call(fn, mode, calls=HOST_CALLS):
    """Host time of one call on a tiny causal problem whose GPU work never makes the host
    wait (per_call_us)."""
    q, k, v = (torch.randn(HOST_SHAPE, device="cuda", dtype=torch.bfloat16,
                           requires_grad=mode != "fwd") for _ in range(3))
    if mode == "fwd":
        def call():
            fn(q, k, v)
    else:
        grad = torch.randn_like(q)

        def call():
            fn(q, k, v).backward(grad)
    return per_call_us(call, calls)


def per_call_us(call, calls=HOST_CALLS, repeats=HOST_REPEATS) -> float:
    """Host time of one ``call()``: the median over ``repeats`` timings (perf_counter_ns)
    of ``calls`` calls each, after a warm-up that compiles and plans. The median, because
    the lent machine's host is noisy (one stage moved 22 -> 34 us between runs)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(50):
        call()
    sync()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        timings.append((time.perf_counter_ns() - start) / calls / 1e3)
        sync()
    return statistics.median(timings)


def measure_host(impls):
    rows = []
    for impl in sorted(impls, key=lambda i: i == "flex"):  # Flex compiles: last
        for mode in HOST_MODES:
            row = dict(impl=impl, mode=mode, shape=list(HOST_SHAPE), causal=True)
            try:
                with _environment(ENVIRONMENTS.get(impl, {})):
                    row["host_us"] = host_us_per_call(MAKERS[impl](True, HOST_SHAPE[2]), mode)
            except Exception as e:  # recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
    return rows


def median_of_rounds(rows):
    """One measurement from its rounds: the median time. Rounds interleave the
    implementations, so a drift of the GPU's clocks during a run reaches all of them."""
    row = dict(rows[0])
    times = [r["ms"] for r in rows if "error" not in r]
    if times:
        row.pop("error", None)
        row["ms"] = statistics.median(times)
        row["ms_rounds"] = [r["ms"] for r in rows]
        row["tflops"] = attention_flops(row["batch"], row["heads"], row["seqlen"],
                                        row["head_dim"], row["causal"], row["mode"]) \
            / row["ms"] / 1e9
    return row


def memory_inputs(seqlen):
    return tuple(torch.randn(1, MEMORY_HEADS, seqlen, MEMORY_HEAD_DIM, device="cuda",
                             dtype=torch.bfloat16, requires_grad=True) for _ in range(3))


def flash_fwd_bwd(q, k, v):
    flash_cann.attention(q, k, v, causal=True).sum().backward()


def materialising_fwd_bwd(q, k, v):
    reference.attention(q, k, v, scale=1 / math.sqrt(q.shape[-1]), causal=True,
                        compute_dtype=q.dtype)[0].sum().backward()


def measure_memory(seqlens):
    device = torch.device("cuda")
    rows = []
    for impl, fn, warmup in (("flash_cann", flash_fwd_bwd, MEMORY_WARMUP_SEQLEN),
                             ("materialising", materialising_fwd_bwd, 1024)):
        for seqlen in seqlens:
            row = dict(impl=impl, seqlen=seqlen, batch=1, heads=MEMORY_HEADS,
                       head_dim=MEMORY_HEAD_DIM, dtype="bfloat16", causal=True,
                       peak_extra_bytes=None)
            try:
                row["peak_extra_bytes"] = memory.peak_extra_bytes(
                    device, memory_inputs, fn, (seqlen,), warmup_args=(warmup,))
            except torch.OutOfMemoryError:
                row["error"] = "OOM"
            torch.cuda.empty_cache()
            rows.append(row)
            print(f"  memory  {impl:<14} seqlen {seqlen:>6}: {_mib(row)}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------
# Report: tables, targets, plot
# ---------------------------------------------------------------------------------------

def _mib(row):
    return row.get("error") or f"{row['peak_extra_bytes'] / 2**20:,.0f} MiB"


def _key(row):
    return (row["dtype"], row["head_dim"], row["seqlen"], row["causal"], row["mode"])


def _by_config(rows):
    configs = {}
    for row in rows:
        configs.setdefault(_key(row), {})[row["impl"]] = row
    return configs


def ratio(rows_by_impl, peer, ours=OURS):
    """peer time / flash_cann time (> 1: flash_cann faster); None if either is missing."""
    ours, other = rows_by_impl.get(ours), rows_by_impl.get(peer)
    if not ours or not other or not (ours["ms"] > 0 and other["ms"] > 0):
        return None
    return other["ms"] / ours["ms"]


SHORT = {OURS: "flash_cann", OURS_DETERMINISTIC: "determin.", OURS_POINTERS: "pointers",
         OURS_FA2: "fa2-kernel", "sdpa-flash": "FLASH",
         "sdpa-cudnn": "CUDNN", "sdpa-effic": "EFFICIENT", "flex": "flex"}


def speed_table(rows):
    configs = _by_config(rows)
    impls = [i for i in IMPLS if any(i in c for c in configs.values())]
    peers = [p for p in impls if p != OURS]
    lines = ["TFLOP/s (FLASH, CUDNN, EFFICIENT: SDPA backends; pointers: flash_cann without "
             "tensor descriptors); x PEER = PEER's time / flash_cann's",
             f"{'dtype':<9}{'d':>4}{'seqlen':>7} {'causal':<7}{'mode':<8}"
             + "".join(f"{SHORT[i]:>11}" for i in impls)
             + "  " + "".join(f"{'x' + SHORT[p]:>11}" for p in peers)]
    for key in sorted(configs, key=lambda k: (k[0], k[1], _MODE_ORDER[k[4]], k[3], k[2])):
        dtype, head_dim, seqlen, causal, mode = key
        cells = []
        for impl in impls:
            row = configs[key].get(impl)
            text = "-" if row is None else row.get("error", f"{row['tflops']:.1f}")[:10]
            cells.append(f"{text:>11}")
        cells.append("  ")
        for peer in peers:
            r = ratio(configs[key], peer)
            cells.append(f"{r:>11.2f}" if r is not None else f"{'-':>11}")
        lines.append(f"{dtype:<9}{head_dim:>4}{seqlen:>7} {str(causal):<7}{mode:<8}"
                     + "".join(cells))
    return lines


def target_lines(rows):
    """Each target: how many of its configurations met it, and the worst ratio."""
    configs = _by_config(rows)
    dtypes, head_dims, causals = TARGET_GRID
    lines = ["targets (bf16/fp16, head_dim 64/128, causal and not): peer time / ours"]
    for mode, ours, peer, minimum, seqlens in TARGETS:
        found = []
        for dtype, head_dim, seqlen, causal in itertools.product(dtypes, head_dims, seqlens,
                                                                  causals):
            r = ratio(configs.get((dtype, head_dim, seqlen, causal, mode), {}), peer, ours)
            if r is not None:
                found.append((r, f"{dtype} d{head_dim} {seqlen // 1024}k"
                                 f"{' causal' if causal else ''}"))
        name = f"{mode} {SHORT[ours]} vs {SHORT[peer]} >= {minimum:.2f} at " \
               f"{'/'.join(f'{n // 1024}k' for n in seqlens)}"
        if not found:
            lines.append(f"  {name}: not measured")
            continue
        met = sum(r >= minimum for r, _ in found)
        worst, where = min(found)
        verdict = "MET" if met == len(found) else "MISSED"
        lines.append(f"  {name}: {verdict} (met in {met}/{len(found)}); worst {worst:.2f} ({where}),"
                     f" best {max(found)[0]:.2f}")
    return lines


def memory_lines(rows):
    if not rows:
        return []
    lines = [f"peak extra memory, forward + backward (batch 1, {MEMORY_HEADS} heads, head_dim "
             f"{MEMORY_HEAD_DIM}, bf16, causal)", f"{'seqlen':>8}{'flash_cann':>14}"
             f"{'materialising':>16}"]
    by = {(r["impl"], r["seqlen"]): r for r in rows}
    for seqlen in sorted({r["seqlen"] for r in rows}):
        cells = [_mib(by[(impl, seqlen)]) if (impl, seqlen) in by else "-"
                 for impl in ("flash_cann", "materialising")]
        lines.append(f"{seqlen:>8}{cells[0]:>14}{cells[1]:>16}")
    return lines


def host_lines(rows):
    if not rows:
        return []
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    by = {(r["impl"], r["mode"]): r for r in rows}
    lines = [f"host time per call, us (batch {HOST_SHAPE[0]}, {HOST_SHAPE[1]} heads, seqlen "
             f"{HOST_SHAPE[2]}, head_dim {HOST_SHAPE[3]}, bf16, causal; GPU idle)",
             f"{'mode':<8}" + "".join(f"{SHORT[i]:>11}" for i in impls)]
    for mode in HOST_MODES:
        cells = []
        for impl in impls:
            row = by.get((impl, mode))
            text = "-" if row is None else (f"{row['host_us']:.1f}" if "host_us" in row
                                            else "error")
            cells.append(f"{text:>11}")
        lines.append(f"{mode:<8}" + "".join(cells))
    return lines


def markdown_table(rows, dtype="bfloat16", head_dim=128):
    """The GPU table of benchmarks/RESULTS.md: one dtype and head_dim, every seqlen, causal, mode."""
    configs = _by_config(rows)
    impls = [i for i in IMPLS if any(i in c for c in configs.values())]
    peers = [p for p in impls if p != OURS]
    names = {OURS: "flash_cann", OURS_DETERMINISTIC: "flash_cann deterministic",
             OURS_POINTERS: "pointers", OURS_FA2: "flash_cann FA2 kernel", "sdpa-flash": "SDPA FLASH",
             "sdpa-cudnn": "SDPA cuDNN", "sdpa-effic": "SDPA EFFICIENT", "flex": "FlexAttention"}
    lines = ["| mode | seqlen | causal | " + " | ".join(names[i] for i in impls) + " | "
             + " | ".join(f"x {SHORT[p]}" for p in peers) + " |",
             "|---|---:|---|" + "---:|" * (len(impls) + len(peers))]
    for key in sorted(configs, key=lambda k: (_MODE_ORDER[k[4]], k[2], k[3])):
        if key[:2] != (dtype, head_dim):
            continue
        _, _, seqlen, causal, mode = key
        cells = []
        for impl in impls:
            row = configs[key].get(impl)
            cells.append("-" if row is None else row.get("error", f"{row['tflops']:.1f}")[:12])
        for peer in peers:
            r = ratio(configs[key], peer)
            cells.append("-" if r is None else f"{r:.2f}")
        lines.append(f"| {mode} | {seqlen // 1024}k | {'yes' if causal else 'no'} | "
                     + " | ".join(cells) + " |")
    return lines


def plot(rows, path):
    """Bars of TFLOP/s per implementation: one panel per (dtype, mode) x head_dim."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot; run --merge on the JSON where it is)")
        return None
    panels = sorted({(r["dtype"], r["mode"]) for r in rows},
                    key=lambda p: (p[0], _MODE_ORDER[p[1]]))
    head_dims = sorted({r["head_dim"] for r in rows})
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    fig, axes = plt.subplots(len(panels), len(head_dims), squeeze=False,
                             figsize=(6 * len(head_dims), 3.2 * len(panels)))
    width = 0.8 / len(impls)
    for (row_i, (dtype, mode)), (col_i, head_dim) in (
            (p, c) for p in enumerate(panels) for c in enumerate(head_dims)):
        ax = axes[row_i][col_i]
        chosen = [r for r in rows if (r["dtype"], r["mode"], r["head_dim"]) ==
                  (dtype, mode, head_dim)]
        xs = sorted({(r["seqlen"], r["causal"]) for r in chosen})
        for impl_i, impl in enumerate(impls):
            values = {(r["seqlen"], r["causal"]): r["tflops"] for r in chosen
                      if r["impl"] == impl}
            ax.bar([x + impl_i * width for x in range(len(xs))],
                   [values.get(x, float("nan")) for x in xs], width, label=impl)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(xs))])
        ax.set_xticklabels([f"{s // 1024}k{' causal' if c else ''}" for s, c in xs],
                           fontsize=8)
        ax.set_title(f"{dtype} {mode} head_dim {head_dim}", fontsize=9)
        ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def report(result, out_dir, tag):
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"gpu-{tag}" if tag else "gpu"
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(result, indent=1))
    png = plot(result["speed"], out_dir / f"{name}.png") if result["speed"] else None
    print(f"\nwrote {json_path}" + (f" and {png}" if png else ""))
    meta = result["meta"]
    print(f"\n{meta.get('device')}; {meta.get('software')}; {meta.get('date')}")
    for line in (memory_lines(result["memory"]) + [""] + host_lines(result.get("host", []))
                 + [""] + target_lines(result["speed"])):
        print(line)
    print()
    for line in speed_table(result["speed"]):
        print(line)
    if result["speed"]:
        print("\nRESULTS.md table (bf16, head_dim 128):")
        for line in markdown_table(result["speed"]):
            print(line)


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------

def _list(cast):
    return lambda text: [cast(x) for x in text.split(",") if x]


def _dtype(name):
    return {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
            "fp16": torch.float16}[name]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="bf16, head_dim 128, seqlen 4k and 16k, fwd and fwd+bwd, memory at "
                        "32k (the issue's target configs; a few minutes)")
    p.add_argument("--dtypes", type=_list(_dtype), default=[torch.bfloat16, torch.float16])
    p.add_argument("--head-dims", type=_list(int), default=[64, 128])
    p.add_argument("--seqlens", type=_list(int), default=[1024, 4096, 16384])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--modes", type=_list(str), default=["fwd", "bwd", "fwd+bwd"])
    p.add_argument("--impls", type=_list(str), default=DEFAULT_IMPLS,
                   help=f"any of {', '.join(IMPLS)}")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every shape this many times, the implementations "
                        "interleaved, and keep the median")
    p.add_argument("--memory-seqlens", type=_list(int), default=[32768, 65536, 131072],
                   help="empty to skip the memory part")
    p.add_argument("--host", action=argparse.BooleanOptionalAction, default=True,
                   help="measure each implementation's host time per call (default: on)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--tag", default="", help="results file name: gpu-TAG.json")
    p.add_argument("--merge", nargs="+", type=Path, help="combine these result files")
    args = p.parse_args(argv)
    if args.quick:
        args.dtypes, args.head_dims, args.seqlens = [torch.bfloat16], [128], [4096, 16384]
        args.modes, args.memory_seqlens = ["fwd", "fwd+bwd"], [32768]
    unknown = set(args.impls) - set(IMPLS) | set(args.modes) - set(FLOP_FACTOR)
    if unknown:
        p.error(f"unknown implementation(s) or mode(s): {sorted(unknown)}")
    return args


def merge(paths):
    """Later files win where two measured the same thing. Files from different devices
    or software are refused: their rows would share one table under one heading."""
    results = [json.loads(p.read_text()) for p in paths]
    setups = {(r["meta"]["device"], r["meta"]["software"]) for r in results}
    if len(setups) > 1:
        raise SystemExit(f"--merge: the files come from different setups: {sorted(setups)}")
    speed = {}
    memory_rows = {}
    host_rows = {}
    for result in results:
        speed.update({(_key(r), r["impl"]): r for r in result["speed"]})
        memory_rows.update({(r["impl"], r["seqlen"]): r for r in result["memory"]})
        host_rows.update({(r["impl"], r["mode"]): r for r in result.get("host", [])})
    meta = dict(results[0]["meta"], merged_from=[
        {"file": p.name, "date": r["meta"]["date"], "method": r["meta"]["method"]}
        for p, r in zip(paths, results)])
    return {"meta": meta, "speed": list(speed.values()), "memory": list(memory_rows.values()),
            "host": list(host_rows.values())}


def run_metadata(rounds: int) -> dict:
    """Date, device, software and method of a run on the current GPU."""
    import triton
    props = torch.cuda.get_device_properties(0)
    return {"date": date.today().isoformat(),
            "device": f"{props.name} (sm_{props.major}{props.minor}, "
                      f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)",
            "software": f"torch {torch.__version__}, triton {triton.__version__}, "
                        f"CUDA {torch.version.cuda}, Python {platform.python_version()}",
            "flash_cann": flash_cann.__version__,
            "FLASH_CANN_TRITON_TMA": os.environ.get("FLASH_CANN_TRITON_TMA", "auto"),
            "method": METHOD + (f"; median of {rounds} interleaved rounds" if rounds > 1 else "")}


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        report(merge(args.merge), args.out, args.tag or "merged")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure (--merge works without one)")
        return 1
    meta = run_metadata(args.rounds)
    print(f"flash-cann GPU benchmark: {meta['device']}; {meta['software']}", flush=True)
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    # Host times first: after the speed grid, torch.compile's worker processes (Flex)
    # share the CPU and every host time reads 2-3x higher.
    host_rows = measure_host(args.impls) if args.host else []
    speed_rows = []
    for dtype in args.dtypes:
        for head_dim in args.head_dims:
            for seqlen in args.seqlens:
                for causal in causals:
                    rounds = [[measure_speed(impl, dtype, head_dim, seqlen, causal, mode)
                               for impl in args.impls for mode in args.modes]
                              for _ in range(args.rounds)]
                    for row in map(median_of_rounds, zip(*rounds)):
                        speed_rows.append(row)
                        shown = row.get("error") or (f"{row['tflops']:7.1f} TFLOP/s "
                                                     f"({row['ms']:.3f} ms)")
                        print(f"  {row['dtype']:<9} d{head_dim:<4} n{seqlen:<6} "
                              f"causal={causal!s:<5} {row['impl']:<20} {row['mode']:<8} "
                              f"{shown}", flush=True)
    memory_rows = measure_memory(args.memory_seqlens) if args.memory_seqlens else []
    report({"meta": meta, "speed": speed_rows, "memory": memory_rows, "host": host_rows},
           args.out, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
