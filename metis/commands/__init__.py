"""The `metis` subcommands other than `serve`, one module each."""

from __future__ import annotations

import argparse


def usage(parser: argparse.ArgumentParser) -> int:
    """A command group run without its subcommand: show its help and exit as a usage error."""
    parser.print_help()
    return 2
