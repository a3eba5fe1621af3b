"""The ``flash-cann`` command (also ``python -m flash_cann``)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flash-cann", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="forward + backward on the best available device, checked against "
                     "the float64 oracle, timed and measured against standard attention")
    demo.add_argument("--device", help="cpu, cuda or npu (default: the best available)")
    demo.add_argument("--seqlen", type=int, help="sequence length of the speed/memory part")
    demo.add_argument("--backend", help="a backend of the op spec, e.g. twin (the Ascend C kernel "
                                        "on the CPU twin); default: the device's")

    from . import plan_report
    plan = commands.add_parser(
        "plan", help="the Ascend tiling plan for a shape: blocks, per-core work, buffer use "
                     "per memory level, and a predicted time (a model, not a measurement)")
    plan_report.add_arguments(plan)

    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_module
        from .ops import SPEC
        if args.backend is not None and args.backend not in SPEC.backends:
            parser.error(f"--backend must be one of {', '.join(SPEC.backends)} "
                         f"(got {args.backend!r})")
        return demo_module.main(args.device, args.seqlen, args.backend)
    return plan_report.run(args)


if __name__ == "__main__":
    sys.exit(main())
