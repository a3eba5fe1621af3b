"""CPU benchmark: peak memory as seqlen doubles (O(N) vs O(N^2)), and speed against
PyTorch's fused CPU attention (scaled_dot_product_attention).

    python benchmarks/cpu_memory.py [--out benchmarks/results/cpu.json] [--quick]

Part 1, memory: peak extra resident memory of forward + backward, each measurement in a
fresh process (flash_cann.tools.memory), flash_cann vs the materialising path, seqlen 1k..16k,
batch 1, 1 head, head_dim 64, float32, causal.
Part 2, speed: median wall time of forward and forward + backward at seqlen 4096,
batch 1, 8 heads, head_dim 64, float32 and bfloat16, causal and not, flash_cann vs
F.scaled_dot_product_attention on the CPU; the ratio is flash_cann's time over SDPA's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flash_cann  # noqa: E402
from flash_cann.tools import memory  # noqa: E402
from flash_cann.contract import reference  # noqa: E402
from flash_cann.tools.timing import median_seconds  # noqa: E402


def make_inputs(batch, heads, seqlen, head_dim, dtype, requires_grad):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(batch, heads, seqlen, head_dim, generator=gen, dtype=dtype)
                 .requires_grad_(requires_grad) for _ in range(3))


def memory_inputs(seqlen):
    return make_inputs(1, 1, seqlen, 64, torch.float32, True)


def flash_fwd(q, k, v, causal=True):
    return flash_cann.attention(q, k, v, causal=causal)


def materialising_fwd(q, k, v, causal=True):
    return reference.attention(q, k, v, scale=1 / math.sqrt(q.shape[-1]), causal=causal,
                               compute_dtype=q.dtype)[0]


def sdpa_fwd(q, k, v, causal=True):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


IMPLS = {"flash_cann": flash_fwd, "materialising": materialising_fwd, "sdpa": sdpa_fwd}


def flash_fwd_bwd(q, k, v):
    flash_fwd(q, k, v).sum().backward()


def materialising_fwd_bwd(q, k, v):
    materialising_fwd(q, k, v).sum().backward()


def memory_table(seqlens):
    rows = []
    for seqlen in seqlens:
        for name, fn in (("flash_cann", flash_fwd_bwd), ("materialising", materialising_fwd_bwd)):
            peak = memory.peak_extra_bytes(torch.device("cpu"), memory_inputs, fn, (seqlen,),
                                          warmup_args=(256,))
            rows.append({"impl": name, "seqlen": seqlen, "peak_extra_bytes": peak})
            print(f"  memory  {name:<14} seqlen {seqlen:>6}: {peak / 2**20:10.1f} MiB",
                  flush=True)
    return rows


def speed_table(seqlen, repeats):
    rows = []
    cpu = torch.device("cpu")
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                times = {}
                for name in ("flash_cann", "sdpa"):
                    fn = IMPLS[name]
                    q, k, v = make_inputs(1, 8, seqlen, 64, dtype, mode == "fwd+bwd")
                    if mode == "fwd":
                        def run(q, k, v, fn=fn):
                            with torch.no_grad():
                                fn(q, k, v, causal)
                    else:
                        def run(q, k, v, fn=fn):
                            fn(q, k, v, causal).sum().backward()
                    times[name] = median_seconds(run, q, k, v, device=cpu, repeats=repeats)
                row = {"dtype": str(dtype).removeprefix("torch."), "causal": causal,
                       "mode": mode, "seqlen": seqlen, "batch": 1, "heads": 8, "head_dim": 64,
                       "flash_cann_s": times["flash_cann"], "sdpa_s": times["sdpa"],
                       "ratio_flash_over_sdpa": times["flash_cann"] / times["sdpa"]}
                rows.append(row)
                print(f"  speed   {row['dtype']:<8} causal={causal!s:<5} {mode:<8} "
                      f"flash_cann {times['flash_cann']:.3f}s  sdpa {times['sdpa']:.3f}s  "
                      f"ratio {row['ratio_flash_over_sdpa']:.2f}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu.json"))
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = parser.parse_args()
    seqlens = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192, 16384]
    speed_seqlen, repeats = (1024, 1) if args.quick else (4096, 5)
    meta = {"date": date.today().isoformat(), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "flash_cann": flash_cann.__version__,
            "method": "memory: peak extra RSS of fwd+bwd in a fresh process; speed: median "
                      f"of {repeats} after a warm-up"}
    print(f"flash-cann CPU benchmark, torch {meta['torch']}, {meta['cores']} cores")
    memory_rows = memory_table(seqlens)
    speed_rows = speed_table(speed_seqlen, repeats)

    print("\npeak extra memory, forward + backward (batch 1, 1 head, head_dim 64, float32, "
          "causal)")
    print(f"{'seqlen':>8} {'flash_cann MiB':>15} {'growth':>7} {'materialising MiB':>18} "
          f"{'growth':>7}")
    prev = {}
    for seqlen in seqlens:
        cells = []
        for name in ("flash_cann", "materialising"):
            peak = next(r["peak_extra_bytes"] for r in memory_rows
                        if r["impl"] == name and r["seqlen"] == seqlen)
            growth = f"{peak / prev[name]:.1f}x" if name in prev else ""
            prev[name] = peak
            cells.append(f"{peak / 2**20:>15.1f} {growth:>7}" if name == "flash_cann"
                         else f"{peak / 2**20:>18.1f} {growth:>7}")
        print(f"{seqlen:>8} " + " ".join(cells))
    print(f"\nspeed at seqlen {speed_seqlen} (batch 1, 8 heads, head_dim 64), median seconds; "
          f"ratio = flash_cann / sdpa (target <= 2)")
    print(f"{'dtype':<9} {'causal':<7} {'mode':<8} {'flash_cann':>10} {'sdpa':>8} {'ratio':>6}")
    for r in speed_rows:
        print(f"{r['dtype']:<9} {r['causal']!s:<7} {r['mode']:<8} {r['flash_cann_s']:>10.3f} "
              f"{r['sdpa_s']:>8.3f} {r['ratio_flash_over_sdpa']:>6.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "memory": memory_rows, "speed": speed_rows},
                              indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
