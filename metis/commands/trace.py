"""`metis trace prune --days N`: drop each session's events older than N days.

Events are kept forever unless this is run. It works on `METIS_HOME/metis.db` directly, so it
needs no daemon, and it may also run while one serves the same store: SQLite (WAL) lets both
write, and the prune commits in short chunks (`metis.core.store.prune`). A WebSocket client
holding a cursor at or below a pruned stream's new floor gets `cursor_expired` and recovers
with a snapshot.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from metis.commands import usage
from metis.commands.daemon_client import add_home_argument
from metis.commands.event_loop import run_command
from metis.config import DB_FILE, home_from
from metis.core.canonical.times import format_datetime, now_us, us_to_datetime
from metis.core.errors import ConfigError
from metis.core.store.db import Database
from metis.core.store.prune import PrunedStream, count_prunable, prune_events
from metis.wire.counts import counted
from metis.wire.when import local_time

DAY_US = 86_400 * 1_000_000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "trace", help="trace store maintenance", description="Trace store maintenance."
    )
    parser.set_defaults(func=lambda _args: usage(parser))
    commands = parser.add_subparsers(dest="trace_command", metavar="{prune}")
    prune = commands.add_parser(
        "prune",
        help="delete session events older than N days",
        description="Delete, per session, the events older than N days from "
        "$METIS_HOME/metis.db and record the highest deleted seq as the session's retention "
        "floor (a WebSocket cursor at or below it is expired). The system stream, messages, "
        "turns and tool calls are never pruned, and each session keeps its newest event. "
        "Safe to run while the daemon is serving. From a terminal it shows the count and asks "
        "before deleting (--yes skips the question); --dry-run only counts.",
    )
    prune.add_argument(
        "--days",
        type=_days,
        required=True,
        metavar="N",
        help="age in whole days (0 or more); 0 prunes everything but each session's last event",
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="count what would be deleted and delete nothing",
    )
    prune.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="delete without asking (the question is asked only when stdin is a terminal)",
    )
    add_home_argument(prune)
    prune.set_defaults(func=prune_command)


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of days, got {text!r}") from None
    if days < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more days, got {days}")
    return days


def prune_command(args: argparse.Namespace) -> int:
    # the store alone, not config.yaml, and nothing created: a mistyped home stays absent
    path = home_from(args.home) / DB_FILE
    if not path.is_file():
        print(
            f"metis trace prune: no trace store at {path} (is METIS_HOME right?)", file=sys.stderr
        )
        return 1
    # no event predates 1970 (and a date before year 1 has no name): a cutoff further back
    # than that deletes what it does, nothing
    cutoff_us = max(now_us() - args.days * DAY_US, 0)
    before = "before " + local_time(format_datetime(us_to_datetime(cutoff_us)), zone=True)
    asking = not (args.dry_run or args.yes) and sys.stdin.isatty()
    try:
        pruned = run_command(_prune(path, cutoff_us, dry_run=args.dry_run or asking))
        if asking and pruned:
            # asked with no event loop running: Ctrl-C at the question leaves at once
            try:
                agreed = _confirm(pruned, args.days, before)
            except KeyboardInterrupt:
                print("\nnothing deleted")
                return 130
            if not agreed:
                print("nothing deleted")
                return 1
            pruned = run_command(_prune(path, cutoff_us))
    except ConfigError as exc:  # a store newer than this metis
        print(f"metis trace prune: {exc.message}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"metis trace prune: cannot prune {path}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a read-only home, files of another user
        print(f"metis trace prune: cannot prune {path}: {exc.strerror}", file=sys.stderr)
        return 1
    if not pruned:
        older = f"older than {counted(args.days, 'day')} ({before})"
        print(f"nothing to prune: no session has events {older}")
        return 0
    done = "would prune" if args.dry_run else "pruned"
    print(f"{done} {_describe(pruned, args.days, before)}")
    if args.dry_run:
        print("dry run: nothing was deleted")
    return 0


def _describe(streams: list[PrunedStream], days: int, before: str) -> str:
    total = sum(stream.deleted for stream in streams)
    return (
        f"{counted(total, 'event')} older than {counted(days, 'day')} ({before}) "
        f"from {counted(len(streams), 'session')}"
    )


def _confirm(would: list[PrunedStream], days: int, before: str) -> bool:
    print(f"delete {_describe(would, days, before)}? [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


async def _prune(path: Path, cutoff_us: int, *, dry_run: bool = False) -> list[PrunedStream]:
    """The streams pruned (with `dry_run`, those that would be)."""
    db = Database(path)
    await db.open()
    try:
        if dry_run:
            return await count_prunable(db, cutoff_us)
        return await prune_events(db, cutoff_us)
    finally:
        await db.close()
