"""``flash-cann plan ... --traced``: the plan's call timed on the CPU twin's timing mode
(flash_cann.backends.twin.traced), printed beside the schedule model's prediction."""

from __future__ import annotations

import json

from ..ascend import plan_report
from ..backends.twin import traced


def _problem(args) -> traced.Problem:
    call = plan_report.problem(args)
    kernel = ("decode" if args.decode else
              "backward-deterministic" if args.backward and args.deterministic else
              "backward" if args.backward else "forward")
    given = plan_report.layout(args)
    if (given == "BSND" and not args.decode) or args.page_size or (given == "TND" and args.tokens):
        raise plan_report.Refused("--traced times BNSD, or TND of equal-length sequences "
                                  "(no --tokens), and a contiguous decode cache")
    return traced.Problem(kernel, call["batch"], call["heads"], call["seqlen_q"], call["seqlen_k"],
                          call["head_dim"], dtype=call["dtype"], causal=args.causal,
                          heads_kv=args.kv_heads or 0, mask=args.mask, window=call["window"],
                          softcap=args.softcap, alibi=args.alibi is not None, dropout_p=args.dropout,
                          sinks=args.sinks, tnd=given == "TND")


def print_traced(args) -> None:
    if args.alibi == "batch_head":
        raise plan_report.Refused("--traced times ALiBi slopes per head (--alibi head)")
    row = traced.trace(_problem(args), args.soc, args.cores or 0,
                       trace_core=0 if args.trace_out else -1)
    report, ran = row["report"], row["traced_as"]
    print(f"\nTRACED (the CPU twin's timing mode: the kernel's own instruction stream, timing "
          f"only, {row['label']} from twin/timing/costs.json; not a measurement)")
    model = row["model_ms"]
    versus = (f" vs {model:.3f} ms modelled (model {100 * (model / row['traced_ms'] - 1):+.1f} %)"
              if model is not None else " (the model makes no prediction here)")
    print(f"  time       {row['traced_ms']:.3f} ms traced{versus}")
    print(f"  binding    {row['binding_pipe']}: busy {100 * report['binding_busy']:.0f}% of the "
          f"slowest core's {report['makespan_cycles'] / (report['clock_ghz'] * 1e6):.3f} ms")
    per_ms = report["clock_ghz"] * 1e6
    for unit in (u for u in report["units"] if u["core"] == report["slowest_core"]):
        busy = ", ".join(f"{pipe} {cycles / per_ms:.3f} ms" for pipe, cycles in unit["busy_cycles"].items()
                         if cycles > 0)
        print(f"    core {unit['core']} {unit['unit']:<4} busy {busy}")
    shares = sorted(report["critical_path_shares"].items(), key=lambda kv: -kv[1])
    print("  critical   " + ", ".join(f"{name} {100 * share:.0f}%" for name, share in shares))
    print(f"  ran as     shape {ran['shape']} on {ran['cores']} AI cores, the L2 shared as by "
          f"{ran['l2_share_cores']} (traced.py: a blockDim-scaled stand-in)")
    if args.trace_out:
        with open(args.trace_out, "w") as out:
            json.dump(row["trace"], out)
        print(f"  trace      AI core 0 of the run written to {args.trace_out} (chrome://tracing, Perfetto)")
