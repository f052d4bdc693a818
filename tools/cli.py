"""The ``polydev`` command: its subcommands, logging, and how it ends.

A user's mistake is one line on stderr and exit status 1, never a traceback; Ctrl-C stops
with status 130 and a closed pipe (``polydev devices --json | head -1``) ends quietly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import polydev
from polydev.errors import PolydevError

from . import bench, compare, devices, info, run, serve

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
EXIT_INTERRUPTED = 130          # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_BROKEN_PIPE = 141          # 128 + SIGPIPE, what `yes | head -1` reports for yes


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)} "
                                         f"(any case)")
    return level


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes too, before or after its name (``--log-level``)."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not overwrite a value given before it
    common.add_argument("--log-level", type=_log_level, default=argparse.SUPPRESS,
                        metavar="LEVEL",
                        help="logging verbosity: DEBUG, INFO, WARNING (default) or ERROR; "
                             "any case")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``polydev`` and its subcommands."""
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="polydev", parents=[common],
        description="polydev: one compute graph across CPU, CUDA and OpenCL devices.")
    parser.add_argument("--version", action="version", version=f"polydev {polydev.__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    devices.add_parser(sub, [common])
    compare.add_parser(sub, [common])
    info.add_parser(sub, [common])
    run.add_parser(sub, [common])
    serve.add_parser(sub, [common])
    bench.add_parser(sub, [common])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        status = args.run(args)
        sys.stdout.flush()            # a closed pipe shows here, not at interpreter exit
        return status
    except PolydevError as e:         # user mistakes get a message, not a stack trace
        print(f"polydev: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("polydev: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so Python's final flush into the closed pipe cannot fail
    (the recipe of Python's signal module documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
