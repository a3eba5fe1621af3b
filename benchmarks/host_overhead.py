"""Host time of one flash_cann call with the GPU idle, split by stage.

    python benchmarks/host_overhead.py [--device cuda|cpu] [--calls N] [--out DIR]

A tiny problem (batch 1, 2 heads, seqlen 128, head_dim 64, bf16) so that the GPU work
never makes the host wait: each row times N calls of one layer of the call path (CPU
wall clock, perf_counter_ns, after a warm-up that compiles and plans), from the public
function down to the recorded launch, for the forward and the backward; the unplanned
rows are what a call cost before plans (checks, Triton's launcher with its autotune
lookup). Writes host_overhead.json under --out and prints the table.

``--device cpu`` times the layers every backend shares (the public function, the op and
its autograd, the plans, the checks) on the cpu backend, without the Triton rows: the
mode CI runs (tests/test_host_benchmark.py), so a broken benchmark fails a test.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_attention as common  # noqa: E402  (run metadata; puts python/ on the path)

import flash_cann  # noqa: E402
from flash_cann.contract import checks, ops  # noqa: E402


def stages(q, k, v):
    """(name, what it runs): each layer of a forward and of a backward call, outermost
    first; a stage's own cost is its row less the next one's. The Triton rows (its plan,
    recorded launch and unplanned launcher) on CUDA tensors only."""
    scale = 1 / math.sqrt(q.shape[-1])
    backend = ops.backend_for(q.device)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = torch.ops.flash_cann.fwd(q, k, v, None, scale, True, "BSND")
    grad = torch.randn_like(out)
    bwd_args = (grad, q, k, v, out, lse, None, None)
    fwd_plan = ops._fwd_plans[(*map(ops._tensor_signature, (q, k, v, None)), scale, True,
                               "BSND")]
    forward = [
        ("fwd: flash_attn_func, no grad (eager shortcut)",
         lambda: flash_cann.flash_attn_func(q, k, v, causal=True)),
        ("fwd: flash_attn_func, inputs require grad",
         lambda: flash_cann.flash_attn_func(qg, kg, vg, causal=True)),
        ("fwd: torch.ops.flash_cann.fwd, inputs require grad (op + autograd)",
         lambda: torch.ops.flash_cann.fwd(qg, kg, vg, None, scale, True, "BSND")),
        ("fwd: torch.ops.flash_cann.fwd, no grad (op)",
         lambda: torch.ops.flash_cann.fwd(q, k, v, None, scale, True, "BSND")),
        ("fwd: ops.plain_forward (planned)",
         lambda: ops.plain_forward(q, k, v, None, scale, True, "BSND")),
    ]
    checked = [("fwd: checks (unplanned)",
                lambda: checks.check_fwd(q, k, v, None, scale, True, "BSND", backend))]
    backward = [
        ("fwd+bwd: flash_attn_func + backward",
         lambda: flash_cann.flash_attn_func(qg, kg, vg, causal=True).backward(grad)),
        ("bwd: torch.ops.flash_cann.bwd (op)",
         lambda: torch.ops.flash_cann.bwd(*bwd_args, scale, True, "BSND")),
        ("bwd: ops.plain_backward (planned)",
         lambda: ops.plain_backward(*bwd_args, scale, True, "BSND", False)),
    ]
    if q.device.type != "cuda":
        return forward + checked + backward
    from flash_cann.backends.triton import cuda as triton_backend

    attrs = dict(scale=scale, causal=True, layout="BSND")
    # The triton plan's recorded launch: out and lse are the outputs of the call above.
    return forward + [
        ("fwd: triton plan (allocate, replay)", lambda: fwd_plan(q, k, v, None)),
        ("fwd: recorded launch alone", lambda: fwd_plan.replay(q, k, v, None, out, lse)),
    ] + checked + [
        ("fwd: triton backend, unplanned (Triton's launcher, autotune lookup)",
         lambda: triton_backend.forward(q, k, v, None, **attrs)),
    ] + backward + [
        ("bwd: triton backend, unplanned",
         lambda: triton_backend.backward(*bwd_args, **attrs)),
    ]


def _cpu_metadata() -> dict:
    """Date, device and software of a run on the CPU."""
    cpu = platform.processor() or platform.machine()
    return {"date": date.today().isoformat(), "device": f"cpu ({cpu})",
            "software": f"torch {torch.__version__}, Python {platform.python_version()}",
            "flash_cann": flash_cann.__version__}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=common.HOST_CALLS,
                   help="calls per timing (the median of several timings is kept)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the shared layers on the cpu backend, no Triton rows")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure (--device cpu times the shared layers)")
        return 1
    q, k, v = (torch.randn(1, 128, 2, 64, device=args.device, dtype=torch.bfloat16)
               for _ in range(3))
    rows = [{"stage": name, "us_per_call": common.per_call_us(fn, args.calls)}
            for name, fn in stages(q, k, v)]
    meta = common.run_metadata(1) if args.device == "cuda" else _cpu_metadata()
    meta["method"] = (f"median of {common.HOST_REPEATS} perf_counter_ns timings of "
                      f"{args.calls} calls after 50 warm-up calls; bf16 (1, 128, 2, 64) BSND "
                      f"causal on {args.device}" + ("; GPU work never waited on"
                                                     if args.device == "cuda" else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "host_overhead.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"{meta['device']}; {meta['software']}; {meta['date']}")
    for row in rows:
        print(f"  {row['stage']:<70} {row['us_per_call']:8.1f} us/call")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
