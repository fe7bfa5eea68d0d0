"""The ``torchcomms`` command line: one module per subcommand, registered in ``SUBCOMMANDS``.

A subcommand module provides ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

#: Subcommands by module name in this package; the module name is the command name.
SUBCOMMANDS: tuple[str, ...] = (
    "bench",
    "backends",
    "plugins",
    "transports",
    "tuners",
    "tune",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``torchcomms`` parser with every registered subcommand."""
    from torchcomms_core import __version__

    parser = argparse.ArgumentParser(
        prog="torchcomms", description="PyTorch communicators over pluggable backends."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    commands.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f".{name}", __name__)
        sub = commands.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(sub)
        # run() reports errors through its own parser, so they name the subcommand.
        sub.set_defaults(run=module.run, parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchcomms`` command with ``argv`` (default: ``sys.argv[1:]``)."""
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


__all__ = ["SUBCOMMANDS", "build_parser", "main"]
