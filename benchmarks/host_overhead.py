"""Host time of one flash_cann call with the GPU idle, split by stage.

    python benchmarks/host_overhead.py [--calls N] [--out DIR]

A tiny problem (batch 1, 2 heads, seqlen 128, head_dim 64, bf16) so that the GPU work
never makes the host wait: each row times N calls of one layer of the call path (CPU
wall clock, perf_counter_ns, after a warm-up that compiles and tunes), from the public
function down to the bare Triton launch. A stage's cost is the difference between its
row and the next. Writes host_overhead.json under --out and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_attention as common  # noqa: E402  (run metadata; puts python/ on the path)

import flash_cann  # noqa: E402
from flash_cann import checks, ops  # noqa: E402
from flash_cann.backends import triton as triton_backend  # noqa: E402


def _per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter_ns() - start
    torch.cuda.synchronize()
    return elapsed / calls / 1e3


def stages(q, k, v):
    """(name, what it runs): each layer of a forward call, outermost first."""
    scale = 1 / math.sqrt(q.shape[-1])
    backend = ops.backend_for(q.device)
    return [
        ("flash_attn_func", lambda: flash_cann.flash_attn_func(q, k, v, causal=True)),
        ("torch.ops.flash_cann.fwd", lambda: torch.ops.flash_cann.fwd(
            q, k, v, None, scale, True, "BSND")),
        ("device kernel (checks + backend)", lambda: ops._fwd_kernel(
            q, k, v, None, scale, True, "BSND")),
        ("checks", lambda: checks.check_fwd(q, k, v, None, scale, True, "BSND", backend)),
        ("triton backend forward", lambda: triton_backend.forward(
            q, k, v, None, scale=scale, causal=True, layout="BSND")),
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return 1
    q, k, v = (torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    rows = [{"stage": name, "us_per_call": _per_call_us(fn, args.calls)}
            for name, fn in stages(q, k, v)]
    meta = common.run_metadata(1)
    meta["method"] = (f"perf_counter_ns over {args.calls} calls after 20 warm-up calls; "
                      f"bf16 (1, 128, 2, 64) BSND causal forward; GPU work never waited on")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "host_overhead.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"{meta['device']}; {meta['software']}; {meta['date']}")
    for row in rows:
        print(f"  {row['stage']:<34} {row['us_per_call']:8.1f} us/call")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
