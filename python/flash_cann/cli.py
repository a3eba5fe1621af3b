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

    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_module
        return demo_module.main(args.device, args.seqlen)
    return 2


if __name__ == "__main__":
    sys.exit(main())
