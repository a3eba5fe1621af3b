"""The CPU backend beside a busy process: forward + backward of flash_cann (causal,
float32, batch 1, 8 heads, head_dim 64) timed alone and next to a process that keeps
one core busy, with OpenMP's default (spinning) wait policy and with the passive one
flash_cann sets when it is imported before torch.

    python benchmarks/cpu_contention.py [--seqlen 2048] [--repeats 3]

Each configuration runs in a fresh process (the wait policy is read when torch loads)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys

MEASURE = """
import os, sys, time
policy = sys.argv[2]
if policy == "active":
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"  # before flash_cann's default applies
import flash_cann, torch
n, repeats = int(sys.argv[1]), int(sys.argv[3])
q, k, v = (torch.randn(1, 8, n, 64, requires_grad=True) for _ in range(3))
run = lambda: flash_cann.attention(q, k, v, causal=True).sum().backward()
run()
times = []
for _ in range(repeats):
    start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2])
"""


def _busy() -> None:
    while True:
        pass


def measure(seqlen: int, policy: str, repeats: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    result = subprocess.run([sys.executable, "-c", MEASURE, str(seqlen), policy, str(repeats)],
                            capture_output=True, text=True, env=env, check=True)
    return float(result.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"forward + backward, seqlen {args.seqlen}, median of {args.repeats} (seconds)")
    print(f"{'':<16}{'alone':>10}{'beside a busy process':>26}")
    for policy in ("active", "passive"):
        alone = measure(args.seqlen, policy, args.repeats)
        busy = multiprocessing.Process(target=_busy, daemon=True)
        busy.start()
        try:
            contended = measure(args.seqlen, policy, args.repeats)
        finally:
            busy.terminate()
        print(f"{policy + ' wait':<16}{alone:>10.2f}{contended:>26.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
