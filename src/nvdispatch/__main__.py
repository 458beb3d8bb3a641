"""``python -m nvdispatch``: the command line.

With no command it runs the demo (``nvdispatch._demo``): what this machine offers, and one fused linear layer
on every framework found. Each further command is a subparser whose ``run`` default is the function that
carries it out; add one in ``_parser``.
"""

from __future__ import annotations

import argparse
import sys

import nvdispatch

from . import _calibrate_command, _demo


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nvdispatch",
        description="Without a command: the demo. " + _demo.DESCRIPTION,
    )
    parser.add_argument("--version", action="version", version=f"nvdispatch {nvdispatch.__version__}")
    _demo.add_arguments(parser)
    parser.set_defaults(run=_demo.run)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    demo = commands.add_parser("demo", help="the demo (the default)", description=_demo.DESCRIPTION)
    _demo.add_arguments(demo)
    demo.set_defaults(run=_demo.run)
    calibrate = commands.add_parser(
        "calibrate", help=_calibrate_command.HELP, description=_calibrate_command.DESCRIPTION
    )
    _calibrate_command.add_arguments(calibrate)
    calibrate.set_defaults(run=_calibrate_command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; ``argv`` as on the command line (``None``: ``sys.argv[1:]``). Returns the exit
    status."""
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
