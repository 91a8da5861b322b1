"""The shell process-group ledger: what a crashed daemon left running is reaped at start-up."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from metis.core.tools.groups import (
    MARKER_ENV,
    ProcessGroupLedger,
    kill_marked,
    marked_pids,
    new_marker,
)
from tests.processes import live_group_members


def spawn_group() -> subprocess.Popen[bytes]:
    """A command in its own session with a background member, as the shell tool runs it."""
    return subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)


def test_a_group_noted_and_never_left_is_killed_by_the_next_start(tmp_path: Path) -> None:
    proc = spawn_group()
    try:
        ProcessGroupLedger(tmp_path / "groups").enter(proc.pid)  # then the daemon "crashes"
        assert ProcessGroupLedger(tmp_path / "groups").reap() == 1
        proc.wait(timeout=5)
        for _ in range(100):  # the SIGKILL reaches the background member asynchronously
            if not live_group_members(proc.pid):
                break
            time.sleep(0.02)
        assert not live_group_members(proc.pid) and not list((tmp_path / "groups").iterdir())
    finally:
        proc.kill()


def test_a_group_left_normally_is_not_touched(tmp_path: Path) -> None:
    proc = spawn_group()
    try:
        ledger = ProcessGroupLedger(tmp_path / "groups")
        ledger.enter(proc.pid)
        ledger.leave(proc.pid)
        assert ledger.reap() == 0 and live_group_members(proc.pid)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_a_reused_pid_is_left_alone(tmp_path: Path) -> None:
    """A note whose start time differs from the live process's belongs to an earlier process."""
    proc = spawn_group()
    try:
        notes = tmp_path / "groups"
        notes.mkdir()
        (notes / str(proc.pid)).write_text("1")  # started at tick 1: not this process
        assert ProcessGroupLedger(notes).reap() == 0 and live_group_members(proc.pid)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_the_next_start_also_kills_what_left_a_noted_group(tmp_path: Path) -> None:
    """A process that `setsid` took out of the group still carries the run marker."""
    marker = new_marker()
    escaped = subprocess.Popen(
        ["sleep", "30"], start_new_session=True, env={**os.environ, MARKER_ENV: marker}
    )
    proc = spawn_group()
    try:
        ProcessGroupLedger(tmp_path / "groups").enter(proc.pid, marker)
        assert marked_pids(marker) == [escaped.pid]  # read at once, inside its exec or not
        assert ProcessGroupLedger(tmp_path / "groups").reap() == 1
        assert escaped.wait(timeout=5) == -9
        assert marked_pids(marker) == []
    finally:
        proc.kill()
        escaped.kill()
        proc.wait()


def test_a_marker_is_matched_whole(tmp_path: Path) -> None:
    marker = new_marker()
    other = subprocess.Popen(["sleep", "30"], env={**os.environ, MARKER_ENV: marker + "0"})
    try:
        assert marked_pids(marker) == [] and kill_marked(marker) == 0
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


class _Proc:
    """A stand-in for /proc: each process's environment reads, in turn, as the list gives
    (the last repeats): `{pid: [b"", b"A=1\\0"]}` is empty at the first read, set after."""

    def __init__(self, reads: dict[int, list[bytes]], name: str = "proc") -> None:
        self.reads, self.name = reads, name

    def iterdir(self) -> list[_Proc]:
        return [_Proc(self.reads, str(pid)) for pid in self.reads]

    def __truediv__(self, part: str) -> _Proc:
        return self if part == "environ" else _Proc(self.reads, part)

    def read_bytes(self) -> bytes:
        reads = self.reads[int(self.name)]
        return reads.pop(0) if len(reads) > 1 else reads[0]


def test_an_environment_read_empty_inside_an_exec_is_read_again() -> None:
    """Linux shows a process's environment only once its exec has laid it out: a read in
    between finds it empty. Such a process is looked at again, briefly; one started with no
    environment at all costs the scan a few milliseconds, not a miss or a hang."""
    marker = new_marker()
    marked = f"A=1\0{MARKER_ENV}={marker}\0".encode()
    proc = _Proc({100: [b"", b"", marked], 200: [b""], 300: [b"B=2\0"]})
    started = time.monotonic()
    assert marked_pids(marker, proc) == [100]  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0  # 200 stays empty: given up on, quickly
