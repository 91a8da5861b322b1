"""The `metis` subcommands other than `serve`, one module each."""

from __future__ import annotations

import argparse


def usage(parser: argparse.ArgumentParser) -> int:
    """A command group run without its subcommand: show its help and exit as a usage error."""
    parser.print_help()
    return 2


def seconds_argument(text: str) -> float:
    """A command's wait in seconds (`stop --timeout`, `mcp restart --wait`): above 0, at most
    an hour; `nan` and `inf` are refused, as a wait that never ends."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("give a number of seconds above 0, at most 3600")
    return value
