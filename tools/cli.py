"""The ``polydev`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from polydev.errors import PolydevError

from . import compare, devices


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polydev",
        description="polydev: one compute graph across CPU, CUDA and OpenCL devices.")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging verbosity (default: WARNING)")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    devices.add_parser(sub)
    compare.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except PolydevError as e:        # user mistakes get a message, not a stack trace
        print(f"polydev: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
