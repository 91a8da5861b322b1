"""The `metis` subcommands other than `serve`, one module each."""

from __future__ import annotations

import argparse
import signal


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


def hangup_unless_ignored() -> tuple[signal.Signals, ...]:
    """SIGHUP, for a process to end cleanly when its terminal closes (its default, an instant
    exit, leaves a daemon's running turns for the next start to find interrupted and an
    unsandboxed shell command running on its own, a run's turn running with no one to answer
    it); none when it was started ignoring SIGHUP, as `nohup` starts a command, to go on after
    the terminal closes."""
    return () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
