"""flash-cann against torch_npu's fused attention (and flash-attn-npu when installed) on an
Ascend NPU, with the schedule model's prediction beside each measurement. Never run: no
machine here has an NPU; without one it says what is missing and exits 2.

    python benchmarks/npu_attention.py [--dtypes float16,bfloat16] [--head-dims 64,128]
        [--seqlens 1024,4096,16384] [--causal both|true|false] [--out benchmarks/results]

Shapes: gpu_attention.py's (the FlashAttention-2 paper's: 16k tokens in total, hidden 2048,
so batch = 16384 / seqlen and heads = 2048 / head_dim), BSND, forward and backward, causal
and not. Implementations: flash_cann (flash_cann.flash_attn_func), npu_fusion_attention
(torch_npu.npu_fusion_attention, input_layout "BSND", sparse_mode 3 when causal, with its
compressed 2048 x 2048 mask) and flash-attn-npu (flash_attn_npu's flash_attn_func) when
importable. Timing: NPU events around `--repeats` calls after `--warmup`, median of 5.
The backward is timed as fwd+bwd minus fwd. Prediction: the planner's schedule model for the
SoC torch_npu reports (planner.plan / grad_plan "prediction"), a model, not a measurement.

Writes npu[-TAG].json (and npu[-TAG].png with matplotlib) under --out and prints the table.
Send the JSON back (an issue or a pull request adding it to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import platform
import statistics
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_attention import FLOP_FACTOR, HIDDEN, TOTAL_TOKENS, attention_flops  # noqa: E402

OURS, INCUMBENT, PEER = "flash_cann", "npu_fusion_attention", "flash-attn-npu"
MODES = ("fwd", "bwd")
NO_NPU = 2


class NoNpu(Exception):
    """What this machine lacks to run the benchmark."""


def shape(seqlen: int, head_dim: int) -> tuple[int, int]:
    """(batch, heads) of gpu_attention.py's shapes."""
    return max(1, TOTAL_TOKENS // seqlen), HIDDEN // head_dim


def require_npu():
    """torch_npu with an NPU and flash-cann's NPU backend, or NoNpu saying what is missing."""
    from flash_cann.backends.npu import launcher
    reason = launcher.unavailable_reason()
    if reason:
        raise NoNpu(reason)
    return importlib.import_module("torch_npu")


def implementations(torch_npu) -> dict:
    import torch

    import flash_cann

    def ours(q, k, v, causal):
        return flash_cann.flash_attn_func(q, k, v, causal=causal)

    mask = None

    def incumbent(q, k, v, causal):
        nonlocal mask
        if causal and mask is None:
            mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=q.device), 1)
        return torch_npu.npu_fusion_attention(
            q, k, v, q.shape[2], "BSND", atten_mask=mask if causal else None,
            scale=q.shape[-1] ** -0.5, sparse_mode=3 if causal else 0)[0]

    impls = {OURS: ours, INCUMBENT: incumbent}
    try:
        peer = importlib.import_module("flash_attn_npu")
        impls[PEER] = lambda q, k, v, causal: peer.flash_attn_func(q, k, v, causal=causal)
    except Exception:
        pass
    return impls


def _time_ms(torch, fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(5):
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / repeats)
    return statistics.median(samples)


def measure(torch, impl, dtype, head_dim, seqlen, causal, warmup, repeats) -> dict:
    batch, heads = shape(seqlen, head_dim)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, dtype=dtype, device="npu",
                           requires_grad=True) for _ in range(3))
    grad = torch.randn(batch, seqlen, heads, head_dim, dtype=dtype, device="npu")
    fwd = _time_ms(torch, lambda: impl(q, k, v, causal), warmup, repeats)
    both = _time_ms(torch, lambda: torch.autograd.grad(impl(q, k, v, causal), (q, k, v), grad),
                    warmup, repeats)
    return {"fwd": fwd, "bwd": max(both - fwd, 0.0)}


def predicted_ms(soc: str, dtype: str, head_dim: int, seqlen: int, causal: bool, mode: str):
    from flash_cann.ascend import planner
    batch, heads = shape(seqlen, head_dim)
    plan = (planner.plan if mode == "fwd" else planner.grad_plan)(
        soc, batch, heads, seqlen, head_dim, dtype=dtype, layout="BSND", causal=causal)
    return 1e3 * plan["prediction"]["seconds"]


def row(impl, soc, dtype, head_dim, seqlen, causal, mode, ms, predicted) -> dict:
    batch, heads = shape(seqlen, head_dim)
    flops = attention_flops(batch, heads, seqlen, head_dim, causal, mode) if mode in FLOP_FACTOR \
        else None
    return {"impl": impl, "soc": soc, "dtype": dtype, "head_dim": head_dim, "seqlen": seqlen,
            "batch": batch, "heads": heads, "causal": causal, "mode": mode, "ms": ms,
            "tflops": flops / ms / 1e9 if ms else None,
            "predicted_ms": predicted if impl == OURS else None}


def table(rows: list[dict]) -> str:
    lines = [f"{'impl':<22}{'dtype':<10}{'d':>4}{'seqlen':>8}{'causal':>7}{'mode':>5}"
             f"{'ms':>10}{'TFLOP/s':>9}{'model ms':>10}"]
    for r in rows:
        model = "" if r["predicted_ms"] is None else f"{r['predicted_ms']:.3f}"
        rate = "" if r["tflops"] is None else f"{r['tflops']:.1f}"
        lines.append(f"{r['impl']:<22}{r['dtype']:<10}{r['head_dim']:>4}{r['seqlen']:>8}"
                     f"{str(r['causal']):>7}{r['mode']:>5}{r['ms']:>10.3f}{rate:>9}{model:>10}")
    return "\n".join(lines)


def write(rows: list[dict], out: Path, tag: str, environment: dict) -> list[Path]:
    """npu[-TAG].json, and npu[-TAG].png when matplotlib imports; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"npu-{tag}" if tag else "npu"
    written = [out / f"{stem}.json"]
    written[0].write_text(json.dumps({"environment": environment, "rows": rows}, indent=1) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"npu_attention: matplotlib is not installed, so no {stem}.png was drawn; "
              f"{written[0]} has every result (send it back; pip install matplotlib for the "
              "plot)", file=sys.stderr)
        return written
    panels = sorted({(r["mode"], r["causal"], r["head_dim"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(len(panels), 1, squeeze=False, figsize=(7, 3 * len(panels)))
    for ax, (mode, causal, head_dim, dtype) in zip(axes[:, 0], panels):
        for impl in sorted({r["impl"] for r in rows}):
            pts = sorted((r for r in rows if (r["impl"], r["mode"], r["causal"], r["head_dim"],
                                              r["dtype"]) == (impl, mode, causal, head_dim, dtype)),
                         key=lambda r: r["seqlen"])  # a line left to right, whatever --seqlens' order
            ax.plot([r["seqlen"] for r in pts], [r["tflops"] for r in pts], "o-", label=impl)
        ax.set(title=f"{mode} {dtype} d{head_dim} {'causal' if causal else 'non-causal'}",
               xscale="log", xlabel="seqlen", ylabel="TFLOP/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png")
    written.append(out / f"{stem}.png")
    return written


def _list(kind):
    return lambda text: [kind(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", type=_list(str), default=["float16", "bfloat16"])
    p.add_argument("--head-dims", type=_list(int), default=[64, 128])
    p.add_argument("--seqlens", type=_list(int), default=[1024, 4096, 16384])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    try:
        torch_npu = require_npu()
    except NoNpu as missing:
        print(f"npu_attention: needs an Ascend NPU with flash-cann's NPU backend: {missing}",
              file=sys.stderr)
        return NO_NPU
    import torch
    soc = str(torch_npu.npu.get_device_name(0))
    causals = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    rows = []
    for (name, impl), dtype, head_dim, seqlen, causal in itertools.product(
            implementations(torch_npu).items(), args.dtypes, args.head_dims, args.seqlens,
            causals):
        times = measure(torch, impl, getattr(torch, dtype), head_dim, seqlen, causal,
                        args.warmup, args.repeats)
        for mode in MODES:
            rows.append(row(name, soc, dtype, head_dim, seqlen, causal, mode, times[mode],
                            predicted_ms(soc, dtype, head_dim, seqlen, causal, mode)))
    environment = {"soc": soc, "torch": torch.__version__, "torch_npu": torch_npu.__version__,
                   "date": str(date.today()), "host": platform.node(),
                   "method": f"NPU events, median of 5 x {args.repeats} calls after "
                             f"{args.warmup}; bwd = fwd+bwd - fwd"}
    print(table(rows))
    for path in write(rows, args.out, args.tag, environment):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
