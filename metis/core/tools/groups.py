"""What a shell command starts must not outlive it, nor a crashed daemon.

Killing the command's process group misses a process that left the group (`setsid`, a
daemonising double fork, `tmux new -d`). Every command's environment therefore carries a
random run marker (`METIS_SHELL_RUN`), which such processes inherit: once the group is stopped,
the processes still carrying the marker are found in `/proc` and killed too. A process that
also drops its environment is beyond reach; this is containment, not a sandbox.

A shell command runs in its own session, so a SIGKILLed daemon takes none of it down: `sleep
3600 &` would run on after the restart, and recovery repairs rows only. Each running group is
therefore noted as a file (`<pgid>`, holding the leader's start time and the run marker) in a
directory under METIS_HOME while it runs; start-up recovery kills every group still noted there
and every process carrying a noted marker.

The start time guards against a reused pid: a leader that is alive with another start time is
someone else's process and is left alone. (A group whose leader has exited keeps its pgid out
of circulation while any member lives, so killing it by number is safe.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

MARKER_ENV = "METIS_SHELL_RUN"
_PROC = Path("/proc")
_EMPTY_READS = 5
"""How many times an empty environment is read again (a process started with none stays so)."""
_EMPTY_READ_PAUSE_S = 0.002


def new_marker() -> str:
    """A fresh random run marker for `METIS_SHELL_RUN`; unguessable, so no unrelated process carries
    it."""
    return secrets.token_hex(16)


def marked_pids(marker: str, proc: Path = _PROC) -> list[int]:
    """The processes whose environment holds `METIS_SHELL_RUN=<marker>` (Linux; [] elsewhere).

    Processes of other users, and non-dumpable ones, cannot be read and are skipped: a command
    cannot make another user's process look like its own. A process caught inside its `exec`
    shows an empty environment until the new program's is laid out (a moment, longer on a busy
    machine: 3 reads in 400 right after the fork, measured under load), so one read empty is
    read again, briefly, rather than taken for unmarked."""
    entry = f"{MARKER_ENV}={marker}".encode()
    try:
        pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    found: list[int] = []
    for attempt in range(_EMPTY_READS + 1):
        if attempt:
            time.sleep(_EMPTY_READ_PAUSE_S)
        empty = []
        for pid in pids:
            try:
                environ = (proc / str(pid) / "environ").read_bytes()
            except OSError:
                continue
            if not environ:
                empty.append(pid)
            elif environ.startswith(entry + b"\0") or b"\0" + entry + b"\0" in environ:
                found.append(pid)
        pids = empty
        if not pids:
            break
    return found


def group_members(pgid: int, proc: Path = _PROC) -> list[int]:
    """The live processes of process group `pgid` (Linux; [] elsewhere)."""
    members = []
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_marked(marker: str, rounds: int = 3) -> int:
    """SIGKILL every process carrying `marker`, again while new ones appear (one may fork
    between the scan and its kill); returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        pids = [pid for pid in marked_pids(marker) if pid != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), None if unknown or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def live_groups(pgids: set[int], proc: Path = _PROC) -> set[int]:
    """Which of these process groups still have a member that is not a zombie (Linux)."""
    alive: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in pgids:
            alive.add(int(fields[2]))
    return alive


def wait_until_gone(pgids: set[int], timeout_s: float = 2.0) -> set[int]:
    """Wait (blocking, bounded) until SIGKILLed groups have died; returns those still alive.
    A SIGKILL takes effect only when its process next runs, so on a busy machine a killed
    group can linger for a moment after `killpg` returns."""
    deadline = time.monotonic() + timeout_s
    alive = live_groups(pgids) if pgids else set()
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = live_groups(alive)
    return alive


class ProcessGroupLedger:
    """The running shell groups of this daemon, on disk so the next start can reap them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def enter(self, pgid: int, marker: str = "") -> None:
        """Note a group just started (its leader is `pgid`, its processes carry `marker`). Best
        effort: a failure to write the note only loses the crash guard, never the command."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.directory / str(pgid)).write_text(f"{_start_time(pgid) or ''}\n{marker}")
        except OSError as exc:
            log.warning("could not note shell process group %d: %s", pgid, exc)

    def leave(self, pgid: int) -> None:
        """The group has been stopped and reaped."""
        with contextlib.suppress(OSError):
            (self.directory / str(pgid)).unlink()

    def reap(self) -> int:
        """Start-up: SIGKILL every group a previous daemon left running, and the processes
        that left those groups; returns how many groups."""
        if not self.directory.is_dir():
            return 0
        killed: set[int] = set()
        for note in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if note.name.isdigit():
                    start, _, marker = note.read_text().partition("\n")
                    if self._reap_one(int(note.name), start.strip()):
                        killed.add(int(note.name))
                    if marker.strip():
                        kill_marked(marker.strip())
                note.unlink()
        if killed:
            log.warning("killed %d shell process group(s) left by a previous daemon", len(killed))
            # Serving starts only once they are gone: nothing of the old run overlaps the new.
            lingering = wait_until_gone(killed)
            if lingering:
                log.warning("process group(s) %s still alive after SIGKILL", sorted(lingering))
        return len(killed)

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
