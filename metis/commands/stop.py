"""`metis stop`: stop the daemon running on a METIS_HOME, as Ctrl-C stops one in the foreground.

The daemon is the process holding the home's lock (`metis.server.lock`): that it holds it is
asked of the kernel, and only then does the pid the lock file names receive SIGTERM, so a pid
left by a daemon killed long ago, since reused by another process, is never signalled. The
daemon then shuts down as on Ctrl-C (running turns end cancelled for the shutdown, the trace is
flushed, MCP servers and shell commands are stopped, within `limits.shutdown_grace_s`); the
command waits until the lock is free, which the kernel makes it once the process is gone. Exit status: 0 stopped, 3 nothing was running (as
`metis status`), 1 it could not be stopped (another user's process, or still stopping when the
wait ran out).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from metis.commands import seconds_argument
from metis.commands.printable import printable
from metis.config import home_from, load_file_settings
from metis.core.errors import ConfigError
from metis.server.lock import LOCK_FILE, is_held, read_holder

NOT_RUNNING = 3
STOP_TIMEOUT_S = 60.0  # twice the default shutdown grace
LEAST_WAIT_S = 1.0


def _wait_for(home: Path) -> float:
    """How long to wait by default: twice the shutdown grace config.yaml gives the daemon
    (within it, running turns are cancelled and tools stopped; past it, the daemon closes its
    store and exits), so that a daemon given a longer grace is not called stuck (and
    `kill -9` proposed) while it is still within it; 60 s when the file does not say."""
    try:
        grace = load_file_settings(home / "config.yaml").limits.shutdown_grace_s
    except (ConfigError, OSError):
        return STOP_TIMEOUT_S
    return max(2 * grace, LEAST_WAIT_S)


def stop_command(args: argparse.Namespace) -> int:
    home = home_from(args.home)
    lock = home / LOCK_FILE
    if not is_held(lock):
        print(f"metis: no daemon is running on {printable(home)}", file=sys.stderr)
        return NOT_RUNNING
    pid, url = read_holder(lock)
    timeout = args.timeout if args.timeout is not None else _wait_for(home)
    if pid is None:
        print(
            f"metis: the daemon on {printable(home)} does not name its pid in {printable(lock)}",
            file=sys.stderr,
        )
        return 1
    try:  # the kill inside: a Ctrl-C just after it is sent gets the sentence too
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # it ended meanwhile: the wait below sees the lock free
        except PermissionError:
            print(
                f"metis: the daemon on {printable(home)} (pid {pid}) belongs to another user; "
                "stop it as that user",
                file=sys.stderr,
            )
            return 1
        if not _gone_within(lock, timeout):
            print(
                f"metis: the daemon (pid {pid}) is still stopping after {timeout:g} s; "
                f"`kill -9 {pid}` ends it at once (its running turns are then marked "
                "interrupted at the next start)",
                file=sys.stderr,
            )
            return 1
    except KeyboardInterrupt:
        print(
            f"\nmetis: stopped waiting; the daemon (pid {pid}) was asked to stop and goes on "
            "stopping (`metis status` says when it is gone)",
            file=sys.stderr,
        )
        return 130
    where = f" at {url}" if url else ""
    print(f"metis stopped the daemon{where} (pid {pid})")
    return 0


def _gone_within(lock: Path, seconds: float) -> bool:
    """Whether the lock is free, its holder gone, within `seconds`."""
    deadline = time.monotonic() + seconds
    while is_held(lock):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "stop",
        help="stop the daemon running on METIS_HOME",
        description="Stop the daemon running on METIS_HOME (SIGTERM, as Ctrl-C in the "
        "foreground) and wait until it has. Exit 0 stopped, 3 none was running, 1 it could "
        "not be stopped.",
    )
    parser.add_argument("--home", metavar="DIR", help="METIS_HOME of the daemon (overrides env)")
    parser.add_argument(
        "--timeout",
        type=seconds_argument,
        default=None,
        metavar="SECONDS",
        help="how long to wait for it to stop (default: twice config.yaml's "
        f"limits.shutdown_grace_s, {STOP_TIMEOUT_S:g} unless set)",
    )
    parser.set_defaults(func=stop_command)
