"""The `metis` subcommands other than `serve`, one module each."""

from __future__ import annotations

import argparse
from datetime import datetime

from metis.wire.when import local_time


def usage(parser: argparse.ArgumentParser) -> int:
    """A command group run without its subcommand: show its help and exit as a usage error."""
    parser.print_help()
    return 2


def zoned_time(iso: str | None, *, seconds: bool = False) -> str:
    """A daemon's UTC timestamp as a person here reads it, saying which clock it is on: in the
    local zone with the zone's name (`2026-11-28 15:43:07 CET`). A value that is not a
    timestamp is shown as it came, as by `local_time`."""
    shown = local_time(iso, seconds=seconds)
    try:
        moment = datetime.fromisoformat(iso or "")
    except ValueError:
        return shown
    if moment.tzinfo is None:
        return shown
    return f"{shown} {moment.astimezone().strftime('%Z')}"


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
