"""The flash-cann command (also python -m flash_cann): run the demo, print the Ascend
tiling plan for a shape, or check an Ascend server (doctor).

Every subcommand reports a request it cannot carry out (a bad argument, a device or
backend this machine lacks, a shape the planner refuses) the same way: one line
``flash-cann: error: ...`` on stderr and exit status 2. Exit status 1 means it ran and
failed (the demo's accuracy check, a native build that ran and failed). Output cut short by its
reader (``flash-cann plan ... | head``) ends quietly with status 141, as for SIGPIPE."""

from __future__ import annotations

import argparse
import os
import sys

USAGE_ERROR = 2
BROKEN_PIPE = 128 + 13  # the shell's status for a process ended by SIGPIPE


def error_line(message: str) -> str:
    return f"flash-cann: error: {message.removeprefix('flash_cann: ')}"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the one style of the command (subparsers included)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, error_line(message) + "\n")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def _parser():
    from ..contract.ops import SPEC
    from ..ascend import plan_report

    parser = _Parser(prog="flash-cann", description=__doc__.split("\n\n")[0])
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
    plan = commands.add_parser(
        "plan", help="the Ascend tiling plan for a shape: blocks, per-core work, buffer use "
                     "per memory level, and a predicted time (a model, not a measurement)")
    plan_report.add_arguments(plan)
    doctor = commands.add_parser(
        "doctor", help="check what the NPU path needs (CANN, driver, torch / torch_npu / "
                       "torchair, the op package, the NPU extension, the SoC and its plan), "
                       "then a short smoke on the NPU against the CPU backend; exits 1 if "
                       "anything failed")
    doctor.add_argument("--json", action="store_true", help="the same report as JSON")
    return parser


def _run(args) -> int:
    from . import demo
    from ..ascend import plan_report
    from ..ascend import native
    from ..ascend.native import NativeBuildError

    try:
        if args.command == "demo":
            return demo.main(args.device, args.seqlen, args.backend)
        if args.command == "doctor":
            from . import doctor
            return doctor.main(as_json=args.json)
        status = plan_report.run(args)
        if status == 0 and args.traced:
            from . import plan_traced
            plan_traced.print_traced(args)
        return status
    except (demo.CannotRun, plan_report.Refused) as refusal:
        print(error_line(str(refusal)), file=sys.stderr)
        return USAGE_ERROR
    except NativeBuildError as failure:  # one line (+ the compiler's output if it failed)
        print(error_line(str(failure)), file=sys.stderr)
        # Nothing to build with here (no sources, no cmake) is a request this machine
        # cannot carry out; a build that ran and failed is a failure.
        return USAGE_ERROR if native.unavailable_reason() else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        status = _run(args)
        sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
    except BrokenPipeError:
        # The reader stopped reading: nothing more to say. Point stdout at /dev/null so the
        # interpreter's final flush does not report the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    return status


if __name__ == "__main__":
    sys.exit(main())
