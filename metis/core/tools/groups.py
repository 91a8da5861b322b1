"""Shell process groups that must not outlive a crashed daemon (tools.md §9).

A shell command runs in its own session, so a SIGKILLed daemon takes none of it down: `sleep
3600 &` would run on after the restart, and recovery repairs rows only. Each running group is
therefore noted as a file (`<pgid>`, holding the leader's start time) in a directory under
METIS_HOME while it runs; start-up recovery kills every group still noted there.

The start time guards against a reused pid: a leader that is alive with another start time is
someone else's process and is left alone. (A group whose leader has exited keeps its pgid out
of circulation while any member lives, so killing it by number is safe.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), None if unknown or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


class ProcessGroupLedger:
    """The running shell groups of this daemon, on disk so the next start can reap them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def enter(self, pgid: int) -> None:
        """Note a group just started (its leader is `pgid`). Best effort: a failure to write
        the note only loses the crash guard, never the command."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.directory / str(pgid)).write_text(_start_time(pgid) or "")
        except OSError as exc:
            log.warning("could not note shell process group %d: %s", pgid, exc)

    def leave(self, pgid: int) -> None:
        """The group has been stopped and reaped."""
        with contextlib.suppress(OSError):
            (self.directory / str(pgid)).unlink()

    def reap(self) -> int:
        """Start-up: SIGKILL every group a previous daemon left running; returns how many."""
        if not self.directory.is_dir():
            return 0
        killed = 0
        for note in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if note.name.isdigit():
                    killed += self._reap_one(int(note.name), note.read_text().strip())
                note.unlink()
        if killed:
            log.warning("killed %d shell process group(s) left by a previous daemon", killed)
        return killed

    @staticmethod
    def _reap_one(pgid: int, noted_start: str) -> int:
        current = _start_time(pgid)
        if current is not None and noted_start and current != noted_start:
            return 0  # the pid now belongs to an unrelated process
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return 0
        return 1
