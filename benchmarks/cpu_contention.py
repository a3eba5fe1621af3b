"""The CPU backend beside a busy process: forward + backward of flash_cann and of torch's
scaled_dot_product_attention (causal, float32, batch 1, 8 heads, head_dim 64), each in a
fresh process, alone and next to a process that keeps one core busy, for both import
orders: flash_cann first (it asks OpenMP to wait passively before torch loads) and
torch first (OpenMP's default, spinning, wait policy).

    python benchmarks/cpu_contention.py [--seqlen 4096] [--repeats 3] [--json PATH]

Prints the median seconds and flash_cann's time as a multiple of SDPA's in the same
conditions; --json writes them (default: benchmarks/results/cpu_contention.json). On a
machine other processes load too, run it a few times."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
from pathlib import Path

MEASURE = """
import sys, time
kernel, order, n, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if order == "torch-first":
    import torch
import flash_cann, torch
import torch.nn.functional as F
q, k, v = (torch.randn(1, 8, n, 64, requires_grad=True) for _ in range(3))
if kernel == "flash_cann":
    run = lambda: flash_cann.attention(q, k, v, causal=True).sum().backward()
else:
    run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
run()
times = []
for _ in range(repeats):
    start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2])
"""

ORDERS = ("flash_cann-first", "torch-first")
KERNELS = ("flash_cann", "sdpa")


def _busy() -> None:
    while True:
        pass


def measure(kernel: str, order: str, seqlen: int, repeats: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    result = subprocess.run([sys.executable, "-c", MEASURE, kernel, order, str(seqlen),
                             str(repeats)], capture_output=True, text=True, env=env, check=True)
    return float(result.stdout.split()[-1])


def _measure_all(seqlen: int, repeats: int, contended: bool) -> dict:
    busy = None
    if contended:
        busy = multiprocessing.Process(target=_busy, daemon=True)
        busy.start()
    try:
        return {order: {kernel: measure(kernel, order, seqlen, repeats) for kernel in KERNELS}
                for order in ORDERS}
    finally:
        if busy is not None:
            busy.terminate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path,
                        default=Path(__file__).parent / "results" / "cpu_contention.json")
    args = parser.parse_args()
    print(f"forward + backward, causal fp32 (1, 8, {args.seqlen}, 64), median of "
          f"{args.repeats} (seconds); {os.cpu_count()} cores")
    results = {"alone": _measure_all(args.seqlen, args.repeats, False),
               "beside a busy process": _measure_all(args.seqlen, args.repeats, True)}
    print(f"{'':<24}{'import order':<18}{'flash_cann':>11}{'sdpa':>9}{'ratio':>8}")
    for condition, orders in results.items():
        for order, times in orders.items():
            times["ratio"] = times["flash_cann"] / times["sdpa"]
            print(f"{condition:<24}{order:<18}{times['flash_cann']:>11.2f}{times['sdpa']:>9.2f}"
                  f"{times['ratio']:>7.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "shape": [1, 8, args.seqlen, 64], "causal": True, "dtype": "float32",
        "repeats": args.repeats, "cores": os.cpu_count(), "machine": platform.machine(),
        "note": "shared machine: other processes load it too; compare ratios within a run",
        "seconds": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
