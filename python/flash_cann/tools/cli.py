"""The flash-cann command (also python -m flash_cann): run the demo, or print the Ascend
tiling plan for a shape."""

from __future__ import annotations

import argparse
import sys


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def main(argv: list[str] | None = None) -> int:
    from ..contract.ops import SPEC

    parser = argparse.ArgumentParser(prog="flash-cann", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="forward + backward on the best available device, checked against "
                     "the float64 oracle, timed and measured against torch SDPA and naive attention")
    device_types = sorted({b.device_type for b in SPEC.backends.values()})
    demo.add_argument("--device", choices=device_types,
                      help="the device type to run on (default: the best available)")
    demo.add_argument("--seqlen", type=positive_int,
                      help="sequence length of the speed/memory part (default: 4096 on the "
                           "CPU, 16384 on an accelerator)")
    demo.add_argument("--backend", choices=list(SPEC.backends),
                      help="a backend of the op spec, e.g. twin (the Ascend C kernel on the "
                           "CPU twin); default: the device's")

    from ..ascend import plan_report
    plan = commands.add_parser(
        "plan", help="the Ascend tiling plan for a shape: blocks, per-core work, buffer use "
                     "per memory level, and a predicted time (a model, not a measurement)")
    plan_report.add_arguments(plan)

    args = parser.parse_args(argv)
    from . import demo as demo_module
    from ..ascend.native import NativeBuildError
    try:
        if args.command == "demo":
            return demo_module.main(args.device, args.seqlen, args.backend)
        return plan_report.run(args)
    except (demo_module.CannotRun, NativeBuildError) as error:
        # What is missing, in one line (a failed build also shows the compiler's output).
        print(f"flash-cann {args.command}: {str(error).removeprefix('flash_cann: ')}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
